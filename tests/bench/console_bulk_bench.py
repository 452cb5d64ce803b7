"""Benchmark of the console's bulk actions on a busy API (run by hand; pytest never collects this).

    .venv/bin/python tests/bench/console_bulk_bench.py [--tasks 1000] [--rounds 1]

Starts a stack of its own (API + prefork worker, the machine's Postgres and Redis) with the console
on, creates ``--tasks`` held jobs, then, while another client polls ``tasks/get`` on a task of its
own as fast as it can (one request at a time):

- bulk cancel: the confirming POST (``/console/bulk``, after the dry run) on all of them;
- bulk retry: the same filter's cancelled tasks retried as new tasks (then cancelled again).

Prints each confirming POST's wall time, and the other client's ``tasks/get`` latency (p50, p95,
max) before and during it: whether the bulk action holds up the API's other requests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402

TOKEN = "bench-admin-" + uuid.uuid4().hex


class Prober(threading.Thread):
    """``tasks/get`` in a loop from a client of its own: (when it started, how long it took)."""

    def __init__(self, url: str, task_id: str) -> None:
        super().__init__(daemon=True)
        self.client = support.Client(url)
        self.task_id = task_id
        self.samples: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.perf_counter()
            reply = self.client.get(self.task_id)
            assert reply.status == 200, reply
            self.samples.append((started, (time.perf_counter() - started) * 1000))

    def between(self, start: float, end: float) -> list[float]:
        return [took for at, took in self.samples if start <= at <= end]


def _stats(samples: list[float]) -> str:
    if len(samples) < 20:
        return f"{len(samples)} requests (too few for percentiles): {samples}"
    cuts = statistics.quantiles(samples, n=20)
    return (
        f"{len(samples)} requests, p50 {statistics.median(samples):.1f} ms, p95 {cuts[-1]:.1f} ms, "
        f"max {max(samples):.1f} ms"
    )


def _now(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row: Any = conn.execute("SELECT now()").fetchone()
    return str(row[0].isoformat())


def _bulk(http: httpx.Client, action: str, fields: dict[str, str]) -> tuple[int, float, str]:
    """The dry run, then the confirming POST: (count confirmed, its wall time in s, its summary)."""
    counted = http.post("/console/bulk/confirm", data={"action": action, **fields})
    assert counted.status_code == 200, counted.text
    found = counted.text.split('name="count" value="', 1)
    count = int(found[1].split('"', 1)[0]) if len(found) > 1 else 0
    started = time.perf_counter()
    done = http.post("/console/bulk", data={"action": action, "count": str(count), **fields})
    took = time.perf_counter() - started
    assert done.status_code == 200, done.text
    summary = done.text.split('id="bulk-done"', 1)[-1][:400] if 'id="bulk-done"' in done.text else ""
    return count, took, " ".join(summary.split())


def _measure(prober: Prober, http: httpx.Client, action: str, fields: dict[str, str]) -> None:
    time.sleep(3)
    before_start = time.perf_counter() - 3
    start = time.perf_counter()
    count, took, _ = _bulk(http, action, fields)
    end = time.perf_counter()
    print(f"bulk {action} of {count} tasks: the confirming POST took {took:.2f} s")
    print(f"  tasks/get from another client before: {_stats(prober.between(before_start, start))}")
    print(f"  tasks/get from another client during: {_stats(prober.between(start, end))}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=1000)
    args = parser.parse_args()
    name = f"mcpt_console_bulk_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=dsn))
        admins = json.dumps({"bench": hashlib.sha256(TOKEN.encode()).hexdigest()})
        with support.running_stack(
            "console-bulk", dsn, support.REDIS_URL, f"k{uuid.uuid4().hex[:6]}",
            MCP_TASKS_TOOL_MODULES='["tests.fixtures.conformance", "tests.fixtures.console"]',
            MCP_TASKS_CONSOLE_ENABLED="true", MCP_TASKS_CONSOLE_ADMIN_TOKENS=admins,
            MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL=str(args.tasks * 3),
        ) as stack:  # fmt: skip
            base = stack.url.removesuffix("/mcp")
            never = f"/nonexistent/{uuid.uuid4().hex}"
            probe = stack.client().start("con_hold", {"text": "probe", "gate": never, "seconds": 600})
            since = _now(dsn)
            clients = [stack.client() for _ in range(8)]

            def create(n: int) -> str:
                return clients[n % 8].start("con_hold", {"text": f"bulk {n}", "gate": never, "seconds": 600})

            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(create, range(args.tasks)))
            print(f"created {args.tasks} held tasks in {time.perf_counter() - started:.1f} s")
            prober = Prober(stack.url, probe)
            prober.start()
            fields = {"tool": "con_hold", "since": since}
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
                _measure(prober, http, "cancel", fields)
                time.sleep(3)  # the two running jobs stop at their next check
                _measure(prober, http, "retry", fields)
                _bulk(http, "cancel", fields)  # the retries, cancelled in turn
            prober.stopping.set()
            prober.join(10)
            for client in clients:
                client.close()
    finally:
        support.drop_database(name)


if __name__ == "__main__":
    main()
