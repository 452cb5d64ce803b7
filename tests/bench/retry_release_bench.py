"""Benchmark: the fair release pass with many retries waiting for their time (run by hand;
pytest never collects this file).

    .venv/bin/python tests/bench/retry_release_bench.py [--backlog 2000] [--waiting 100000]

In a throwaway database (the machine's Postgres, dropped at the end), inserts a ``--backlog`` of
ready jobs from 20 principals and ``--waiting`` retries waiting an hour for their time (the same
principals, the same queue), then times the statements every release pass runs (each in a
transaction that is rolled back, so every run sees the same rows): the scan of queues with a
backlog, the release of 8 jobs, the release of due retries (none due) and one task's place in
line. Then it deletes the waiting retries and times the same again: with the retries kept out of
the backlog index, the two rounds should cost the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import LiteralString

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import backlog, migrate, retry_queries  # noqa: E402
from tests import support  # noqa: E402

INSERT = """
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,
    poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, created_at,
    retry_at, attempts)
SELECT %(prefix)s || g, %(prefix)s || 'j' || g, 'token:p' || (g %% 20), 'tool', '{}'::jsonb, 'working',
       3600000, 1000, 'mcp.default', 5, '2026-07-28', '{}'::jsonb, now() - g * interval '1 ms',
       CASE WHEN %(waiting)s THEN now() + interval '1 hour' END, CASE WHEN %(waiting)s THEN 1 ELSE 0 END
FROM generate_series(1, %(count)s) AS g
"""


def timed(
    conn: psycopg.Connection[tuple[object, ...]], sql: LiteralString, params: dict[str, object]
) -> float:
    """Median wall time (ms) of 30 runs, each rolled back."""
    walls = []
    for _ in range(31):
        started = time.perf_counter()
        with conn.transaction(force_rollback=True):
            conn.execute(sql, params).fetchall()
        walls.append((time.perf_counter() - started) * 1000)
    return statistics.median(walls[1:])


def round_of(conn: psycopg.Connection[tuple[object, ...]], label: str) -> None:
    release = {"queue": "mcp.default", "ahead": 8, "max_waiting": 0}
    results = {
        "queues with a backlog": timed(conn, backlog.BACKLOG_QUEUES, {}),
        "release 8": timed(conn, backlog.RELEASE, release),
        "release due retries": timed(conn, retry_queries.RELEASE_DUE, {"limit": 1000}),
        "place in line": timed(conn, backlog.QUEUE_POSITION, {"task_id": "b1000", "cap": 500}),
    }
    print(f"{label}: " + ", ".join(f"{what} {ms:.2f} ms" for what, ms in results.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--waiting", type=int, default=100_000)
    args = parser.parse_args()
    name = f"mcpt_retry_bench_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(INSERT, {"prefix": "b", "count": args.backlog, "waiting": False})
            conn.execute(INSERT, {"prefix": "r", "count": args.waiting, "waiting": True})
            conn.execute("VACUUM ANALYZE mcp_tasks")
            round_of(conn, f"{args.backlog} ready + {args.waiting} waiting retries")
            conn.execute("DELETE FROM mcp_tasks WHERE retry_at IS NOT NULL")
            conn.execute("VACUUM ANALYZE mcp_tasks")
            round_of(conn, f"{args.backlog} ready, no waiting retries")
    finally:
        support.drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
