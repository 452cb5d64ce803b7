"""Benchmark: what concurrency limits cost the fair release pass and the create (run by hand;
pytest never collects this file).

    .venv/bin/python tests/bench/concurrency_bench.py [--backlog 2000] [--blocked 10000]
        [--baseline-rev 3e13b98] [--creates 2000]

In a throwaway database (the machine's Postgres, dropped at the end):

1. **Unused**: a ``--backlog`` of ready jobs from 20 principals, no tool with a limit. Times the
   release of 8 with this checkout's ``RELEASE`` and with the one at ``--baseline-rev`` (read with
   ``git show``; the statement before concurrency limits), alternating, same rows, each run
   rolled back, with and without prepared statements. The goal: no more than 5 % slower.
2. **In use** (``RELEASE_LIMITED``): the same backlog, every job of a limited tool in 20 groups
   of limit 2, half the groups full. And the worst case: ``--blocked`` jobs of one full group
   ahead of the same principal's other jobs (each pass walks past them).
3. **Create**: ``--creates`` sequential ``ApiStore.create_task`` calls: plain, with a concurrency
   group, and taking the creates-per-second bucket shared by API replicas (a rate that never
   refuses), alternating in blocks of 100 (median per create).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any, LiteralString, cast

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import ApiStore, backlog, migrate  # noqa: E402
from tests import support  # noqa: E402
from tests.integration.test_maintenance import new_task  # noqa: E402

INSERT = """
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,
    poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, created_at,
    concurrency_group, concurrency_limit, dispatched_at, lease_until, worker)
SELECT %(prefix)s || g, %(prefix)s || 'j' || g, 'token:p' || (g %% %(owners)s), %(tool)s, '{}'::jsonb,
       'working', 3600000, 1000, 'mcp.default', 5, '2026-07-28', '{}'::jsonb, now() - g * interval '1 ms',
       CASE WHEN %(limit)s::int IS NOT NULL THEN 'model=' || (g %% %(groups)s) END, %(limit)s,
       CASE WHEN %(dispatched)s THEN now() END, CASE WHEN %(dispatched)s THEN now() + interval '1 hour' END,
       CASE WHEN %(dispatched)s THEN 'host:1:bench' END
