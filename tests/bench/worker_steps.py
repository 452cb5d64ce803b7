"""The worker path of one noop job, step by step (run by hand; pytest never collects this file).

    .venv/bin/python tests/bench/worker_steps.py [--jobs 2000] [--database-url postgresql://...]

Creates a scratch database (``mcp_perf_steps``, dropped at the end), inserts ``--jobs`` noop rows
by SQL, then, in this process and without Celery or a broker:

* times each store statement of the path on its own (claim, outcome write with its NOTIFY, a
  lease renewal, the same outcome write with no NOTIFY, an empty round trip);
* times ``JobRunner.run`` end to end with the silent observer and with ``Telemetry`` (metrics,
  the ``task.finished`` log line, spans), wall and CPU per job;
* times the lease keeper's watch/release pair alone.

What the Celery worker adds on top (message decode, ack, pool IPC) is measured by
``worker_drain.py``; the difference of the two CPU figures is Celery's share.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tests.fixtures.bench  # noqa: E402,F401  (registers noop)
from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import (  # noqa: E402
    WorkerStore,
    migrate,
    queries,
)
from mcp_celery_tasks.worker.leases import LeaseKeeper  # noqa: E402
from mcp_celery_tasks.worker.observe import SILENT, JobObserver, Telemetry  # noqa: E402
from mcp_celery_tasks.worker.runner import JobRunner, worker_identity  # noqa: E402
from mcp_celery_tasks.worker.runtime import Runtime  # noqa: E402

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "mcp_perf_steps"

INSERT = """
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,
    poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, dispatched_at)
SELECT 't' || md5(random()::text || g), 'j' || md5(random()::text || g), 'bench', 'noop', '{}',
    'working', 3600000, 100, 'mcp.bench', 3, '2026-07-28', '{"extensions": {}}', now()
FROM generate_series(1, %(n)s) AS g
RETURNING job_id, task_id
"""


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered) * 1e6, 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1),
        "mean_us": round(statistics.fmean(ordered) * 1e6, 1),
    }


def timed(n: int, fn: Callable[[int], Any]) -> tuple[dict[str, float], float]:
    """Per-call wall percentiles of ``fn(i)`` for i in range(n), and CPU seconds per call."""
    samples = []
    cpu0 = time.process_time()
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - t0)
    return percentiles(samples), (time.process_time() - cpu0) / n


def fresh_rows(dsn: str, n: int) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(INSERT, {"n": n}).fetchall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--admin-url", default=ADMIN)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    n = args.jobs
    with psycopg.connect(args.admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.execute(f"CREATE DATABASE {DB}")
    dsn = args.admin_url.rsplit("/", 1)[0] + "/" + DB
    logging.getLogger("mcp_celery_tasks").setLevel(logging.INFO)  # the job log is on, as in a worker
    logging.basicConfig(stream=open("/dev/null", "w"), level=logging.INFO)  # noqa: SIM115
    try:
        settings = Settings(database_url=dsn, tool_modules=["tests.fixtures.bench"])
        migrate.upgrade(settings)
        out = run(settings, dsn, n)
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    if args.json:
        print(json.dumps(out))
    else:
        width = max(len(k) for k in out)
        for name, value in out.items():
            print(f"{name:<{width}}  {value}")
    return 0


def run(settings: Settings, dsn: str, n: int) -> dict[str, Any]:
    store = WorkerStore(settings)
    me = worker_identity()
    out: dict[str, Any] = {}

    def stat(name: str, result: tuple[dict[str, float], float]) -> None:
        wall, cpu = result
        out[name] = {**wall, "cpu_us": round(cpu * 1e6, 1)}

    stat("round trip (SELECT 1)", timed(n, lambda i: store._fetch("SELECT 1", {})))

    rows = fresh_rows(dsn, n)
    stat("claim", timed(n, lambda i: store.claim(rows[i]["job_id"], me, 60)))
    stat("renew lease", timed(n, lambda i: store.renew_lease(rows[i]["task_id"], me, 60)))
    result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    stat(
        "outcome write + NOTIFY",
        timed(n, lambda i: store.finish(rows[i]["task_id"], me, "completed", result=result)),
    )

    no_notify = queries.FINISH.replace(f"pg_notify('{queries.NOTIFY_CHANNEL}', task_id)", "1")
    rows = fresh_rows(dsn, n)
    for row in rows:
        store.claim(row["job_id"], me, 60)
    params = {"worker": me, "status": "completed", "result": psycopg.types.json.Jsonb(result), "error": None,
              "message": None, "error_kind": None, "error_message": None}  # fmt: skip
    stat(
        "outcome write, no NOTIFY",
        timed(n, lambda i: store._fetch(no_notify, {**params, "task_id": rows[i]["task_id"]})),
    )

    keeper = LeaseKeeper(settings.lease_seconds)

    def lease_pair(i: int) -> None:
        runtime = Runtime(
            store, task_id=f"x{i}", job_id=f"y{i}", tool_name="noop", worker=me, inbox=_no_inbox
        )
        keeper.watch(runtime)
        keeper.release(runtime)

    stat("lease watch+release (no SQL)", timed(n, lease_pair))

    for label, observer in (("JobRunner.run, silent", SILENT), ("JobRunner.run, Telemetry", Telemetry())):
        rows = fresh_rows(dsn, n)
        runner = JobRunner(store, settings, _no_inbox, observer=observer)
        outcome = runner.run(rows[0]["job_id"], {})  # warm-up
        assert outcome.status == "completed", outcome

        def run_next(i: int, r: JobRunner = runner, jobs: list[dict[str, Any]] = rows) -> Any:
            return r.run(jobs[i + 1]["job_id"], {})

        stat(label, timed(n - 1, run_next))

    out["observer overhead"] = _observer_overhead(settings, dsn, n)
    store.close()
    return out


def _observer_overhead(settings: Settings, dsn: str, n: int) -> dict[str, float]:
    """CPU per job the observer hooks cost by themselves (no SQL)."""
    from mcp_celery_tasks.store.records import ClaimedTask

    job = ClaimedTask("t", "j", "noop", {}, None, {}, 1, 3, "mcp.bench", 0.01)
    out: dict[str, float] = {}
    observer: JobObserver
    for label, observer in (("silent_cpu_us", SILENT), ("telemetry_cpu_us", Telemetry())):
        cpu0 = time.process_time()
        for _ in range(n):
            with observer.job("j", {}):
                with observer.step("claim"):
                    pass
                observer.on_claimed(job)
                observer.on_ran(job, 0.001)
                with observer.step("record outcome", {"mcp.outcome": "completed"}):
                    pass
                observer.on_finished(job, "w", "completed", 0.001)
        out[label] = round((time.process_time() - cpu0) / n * 1e6, 1)
    return out


def _no_inbox() -> Any:
    raise AssertionError("a noop job never waits for input")


if __name__ == "__main__":
    uuid.uuid4()
    raise SystemExit(main())
