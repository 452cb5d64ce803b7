"""Benchmark of the console's live task list under a busy pool (run by hand; pytest never collects
this file).

    .venv/bin/python tests/bench/console_list_live_bench.py [--rate 60] [--pages 30] [--seconds 10]

Starts a stack of its own (API + prefork worker of 4, the machine's Postgres and Redis) with the
console on, and a load of ``--rate`` ``slow_compute`` tasks per second (created by four clients, each
completing in a few ms on the worker). Then, for ``--seconds`` each, under the same load:

- with no list page open, and with ``--pages`` first pages of the task list open (their live
  stream, ``/console/tasks/live?news=1…``, as the page's script opens it):
  the API process's CPU (``/proc/<pid>/stat``), the database's statements (``xact_commit`` of
  ``pg_stat_database``: every statement of the API, the worker and the publisher is one), and
  the tasks created and completed;
- on the open pages: the time from a task's commit (its ``created_at``) to its ``new`` row on
  each page, and from its completion (``finished_at``) to the row's ``completed`` on the page
  (the first 200 rows a page follows), p50 and p95 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
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
from tests.bench.procs import cpu_seconds  # noqa: E402

TOKEN = "bench-admin-" + uuid.uuid4().hex
_TICK = os.sysconf("SC_CLK_TCK")


def _postgres_cpu_s() -> float:
    """CPU time of every postgres process now running (the server's backends included)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(postgres)" in text:
            fields = text.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _commits(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row: Any = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0])


