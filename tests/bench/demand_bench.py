"""Benchmark of the elastic-pool bookkeeping at scale (run by hand; pytest never collects this file).

    .venv/bin/python tests/bench/demand_bench.py [--rows 10000000] [--active 20000] [--workers 100]

In a throwaway database (the machine's Postgres, dropped at the end), inserts ``--rows`` task rows
with ``generate_series`` (all but ``--active`` of them finished, as in a deployment that keeps a
week of history), spread over 4 queues, the active ones split into backlog, published, running,
resident and suspended; registers ``--workers`` workers; then measures, per sampling interval:

- the demand query (``SELECT * FROM mcp_queue_demand``: what each API process runs once per
  ``demand_interval_seconds``) and KEDA's per-queue query: wall time (median, p95 of 30) and the
  Postgres backend's CPU (its /proc stat, so the server must run on this machine);
- one heartbeat of each of the ``--workers`` workers (the upsert each worker main process runs
  once per ``worker_heartbeat_seconds``): total wall time and backend CPU for all of them;
- ``tasks workers`` and the admins' ``mcp_workers_overview`` view (the live workers with the jobs
  each runs now).

Then it repeats the demand query with ``--big-active`` active rows (a backlog that size) to show
that the cost follows the active rows, not the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import WorkerStore, migrate  # noqa: E402
from mcp_celery_tasks.store.fleet import WorkerInfo  # noqa: E402
from tests import support  # noqa: E402

QUEUES = ("mcp.default", "gpu", "cpu-big", "mcp.maintenance")
_TICK = os.sysconf("SC_CLK_TCK")

INSERT = """
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,
    poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, created_at,
    dispatched_at, lease_until, worker, suspended_at, expires_at, finished_at, started_at)
SELECT 't' || g, 'j' || g, 'token:p' || (g %% 50), 'tool' || (g %% 7), '{}'::jsonb,
       CASE WHEN g > %(active)s THEN 'completed'
            WHEN g %% 10 IN (7, 8, 9) THEN 'input_required' ELSE 'working' END,
       3600000, 1000, (ARRAY['mcp.default', 'gpu', 'cpu-big'])[1 + g %% 3], 3, '2026-07-28',
       '{}'::jsonb, now() - (g %% 600000) * interval '1 second',
       CASE WHEN g <= %(active)s AND g %% 10 IN (0, 1, 2) THEN NULL ELSE now() END,
       CASE WHEN g <= %(active)s AND g %% 10 IN (5, 6, 7) THEN now() + interval '30 seconds' END,
       CASE WHEN g <= %(active)s AND g %% 10 IN (5, 6, 7)
            THEN 'w' || (g %% 100) || ':1' || (g %% 4) || ':n' END,
       CASE WHEN g <= %(active)s AND g %% 10 IN (8, 9) THEN now() END,
       CASE WHEN g > %(active)s THEN now() + interval '1 day' END,
       CASE WHEN g > %(active)s THEN now() END, now()
FROM generate_series(%(start)s, %(stop)s) AS g
"""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (a Postgres backend on this machine)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


Conn = psycopg.Connection[tuple[object, ...]]


def backend_pid(conn: Conn, application_name: str | None = None) -> int:
    sql = "SELECT pg_backend_pid()" if application_name is None else (
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s")  # fmt: skip
    row = conn.execute(sql, () if application_name is None else (application_name,)).fetchone()
    assert row is not None
    return int(str(row[0]))


def timed(run: Callable[[], object], n: int, pid: int) -> tuple[list[float], float]:
    """Wall times (ms) of ``n`` runs after a warm-up, and backend ``pid``'s CPU (ms) per run."""
    run()
    cpu0, walls = cpu_s(pid), []
    for _ in range(n):
        started = time.perf_counter()
        run()
        walls.append((time.perf_counter() - started) * 1000)
    return walls, (cpu_s(pid) - cpu0) * 1000 / n


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def report(what: str, walls: list[float], cpu_ms: float) -> None:
    median, tail = statistics.median(walls), p95(walls)
    print(f"{what}: median {median:.2f} ms, p95 {tail:.2f} ms, backend CPU {cpu_ms:.2f} ms")


def fill(dsn: str, rows: int, active: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        started = time.monotonic()
        for start in range(1, rows + 1, 1_000_000):
            conn.execute(INSERT, {"start": start, "stop": min(rows, start + 999_999), "active": active})
        conn.execute("VACUUM ANALYZE mcp_tasks")
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('mcp_tasks'))").fetchone()
        took = time.monotonic() - started
        print(f"{rows:,} rows ({active:,} active) in {took:.0f} s; table and indexes: {size and size[0]}")


def worker_infos(count: int) -> list[WorkerInfo]:
    now = dt.datetime.now(dt.UTC)
    return [
        WorkerInfo(node=f"w{n}@host{n}", hostname=f"w{n}", pid=1, pids=[10, 11, 12, 13],
                   queues=[QUEUES[n % 3], "mcp.default"] if n % 2 else [QUEUES[n % 3]], slots=4,
                   version="0.1.0", pool="prefork", instance="i", started_at=now)
        for n in range(count)
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--active", type=int, default=20_000)
    parser.add_argument("--big-active", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=100)
    args = parser.parse_args()
    name = f"mcpt_demand_bench_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=dsn))
        fill(dsn, args.rows, args.active)
        infos = worker_infos(args.workers)
        store = WorkerStore(Settings(database_url=dsn), application_name="mcp-demand-bench-beats")
        for info in infos:
            store.heartbeat(info, 60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            pid = backend_pid(conn)
            demand = "SELECT * FROM mcp_queue_demand"
            report("demand view, every queue (an API process, once per interval)",
                   *timed(lambda: conn.execute(demand).fetchall(), 30, pid))  # fmt: skip
            keda = "SELECT COALESCE(max(demand_slots), 0) FROM mcp_queue_demand WHERE queue = 'gpu'"
            report("KEDA's query, one queue (once per pollingInterval)",
                   *timed(lambda: conn.execute(keda).fetchone(), 30, pid))  # fmt: skip
            beats_pid = backend_pid(conn, "mcp-demand-bench-beats")

            def beat_all() -> None:
                for info in infos:
                    store.heartbeat(info, 60)

            report(f"{args.workers} heartbeats (every worker, one interval)", *timed(beat_all, 5, beats_pid))
            report(f"tasks workers ({args.workers} workers and their jobs)",
                   *timed(lambda: store.workers(), 5, beats_pid))  # fmt: skip
            overview = "SELECT * FROM mcp_workers_overview"
            report(f"workers overview view ({args.workers} live workers and their jobs)",
                   *timed(lambda: conn.execute(overview).fetchall(), 10, pid))  # fmt: skip
            for row in conn.execute(
                "SELECT queue, demand_slots, waiting_suspended, worker_slots FROM mcp_queue_demand"
            ):
                print("  ", row)
            extra = (args.active + 1, args.big_active)
            if args.big_active > args.active:
                conn.execute("SET synchronous_commit = off")
                conn.execute(
                    "UPDATE mcp_tasks SET status = 'working', dispatched_at = NULL, expires_at = NULL, "
                    "finished_at = NULL WHERE task_id IN (SELECT 't' || g FROM generate_series(%s, %s) g)",
                    extra,
                )
                conn.execute("VACUUM ANALYZE mcp_tasks")
                report(f"demand view with {args.big_active:,} active rows (a backlog that size)",
                       *timed(lambda: conn.execute(demand).fetchall(), 10, pid))  # fmt: skip
        store.close()
    finally:
        support.drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