FROM generate_series(1, %(count)s) AS g
"""

RELEASE_PARAMS = {"queue": "mcp.default", "ahead": 8, "max_waiting": 0}


def baseline_release(rev: str) -> LiteralString:
    source = subprocess.run(
        ["git", "show", f"{rev}:mcp_celery_tasks/store/backlog.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("baseline_backlog")
    exec(compile(source, "baseline_backlog", "exec"), module.__dict__)  # our own file at another commit
    return cast(LiteralString, module.RELEASE)


def timed(conn: psycopg.Connection[Any], sql: LiteralString, runs: int = 31) -> list[float]:
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        with conn.transaction(force_rollback=True):
            conn.execute(backlog.NO_JIT)  # as the store runs it (both statements alike)
            conn.execute(sql, RELEASE_PARAMS).fetchall()
        walls.append((time.perf_counter() - started) * 1000)
    return walls[1:]


def insert(conn: psycopg.Connection[Any], prefix: str, count: int, **kw: object) -> None:
    params = {"prefix": prefix, "count": count, "owners": 20, "tool": "tool", "limit": None, "groups": 1,
              "dispatched": False, **kw}  # fmt: skip
    conn.execute(INSERT, params)


async def creates(dsn: str, count: int) -> tuple[float, float, float]:
    """Median create (ms): plain; with a concurrency group; with the shared creates-per-second
    bucket taken (a rate that never refuses). Alternating blocks of 100."""
    store = ApiStore(Settings(database_url=dsn))
    await store.open()
    walls: list[list[float]] = [[], [], []]
    try:
        for block in range(count // 100):
            kind = block % 3
            for _ in range(100):
                group = "model=a" if kind == 1 else None
                task = new_task(concurrency_group=group, concurrency_limit=None if group is None else 1)
                rate = 1e9 if kind == 2 else 0.0
                started = time.perf_counter()
                await store.create_task(task, rate=rate, burst=1_000_000_000)
                walls[kind].append((time.perf_counter() - started) * 1000)
    finally:
        await store.close()
    plain, grouped, bucket = (statistics.median(w) for w in walls)
    return plain, grouped, bucket


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--blocked", type=int, default=10_000)
    parser.add_argument("--baseline-rev", default="3e13b98")
    parser.add_argument("--creates", type=int, default=3000)
    args = parser.parse_args()
    old = baseline_release(args.baseline_rev)
    name = f"mcpt_conc_bench_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            insert(conn, "b", args.backlog)
            insert(conn, "f", 40, dispatched=True)  # jobs running
            conn.execute("VACUUM ANALYZE mcp_tasks")
        # Prepared (psycopg's default after 5 runs) and not (behind PgBouncer, ``_conninfo``).
        for threshold in (5, None):
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=threshold) as alone:
                new_ms, old_ms = [], []
                for _ in range(15):  # alternating rounds: the same minute for both
                    new_ms += timed(alone, backlog.RELEASE)
                    old_ms += timed(alone, old)
            new_p50, old_p50 = statistics.median(new_ms), statistics.median(old_ms)
            print(
                f"unused, {args.backlog} ready, prepare_threshold={threshold}: release 8 {new_p50:.3f} ms, "
                f"before limits ({args.baseline_rev}) {old_p50:.3f} ms, ratio {new_p50 / old_p50:.3f}"
            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM mcp_tasks")
            insert(conn, "b", args.backlog, tool="train", limit=2, groups=20)
            # Half the groups full: two of each even group in flight.
            insert(conn, "f", 20, tool="train", limit=2, groups=20, dispatched=True, owners=1)
            conn.execute("DELETE FROM mcp_tasks WHERE task_id LIKE 'f%%' AND concurrency_group IN "
                         "(SELECT 'model=' || g FROM generate_series(1, 19, 2) g)")  # fmt: skip
            insert(conn, "g", 20, tool="train", limit=2, groups=20, dispatched=True, owners=1)
            conn.execute("DELETE FROM mcp_tasks WHERE task_id LIKE 'g%%' AND concurrency_group IN "
                         "(SELECT 'model=' || g FROM generate_series(1, 19, 2) g)")  # fmt: skip
            conn.execute("VACUUM ANALYZE mcp_tasks")
            print(f"in use, {args.backlog} ready in 20 groups, half full: release 8 "
                  f"{statistics.median(timed(conn, backlog.RELEASE_LIMITED)):.3f} ms")  # fmt: skip

            conn.execute("DELETE FROM mcp_tasks")
            insert(conn, "x", args.blocked, tool="train", limit=1, groups=1, owners=1)
            insert(conn, "y", 1, tool="train", limit=1, groups=1, owners=1, dispatched=True)
            insert(conn, "z", 50, tool="other", owners=1)
            conn.execute(
                "UPDATE mcp_tasks SET created_at = now() + interval '1 hour' WHERE task_id LIKE 'z%%'"
            )
            conn.execute("VACUUM ANALYZE mcp_tasks")
            print(f"worst case, {args.blocked} jobs of one full group ahead of 50 others: release 8 "
                  f"{statistics.median(timed(conn, backlog.RELEASE_LIMITED, runs=11)):.3f} ms")  # fmt: skip
        plain, grouped, bucket = asyncio.run(creates(dsn, args.creates))
        print(f"create p50: plain {plain:.3f} ms, with a concurrency group {grouped:.3f} ms "
              f"({grouped / plain:.3f}), taking the replicas' shared rate bucket {bucket:.3f} ms "
              f"({bucket / plain:.3f})")  # fmt: skip
    finally:
        support.drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