def _load(url: str, rate: float, stopping: Any, clients: int = 4) -> None:
    """``rate`` creates per second of a quick tool, paced, from ``clients`` clients (run in a
    process of its own, so the pages' parsing here never slows the load)."""

    def one(lane: int) -> None:
        client = support.Client(url)
        interval = clients / rate
        due = time.perf_counter() + lane * interval / clients
        while not stopping.is_set():
            client.start("slow_compute", {"seconds": 0, "label": f"load {lane}"})
            due += interval
            time.sleep(max(0.0, due - time.perf_counter()))
        client.close()

    lanes = [threading.Thread(target=one, args=(lane,), daemon=True) for lane in range(clients)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()


def _window(dsn: str, pid: int, seconds: float) -> tuple[float, int, int, float, float]:
    """(API CPU s, database commits, tasks completed, Postgres CPU s, this process's CPU s) over
    ``seconds``."""

    def completed() -> int:
        with psycopg.connect(dsn) as conn:
            row: Any = conn.execute("SELECT count(*) FROM mcp_tasks WHERE status = 'completed'").fetchone()
        return int(row[0])

    cpu, commits, done, pg, me = (
        cpu_seconds(pid),
        _commits(dsn),
        completed(),
        _postgres_cpu_s(),
        time.process_time(),
    )
    time.sleep(seconds)
    return (
        cpu_seconds(pid) - cpu,
        _commits(dsn) - commits - 2,  # our own 2 reads
        completed() - done,
        _postgres_cpu_s() - pg,
        time.process_time() - me,
    )


async def _pages(base: str, pages: int, seconds: float, seen: list[tuple[str, str, float, float]]) -> None:
    """Open ``pages`` first pages' live streams; record (event, job, arrival, stream opened: epoch s)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as http:
        page = await http.get("/console/tasks")
        found = page.text.split('data-list-live="', 1)
        assert len(found) == 2, "the first page follows no live stream"
        url = found[1].split('"', 1)[0].replace("&amp;", "&")
        if os.environ.get("BENCH_DEBUG"):
            print("following", url[:300])
        opened = asyncio.Event()
        count = 0

        async def follow() -> None:
            nonlocal count
            async with http.stream("GET", url) as stream:
                opened_at = time.time()
                count += 1
                if count == pages:
                    opened.set()
                event = ""
                async for line in stream.aiter_lines():
                    if os.environ.get("BENCH_DEBUG") and line.strip():
                        print("stream:", stream.status_code, line[:160])
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event in ("new", "row"):
                        data = json.loads(line[6:])
                        if event == "new" or data.get("status") == "completed":
                            seen.append((event, data["job"], time.time(), opened_at))

        followers = [asyncio.create_task(follow()) for _ in range(pages)]
        await asyncio.wait_for(opened.wait(), 60)
        await asyncio.sleep(seconds)
        for follower in followers:
            follower.cancel()
        await asyncio.gather(*followers, return_exceptions=True)


def _latencies(dsn: str, seen: list[tuple[str, str, float, float]]) -> dict[str, list[float]]:
    jobs = sorted({job for _, job, _, _ in seen})
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT job_id, extract(epoch FROM created_at), extract(epoch FROM finished_at) FROM mcp_tasks "
            "WHERE job_id = ANY(%s)",
            (jobs,),
        ).fetchall()
    moments = {
        str(job): (float(created), float(finished) if finished else None) for job, created, finished in rows
    }
    out: dict[str, list[float]] = {"new": [], "row": []}
    for event, job, arrived, opened_at in seen:
        created, finished = moments.get(job, (None, None))
        moment = created if event == "new" else finished
        if moment is not None and moment >= opened_at:  # not a row that had ended before the page
            out[event].append((arrived - moment) * 1000)
    return out


def _stats(samples: list[float]) -> str:
    if len(samples) < 20:
        return f"{len(samples)} samples"
    return (
        f"{len(samples)} samples, p50 {statistics.median(samples):.0f} ms, "
        f"p95 {statistics.quantiles(samples, n=20)[-1]:.0f} ms"
    )


def _report(what: str, window: tuple[float, int, int, float, float], seconds: float) -> None:
    cpu, commits, done, pg, me = window
    print(f"{what}, {seconds:.0f} s: API CPU {cpu / seconds * 100:.1f} % of a core, Postgres "
          f"{pg / seconds * 100:.1f} %, this client {me / seconds * 100:.1f} %; {commits / seconds:.0f} "
          f"database commits/s, {done / seconds:.0f} tasks completed/s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=60.0)
    parser.add_argument("--pages", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    name = f"mcpt_console_list_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=dsn))
        admins = json.dumps({"bench": hashlib.sha256(TOKEN.encode()).hexdigest()})
        with support.running_stack(
            "console-list", dsn, support.REDIS_URL, f"l{uuid.uuid4().hex[:6]}", concurrency=4,
            MCP_TASKS_TOOL_MODULES='["tests.fixtures.conformance", "tests.fixtures.console"]',
            MCP_TASKS_CONSOLE_ENABLED="true", MCP_TASKS_CONSOLE_ADMIN_TOKENS=admins,
        ) as stack:  # fmt: skip
            base, pid = stack.url.removesuffix("/mcp"), stack.api.popen.pid
            stopping = multiprocessing.Event()
            load = multiprocessing.Process(target=_load, args=(stack.url, args.rate, stopping), daemon=True)
            load.start()
            time.sleep(3)  # the pool warms up
            _report("no page open", _window(dsn, pid, args.seconds), args.seconds)
            seen: list[tuple[str, str, float, float]] = []
            result: dict[str, tuple[float, int, int, float, float]] = {}

            def measure() -> None:
                time.sleep(2)  # the streams open
                result["open"] = _window(dsn, pid, args.seconds)

            meter = threading.Thread(target=measure)
            meter.start()
            asyncio.run(_pages(base, args.pages, args.seconds + 2.5, seen))
            meter.join()
            stopping.set()
            load.join(30)
            _report(f"{args.pages} list pages open", result["open"], args.seconds)
            latencies = _latencies(dsn, seen)
            print(f"  commit to the new row on a page: {_stats(latencies['new'])}")
            print(f"  completion to 'completed' on a page: {_stats(latencies['row'])}")
    finally:
        support.drop_database(name)


if __name__ == "__main__":
    main()
