"""Benchmark of the console's live task page (run by hand; pytest never collects this file).

    .venv/bin/python tests/bench/console_live_bench.py [--tasks 40] [--pages 50]

Starts a stack of its own (API + prefork worker, the machine's Postgres and Redis) with the console
on, then:

- latency: for each of ``--tasks`` held jobs, opens its live stream (``/console/tasks/<job>/live``),
  releases the job (a file the tool waits for, checked every 50 ms) and times until the stream
  says ``completed``: median and p95, in milliseconds (the tool's own 50 ms check included);
- idle cost: opens ``--pages`` streams on held jobs and reads the API process's CPU time
  (``/proc/<pid>/stat``) over 10 s, beside the same 10 s with no page open.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import tempfile
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
from tests.bench.procs import cpu_seconds  # noqa: E402

TOKEN = "bench-admin-" + uuid.uuid4().hex


def _job(dsn: str, task_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row: Any = conn.execute("SELECT job_id FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    return str(row[0])


async def _latency(base: str, client: support.Client, dsn: str, gates: Path, tasks: int) -> list[float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    seen: list[float] = []
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        for n in range(tasks):
            gate = gates / f"latency-{n}"
            task_id = await asyncio.to_thread(client.start, "con_hold", {"text": f"t{n}", "gate": str(gate)})
            job = await asyncio.to_thread(_job, dsn, task_id)
            async with http.stream("GET", f"/console/tasks/{job}/live") as stream:
                released = 0.0
                async for line in stream.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    state = json.loads(line[6:])
                    if state.get("display_status") == "working" and state.get("worker") and not released:
                        gate.touch()
                        released = time.perf_counter()
                    elif state.get("display_status") == "completed" and released:
                        seen.append((time.perf_counter() - released) * 1000)
                        break
    return seen


async def _idle_cpu(
    base: str, client: support.Client, dsn: str, gates: Path, pages: int, pid: int
) -> tuple[float, float]:
    never = str(gates / "never")
    jobs = [_job(dsn, client.start("con_hold", {"text": f"idle {n}", "gate": never})) for n in range(pages)]
    await asyncio.sleep(2)
    before = cpu_seconds(pid)
    await asyncio.sleep(10)
    quiet = cpu_seconds(pid) - before
    opened: asyncio.Queue[str] = asyncio.Queue()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:

        async def follow(job: str) -> None:
            async with http.stream("GET", f"/console/tasks/{job}/live") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("event: state"):
                        opened.put_nowait(job)

        followers = [asyncio.create_task(follow(job)) for job in jobs]
        for _ in jobs:
            await asyncio.wait_for(opened.get(), 60)
        await asyncio.sleep(2)
        before = cpu_seconds(pid)
        await asyncio.sleep(10)
        busy = cpu_seconds(pid) - before
        for follower in followers:
            follower.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
    for job in jobs:
        with psycopg.connect(dsn) as conn:
            row: Any = conn.execute("SELECT task_id FROM mcp_tasks WHERE job_id = %s", (job,)).fetchone()
        client.cancel(str(row[0]))
    return quiet, busy


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--pages", type=int, default=50)
    args = parser.parse_args()
    name = f"mcpt_console_live_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name)
    gates = Path(tempfile.mkdtemp(prefix="console-bench-"))
    try:
        migrate.upgrade(Settings(database_url=dsn))
        admins = json.dumps({"bench": hashlib.sha256(TOKEN.encode()).hexdigest()})
        with support.running_stack(
            "console-bench", dsn, support.REDIS_URL, f"b{uuid.uuid4().hex[:6]}",
            MCP_TASKS_TOOL_MODULES='["tests.fixtures.conformance", "tests.fixtures.console"]',
            MCP_TASKS_CONSOLE_ENABLED="true", MCP_TASKS_CONSOLE_ADMIN_TOKENS=admins,
        ) as stack:  # fmt: skip
            base = stack.url.removesuffix("/mcp")
            client = stack.client()
            seen = asyncio.run(_latency(base, client, dsn, gates, args.tasks))
            p95 = statistics.quantiles(seen, n=20)[-1]
            p50 = statistics.median(seen)
            print(
                f"release to 'completed' on the stream ({len(seen)} jobs): p50 {p50:.1f} ms, p95 {p95:.1f} ms"
            )
            quiet, busy = asyncio.run(_idle_cpu(base, client, dsn, gates, args.pages, stack.api.popen.pid))
            more = (busy - quiet) / 10 * 100
            print(f"API CPU over 10 s: {quiet * 1000:.0f} ms with no page open, {busy * 1000:.0f} ms with")
            print(f"  {args.pages} live pages open and idle ({more:.2f} % of a core more)")
            client.close()
    finally:
        support.drop_database(name)


if __name__ == "__main__":
    main()
