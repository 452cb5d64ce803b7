"""Create latency at one connection, with and without jobs executing beside it (run by hand).

    .venv/bin/python tests/bench/create_p50.py [--segments 6] [--seconds 5]
        [--api-cpus 0] [--worker-cpus 0] [--client-cpus 1]
        [--worker-env KEY=VALUE ...] [--api-env KEY=VALUE ...] [--worker-nice N] [--py-spy OUT]

Starts a test stack (scratch database ``mcp_perf_create``) and runs shared/bench's
``tools_call.lua`` (``noop``) with ``wrk -c1`` in alternating segments: the worker running, then
the worker stopped (SIGSTOP on its whole tree; the jobs wait and are drained before the next
segment). With the worker stopped the fair publisher soon has no room to release into, so that
column is the API without publishing, not the API alone doing the same work. Both kinds run in
the same minute, so their ratio means something on a noisy machine. Prints create p50/p90,
creates/s and the API's CPU per create.

The default pinning is shared/bench's: API and worker on CPU 0, the client on CPU 1.
``--worker-env`` / ``--api-env`` set environment variables for one side only (e.g.
``PGOPTIONS=-csynchronous_commit=off`` to see what the worker's commits cost the creates);
``--worker-nice`` renices the pool children; ``--py-spy`` samples the API (raw format) in the
first segment of each kind. Needs ``wrk``, ``taskset`` and the shared bench next to the checkout
(``../shared/bench``, or ``BENCH_DIR``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402
from tests.bench.procs import cpu_seconds, lua_dir, tree  # noqa: E402

DB = "mcp_perf_create"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--segments", type=int, default=6, help="segments of each kind")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--api-cpus", default="0")
    parser.add_argument("--worker-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--api-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--worker-nice", type=int, default=0, help="renice the worker's pool children")
    parser.add_argument(
        "--py-spy",
        dest="py_spy",
        metavar="OUT",
        help="py-spy (raw) of the API in the first segment of each kind: OUT.running, OUT.stopped",
    )
    args = parser.parse_args()
    lua = lua_dir("tools_call.lua")
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    env = support.stack_env(dsn, args.broker, "perfcreate", MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL="0")
    worker = support.start_worker("create-worker", {**env, **_pairs(args.worker_env)})
    api = None
    try:
        api, url = support.start_api("create-api", {**env, **_pairs(args.api_env)})
        _pin(api.popen.pid, args.api_cpus)
        time.sleep(3)  # the pool children exist once the worker is up
        _pin(worker.popen.pid, args.worker_cpus)
        if args.worker_nice:
            for child in tree(worker.popen.pid)[1:]:
                subprocess.run(
                    ["renice", "-n", str(args.worker_nice), "-p", str(child)], check=True, capture_output=True
                )
        wrk_env = {**os.environ, "MCPBENCH_LUA_DIR": str(lua)}
        results: dict[str, list[dict[str, float]]] = {"worker running": [], "worker stopped": []}
        for _ in range(args.segments):
            for kind in results:
                _drain(dsn)
                stop = kind == "worker stopped"
                if stop:
                    _signal_tree(worker.popen.pid, signal.SIGSTOP)
                try:
                    spy = None
                    if args.py_spy and not results[kind]:
                        out = f"{args.py_spy}.{'stopped' if stop else 'running'}"
                        spy = _py_spy(api.popen.pid, args.seconds, out)
                    before = cpu_seconds(api.popen.pid)
                    run = _wrk(url, lua, args, wrk_env)
                    if spy is not None:
                        spy.wait(60)
                    run["api_cpu"] = (cpu_seconds(api.popen.pid) - before) / run["ok"]
                    results[kind].append(run)
                finally:
                    if stop:
                        _signal_tree(worker.popen.pid, signal.SIGCONT)
        for kind, runs in results.items():
            p50 = [r["p50"] for r in runs]
            rate = [r["rate"] for r in runs]
            print(
                f"{kind:15} create p50 {statistics.median(p50) / 1000:.3f} ms"
                f" (segments {min(p50) / 1000:.3f}-{max(p50) / 1000:.3f}),"
                f" p90 {statistics.median(r['p90'] for r in runs) / 1000:.3f} ms,"
                f" {statistics.median(rate):.0f} creates/s,"
                f" API CPU per create {statistics.median(r['api_cpu'] for r in runs) * 1e6:.0f} us"
            )
    finally:
        if api is not None:
            api.stop()
        _signal_tree(worker.popen.pid, signal.SIGCONT)
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(DB)
    return 0


def _pairs(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def _pin(pid: int, cpus: str) -> None:
    for member in tree(pid):
        subprocess.run(["taskset", "-acp", cpus, str(member)], check=True, capture_output=True)


def _signal_tree(pid: int, sig: signal.Signals) -> None:
    for member in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, sig)


def _drain(dsn: str, timeout_s: float = 120) -> None:
    """Wait until every task created so far is terminal (the worker caught up)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM mcp_tasks WHERE status IN ('submitted', 'working')"
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.2)
    raise SystemExit("the worker did not drain the backlog")


def _wrk(url: str, lua: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, float]:
    command = ["taskset", "-c", args.client_cpus, "wrk", "-t1", "-c1", f"-d{args.seconds}s"]
    out = subprocess.run(
        [*command, "-s", str(lua / "tools_call.lua"), url],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("MCPBENCH_JSON "))
    report = json.loads(line.split(" ", 1)[1])
    ok = report["counters"]["ok"]
    if ok == 0 or ok != report["requests"]:
        raise SystemExit(f"creates failed: {report['counters']}")
    latency = report["latency_us"]
    rate = ok / (report["duration_us"] / 1e6)
    return {"p50": latency["p50"], "p90": latency["p90"], "rate": rate, "ok": ok}


def _py_spy(pid: int, seconds: int, out: str) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    record = [str(spy), "record", "-p", str(pid), "-d", str(seconds), "-f", "raw", "-o", out, "-r", "250"]
    proc = subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc


if __name__ == "__main__":
    raise SystemExit(main())
