"""Resident memory of an API process and of a prefork worker's children (run by hand).

    .venv/bin/python tests/bench/memory.py [--batches 3] [--creates 500] [--gets 3000]

Starts a test stack (scratch database ``mcp_perf_mem``, Redis db 7, the bench fixture tools),
measures RSS and USS (private pages: what a forked child really costs) of the API, the worker's
main process and each pool child when idle, then after each batch of ``--creates`` noop tasks
(run to completion) and ``--gets`` tasks/get calls. RSS that keeps climbing from batch to batch
is retained per-request state; a one-time step after the first batch is warm-up (imports on
first use, pools filling).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_mem"
MIB = 1024 * 1024


def sample(stack: support.Stack) -> dict[str, tuple[float, float]]:
    """name -> (RSS MiB, USS MiB)."""
    out: dict[str, tuple[float, float]] = {}
    api = psutil.Process(stack.api.popen.pid)
    worker = psutil.Process(stack.worker.popen.pid)
    procs = [("api", api), ("worker main", worker)]
    procs += [(f"worker child {n}", child) for n, child in enumerate(worker.children(), 1)]
    for name, proc in procs:
        info = proc.memory_full_info()
        out[name] = (info.rss / MIB, info.uss / MIB)
    return out


def load(stack: support.Stack, creates: int, gets: int) -> None:
    def create(_: int) -> str:
        client = stack.client()
        try:
            return client.start("noop")
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(create, range(creates)))
    client = stack.client()
    try:
        for n in range(gets):
            client.get(ids[n % len(ids)])
        for task_id in ids[-20:]:
            client.wait_status(task_id, timeout=120)
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--creates", type=int, default=500)
    parser.add_argument("--gets", type=int, default=3000)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    args = parser.parse_args()
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    rows: list[tuple[str, dict[str, tuple[float, float]]]] = []
    try:
        with support.running_stack(
            "mem",
            dsn,
            args.broker,
            "perfmem",
            MCP_TASKS_TOOL_MODULES='["tests.fixtures.bench", "tests.fixtures.conformance"]',
        ) as stack:
            rows.append(("idle", sample(stack)))
            for n in range(1, args.batches + 1):
                load(stack, args.creates, args.gets)
                rows.append((f"after batch {n}", sample(stack)))
    finally:
        support.drop_database(DB)
    names = list(rows[0][1])
    print(f"{'':<16}" + "".join(f"{name:>22}" for name in names))
    print(f"{'':<16}" + "".join(f"{'RSS / USS MiB':>22}" for _ in names))
    for label, values in rows:
        cells = "".join(
            f"{values[name][0]:>13.1f} / {values[name][1]:>5.1f}" if name in values else f"{'-':>22}"
            for name in names
        )
        print(f"{label:<16}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
