"""tasks/get under wrk, optionally with py-spy on the API (run by hand; never collected).

    .venv/bin/python tests/bench/get_profile.py [--connections 64] [--seconds 8]
        [--py-spy PATH/TO/py-spy --out /tmp/get.raw] [--broker redis://127.0.0.1:6379/7]

Starts a test stack (scratch database ``mcp_perf_get``), creates 300 ``noop`` tasks and waits for
them, then runs ``wrk`` with shared/bench's ``tasks_get.lua`` over their ids (pinned to CPU 1
with ``taskset``). The API is pinned to CPU 0; its CPU per get (user and system) and its busy
threads are printed. With ``--py-spy`` the API is sampled at 200 Hz into ``--out`` (py-spy's raw
format; ``PY_SPY_ARGS`` adds options, e.g. ``--native``) and the share of samples per library is
printed. Needs ``wrk``, ``taskset`` and the shared bench next to the checkout
(``../shared/bench``, or ``BENCH_DIR``).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402
from tests.bench.procs import lua_dir  # noqa: E402

DB = "mcp_perf_get"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--py-spy", dest="py_spy", help="path to a py-spy binary")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "get-profile.raw"))
    args = parser.parse_args()
    lua = lua_dir("tasks_get.lua")
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    try:
        with support.running_stack(
            "get",
            dsn,
            args.broker,
            "perfget",
            MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL="0",  # quotas off
        ) as stack:
            client = stack.client()
            params = {"name": "noop", "arguments": {}, "_meta": support.meta(True)}
            ids = [str(client.request("tools/call", params).result["taskId"]) for _ in range(300)]
            for task_id in ids:
                client.wait_status(task_id)
            client.close()
            id_file = Path(tempfile.mkdtemp(prefix="get-profile-")) / "ids.txt"
            id_file.write_text("\n".join(ids) + "\n")
            env = {**os.environ, "MCPBENCH_LUA_DIR": str(lua), "MCPBENCH_IDS": str(id_file)}
            spy = None
            if args.py_spy:
                record = ["record", "-p", str(stack.api.popen.pid), "-d", str(args.seconds)]
                spy = subprocess.Popen(
                    [
                        args.py_spy,
                        *record,
                        "-f",
                        "raw",
                        "-o",
                        args.out,
                        "-r",
                        "200",
                        *os.environ.get("PY_SPY_ARGS", "").split(),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.5)
            api_pid = stack.api.popen.pid
            subprocess.run(["taskset", "-acp", "0", str(api_pid)], check=True, capture_output=True)
            cpu_before = _cpu_seconds(api_pid)
            load = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s"]
            wrk = subprocess.run(
                ["taskset", "-c", "1", *load, "-s", str(lua / "tasks_get.lua"), stack.url],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            cpu_after = _cpu_seconds(api_pid)
            for task in sorted(Path(f"/proc/{api_pid}/task").iterdir()):
                spent = sum(_cpu_seconds(api_pid, int(task.name)))
                if spent >= 0.05:  # since the API started: threads that did work
                    print(f"  thread {task.name} ({(task / 'comm').read_text().strip()}): {spent:.2f} s CPU")
            user, system = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
            print(
                "\n".join(
                    line for line in wrk.stdout.splitlines() if "Requests/sec" in line or "Latency" in line
                )
            )
            done = re.search(r"(\d+) requests in", wrk.stdout)
            if done:
                gets = int(done.group(1))
                print(
                    f"API CPU per get: {(user + system) / gets * 1e6:.0f} us (user {user / gets * 1e6:.0f},"
                    f" system {system / gets * 1e6:.0f}; API pinned to CPU 0)"
                )
            if spy is not None:
                spy.wait(60)
                summarize(Path(args.out))
    finally:
        support.drop_database(DB)
    return 0


def _cpu_seconds(pid: int, thread: int | None = None) -> tuple[float, float]:
    """User and system CPU of one process (its threads included) or of one of its threads."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def summarize(raw: Path) -> None:
    """Share of samples whose innermost frame is in each library (our modules by file)."""
    total = 0
    by_place: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        match = re.search(r"\((.*?):\d+\)$", stack.split(";")[-1])
        path = match.group(1) if match else "?"
        path = re.sub(r".*site-packages/", "", path)
        place = path.split("mcp_celery_tasks/", 1)[-1] if "mcp_celery_tasks/" in path else path.split("/")[0]
        by_place[place] += int(count)
    print(f"{total} samples")
    for place, samples in by_place.most_common(20):
        print(f"  {samples / total * 100:5.1f}%  {place}")


if __name__ == "__main__":
    raise SystemExit(main())
