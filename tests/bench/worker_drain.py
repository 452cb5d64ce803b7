"""A real Celery worker draining noop jobs: jobs/s and worker CPU per job (run by hand).

    .venv/bin/python tests/bench/worker_drain.py [--jobs 3000] [--concurrency 2] [--py-spy OUT.txt]

Creates a scratch database (``mcp_perf_drain``), inserts ``--jobs`` noop rows by SQL, publishes
their ``run_tool`` messages to Redis (db 7, queue ``mcp.perfdrain``) *before* the worker starts,
then starts ``mcp-celery-tasks worker -P prefork -c N`` and times the drain from the first job
started to the last row completed (database clock). CPU is the worker tree's (main process and
pool children) over the drain, from psutil, so it includes Celery's share: message decode, ack,
pool IPC and the watchdog. With ``--py-spy`` the children are sampled during the drain and the
collapsed stacks are summarized by step (inclusive share of samples).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.broker import channel  # noqa: E402
from mcp_celery_tasks.broker.celery_app import create_app  # noqa: E402
from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests.bench.worker_steps import INSERT  # noqa: E402

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "mcp_perf_drain"
QUEUE = "mcp.perfdrain"

# Frame markers -> step, for the py-spy summary (first match in a stack wins, most specific first).
STEPS = [
    ("claim (SQL)", "claim (mcp_celery_tasks/store/sync.py"),
    ("outcome write + NOTIFY (SQL)", "finish (mcp_celery_tasks/store/sync.py"),
    ("lease renew / watchdog (SQL)", "watch_jobs ("),
    ("runtime flush", "flush (mcp_celery_tasks/worker/runtime.py"),
    ("telemetry: spans", "opentelemetry"),
    ("telemetry: metrics", "prometheus_client"),
    ("job log line", "logging/__init__.py"),
    ("tool call (noop)", "_call (mcp_celery_tasks/worker/runner.py"),
    ("result mapping", "to_call_tool_result"),
    ("runner other", "run (mcp_celery_tasks/worker/runner.py"),
    ("celery: ack / broker I/O", "kombu"),
    ("celery: trace / request", "celery/app/trace.py"),
    ("billiard pool IPC", "billiard"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--py-spy", dest="pyspy", default=None, help="write the collapsed stacks here")
    parser.add_argument("--log-level", default="info", help="the worker's (info: the job log line is on)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the worker")
    args = parser.parse_args()
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    dsn = ADMIN.rsplit("/", 1)[0] + "/" + DB
    settings = Settings(database_url=dsn, broker_url=args.broker, default_queue=QUEUE)
    migrate.upgrade(settings)
    try:
        return drain(args, settings, dsn)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def drain(args: argparse.Namespace, settings: Settings, dsn: str) -> int:
    app = create_app(settings)
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(QUEUE)  # type: ignore[attr-defined]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(INSERT, {"n": args.jobs}).fetchall()
    for job_id, _task_id in rows:
        channel.publish_job(app, job_id, QUEUE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env.update(
        MCP_TASKS_DATABASE_URL=dsn,
        MCP_TASKS_BROKER_URL=args.broker,
        MCP_TASKS_DEFAULT_QUEUE=QUEUE,
        MCP_TASKS_TOOL_MODULES='["tests.fixtures.bench"]',
        PYTHONPATH=str(ROOT),
    )
    env.update(dict(item.split("=", 1) for item in args.env))
    cli = str(ROOT / ".venv" / "bin" / "mcp-celery-tasks")
    argv = [
        cli,
        "worker",
        "-P",
        "prefork",
        "-c",
        str(args.concurrency),
        "-Q",
        QUEUE,
        "--log-level",
        args.log_level,
    ]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "worker_drain.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True, stdout=log, stderr=log)
    spy = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = _wait(conn, "SELECT count(*) FROM mcp_tasks WHERE started_at IS NOT NULL", 1, 60)
            tree = _tree(worker.pid)
            cpu0 = _cpu(tree)
            main0, kids0 = _cpu(tree[:1]), _cpu(tree[1:])
            t0 = time.monotonic()
            if args.pyspy:
                spy = subprocess.Popen(
                    [
                        str(ROOT / ".venv" / "bin" / "py-spy"),
                        "record",
                        "--pid",
                        str(worker.pid),
                        "--subprocesses",
                        "--rate",
                        "200",
                        "--format",
                        "raw",
                        "--output",
                        args.pyspy,
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            done = _wait(conn, "SELECT count(*) FROM mcp_tasks WHERE status = 'completed'", args.jobs, 600)
            wall = time.monotonic() - t0
            cpu = _cpu(tree) - cpu0
            main_cpu, kids_cpu = _cpu(tree[:1]) - main0, _cpu(tree[1:]) - kids0
            span = conn.execute(
                "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float FROM mcp_tasks"
            ).fetchone()
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
    db_span = float(span[0]) if span else wall
    print(f"jobs {args.jobs}  concurrency {args.concurrency}  first-start seen {started}")
    print(f"drain wall {wall:.2f} s  (db clock first start -> last finish {db_span:.2f} s)")
    print(f"jobs/s {done / db_span:.0f}")
    print(f"worker tree CPU {cpu:.2f} s = {cpu / done * 1e3:.3f} ms per job")
    print(
        f"  main process {main_cpu / done * 1e3:.3f} ms/job, pool children {kids_cpu / done * 1e3:.3f} ms/job"
    )
    if args.pyspy and Path(args.pyspy).exists():
        summarize(Path(args.pyspy))
    return 0


def summarize(path: Path) -> None:
    total = 0
    by_step: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for step, marker in STEPS:
            if marker in stack:
                by_step[step] += n
                break
        else:
            by_step["idle / other"] += n
    print(f"py-spy samples {total} (all threads of the tree, idle included)")
    for step, n in by_step.most_common():
        print(f"  {step:<32} {100 * n / total:5.1f} %")


def _wait(conn: psycopg.Connection, sql: str, at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(sql).fetchone()
        n = int(row[0]) if row else 0
        if n >= at_least:
            return n
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {n} of {at_least} for {sql}")
        time.sleep(0.02)


def _tree(pid: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 20
    root = psutil.Process(pid)
    while True:
        procs = [root, *root.children(recursive=True)]
        if len(procs) >= 2 or time.monotonic() > deadline:
            return procs
        time.sleep(0.1)


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


if __name__ == "__main__":
    raise SystemExit(main())
