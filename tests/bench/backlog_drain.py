"""A flood of tiny jobs through the API and fair dispatch, and how fast the pool drains it (run by
hand; never collected).

    .venv/bin/python tests/bench/backlog_drain.py [--tasks 3000] [--clients 16] [--workers 2]
        [--broker redis://127.0.0.1:6379/7] [--set MCP_TASKS_DISPATCH_AHEAD=64 ...] [--rounds 1]

Starts a test stack (one API, one prefork worker with ``--workers`` children, scratch database
``mcp_perf_drain``), creates ``--tasks`` ``noop`` tasks from ``--clients`` threads as fast as the
API takes them, and waits until every one has completed. Prints, per round: create rate, the
drain (first creation to last completion, from the rows), jobs/s, the rate at which the backlog
left when creation ended ran (the pool alone, no creates competing for the CPU), and the worker
tree's CPU per job. ``--set`` passes settings to the stack (compare ``MCP_TASKS_DISPATCH_AHEAD``
values, or ``MCP_TASKS_DISPATCH_AHEAD_SECONDS=0`` for a fixed window). The active-tasks quota is
off (``--set MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL=1000`` puts it back).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any, LiteralString

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_drain"


def one(conn: psycopg.Connection[Any], sql: LiteralString) -> Any:
    """The one row an aggregate query answers."""
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="prefork children")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    # One principal floods on purpose: its active-tasks quota would refuse most of the flood.
    extra = {"MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL": "0", **dict(item.split("=", 1) for item in args.set)}
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    try:
        with support.running_stack(
            "drain", dsn, args.broker, "perfdrain", concurrency=args.workers, **extra
        ) as stack:
            for n in range(args.rounds):
                one_round(stack, n + 1, args.tasks, args.clients)
    finally:
        support.drop_database(DB)
    return 0


def one_round(stack: support.Stack, number: int, tasks: int, clients: int) -> None:
    with stack.db() as conn:
        conn.execute("DELETE FROM mcp_tasks")
    cpu_before = tree_cpu_s(stack.worker.popen.pid)
    left = [tasks]
    lock = threading.Lock()
    errors: list[str] = []

    def create() -> None:
        client = stack.client()
        params = {"name": "noop", "arguments": {}, "_meta": support.meta(True)}
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                reply = client.request("tools/call", params)
                if reply.status != 200 or "error" in reply.body:
                    errors.append(str(reply.body)[:200])
        finally:
            client.close()

    started = time.monotonic()
    threads = [threading.Thread(target=create) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    created_in = time.monotonic() - started
    with stack.db() as conn:
        backlog, created_end = one(
            conn,
            "SELECT count(*) FILTER (WHERE status <> 'completed'),"
            " EXTRACT(EPOCH FROM clock_timestamp())::float FROM mcp_tasks",
        )
    deadline = time.monotonic() + 600
    while True:
        with stack.db() as conn:
            active = one(conn, "SELECT count(*) FROM mcp_tasks WHERE status <> 'completed'")[0]
        if not active or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    with stack.db() as conn:
        first, last, done = one(
            conn,
            "SELECT EXTRACT(EPOCH FROM min(created_at))::float, EXTRACT(EPOCH FROM max(finished_at))::float,"
            " count(*) FILTER (WHERE status = 'completed') FROM mcp_tasks",
        )
    cpu = tree_cpu_s(stack.worker.popen.pid) - cpu_before
    drain = last - first
    after = max(last - created_end, 1e-3)
    print(
        f"round {number}: {tasks} noop tasks, {clients} clients: created in {created_in:.2f} s "
        f"({tasks / created_in:.0f}/s); all done {drain:.2f} s after the first creation "
        f"({done / drain:.0f} jobs/s); the {backlog} left when creation ended ran in {after:.2f} s "
        f"({backlog / after:.0f} jobs/s); worker tree CPU {cpu / max(done, 1) * 1e3:.2f} ms/job; "
        f"errors {len(errors)}{'' if not errors else ' e.g. ' + errors[0]}"
    )


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (live ones, from /proc)."""
    total = 0.0
    tick = 100.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending.extend(int(child) for child in children)
    return total


if __name__ == "__main__":
    raise SystemExit(main())
