"""Checkpoint throughput: save and load of one file, on Postgres chunks and on a directory (run by
hand; pytest never collects this file).

    .venv/bin/python tests/bench/checkpoint_bench.py [--mib 64] [--rounds 3]

Uses the machine's Postgres (``MCP_TASKS_TEST_DATABASE_URL``, as the tests do): a fresh database
migrated to head, one task row held by this process, then ``ctx.checkpoint`` as a job sees it
(``worker.checkpoints.JobCheckpoints`` over ``WorkerStore``): ``save(path)`` of a file of random
bytes, ``load_to(path)``, and ``load`` (bytes). Prints MB/s (1 MB = 10^6 bytes) per round, and the
process's peak RSS before the first ``load`` (the only call that holds the whole checkpoint).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import WorkerStore, migrate  # noqa: E402
from mcp_celery_tasks.transient import ride_out  # noqa: E402
from mcp_celery_tasks.worker.checkpoints import JobCheckpoints  # noqa: E402
from tests import support  # noqa: E402

ME = "bench:1:aaaa"


def _task(database_url: str) -> tuple[str, str]:
    task_id, job_id = uuid.uuid4().hex, uuid.uuid4().hex
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,"
            " poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, worker,"
            " lease_until) VALUES (%s, %s, 'anon', 'bench', '{}', 'working', 1, 1, 'q', 1, '2026-07-28',"
            " '{}', %s, now() + interval '1 hour')",
            (task_id, job_id, ME),
        )
    return task_id, job_id


def _timed(what: str, size: int, call: Callable[[], Any]) -> None:
    started = time.perf_counter()
    call()
    took = time.perf_counter() - started
    print(f"  {what:<14} {took:6.2f} s  {size / took / 1e6:7.1f} MB/s")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rounds(checkpoints: JobCheckpoints, rounds: int, size: int, source: Path, target: Path) -> None:
    for _ in range(rounds):
        _timed("save(path)", size, lambda: checkpoints.save("weights", source))
        _timed("load_to(path)", size, lambda: checkpoints.load_to("weights", target))
    # Streamed both ways: the process never held the file whole (load() below does, by design).
    print(f"  peak RSS so far {_peak_mib():.0f} MiB")
    for _ in range(rounds):
        _timed("load()", size, lambda: checkpoints.load("weights"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="size of the checkpointed file")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = args.mib * 1024 * 1024
    name = f"mcpt_ckpt_bench_{uuid.uuid4().hex[:6]}"
    database_url = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=database_url))
        with tempfile.TemporaryDirectory() as scratch:
            source, target = Path(scratch) / "weights.bin", Path(scratch) / "loaded.bin"
            with source.open("wb") as out:
                for _ in range(args.mib):
                    out.write(os.urandom(1024 * 1024))
            print(f"peak RSS before any checkpoint {_peak_mib():.0f} MiB")
            for storage, directory in (("postgres", None), ("directory", str(Path(scratch) / "ckpt"))):
                settings = Settings(
                    database_url=database_url, max_checkpoint_bytes=size, checkpoint_dir=directory
                )
                store = WorkerStore(settings)
                task_id, job_id = _task(database_url)
                checkpoints = JobCheckpoints(
                    lambda call, what: ride_out(call, budget_s=5, what=what),
                    store,
                    settings,
                    task_id=task_id,
                    job_id=job_id,
                    tool_name="bench",
                    worker=ME,
                )
                print(f"{storage}: {args.mib} MiB")
                _rounds(checkpoints, args.rounds, size, source, target)
                assert target.read_bytes() == source.read_bytes()
                store.close()
    finally:
        support.drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
