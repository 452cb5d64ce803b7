"""Benchmark of the web console's task list at scale (run by hand; pytest never collects this file).

    .venv/bin/python tests/bench/console_bench.py [--rows 1000000] [--runs 20]

In a throwaway database (the machine's Postgres, dropped at the end), inserts ``--rows`` task rows
(``tests.console_rows``: 200 principals, 7 tools, 2 queues, the newest 100 working (20 of them
then cancelled while running: stopping), about 1 % failed, job ids random UUIDs),
then times what the list page's handler does for each filter: the store call (one statement, 51
rows) and the page's render, through the API's own store (``ApiStore``) and template, for each
sort too, and the overview page's. Prints the median and p95 of ``--runs`` runs of each, in
milliseconds, and each statement's plan root. The rows are inserted under migration 0023 and
0024's index builds timed over them. ``--rows 10000000`` takes some minutes (one INSERT … SELECT
generate_series, about 8 GB of table and indexes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.console import listing  # noqa: E402
from mcp_celery_tasks.console.render import render  # noqa: E402
from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import ApiStore, migrate  # noqa: E402
from tests import support  # noqa: E402
from tests.console_rows import fill  # noqa: E402

STOPPING = """
UPDATE mcp_tasks SET status = 'cancelled', finished_at = NULL, cancel_requested_at = now()
WHERE job_id IN (SELECT job_id FROM mcp_tasks WHERE status = 'working' ORDER BY created_at LIMIT 20)
"""


def _cases(dsn: str) -> dict[str, dict[str, str]]:
    with psycopg.connect(dsn) as conn:
        middle: Any = conn.execute(
            "SELECT created_at, job_id FROM mcp_tasks"
            " ORDER BY created_at DESC, job_id DESC LIMIT 1 OFFSET 5000"
        ).fetchone()
        done: Any = conn.execute(
            "SELECT finished_at, job_id FROM mcp_tasks WHERE finished_at IS NOT NULL"
            " ORDER BY finished_at DESC, job_id DESC LIMIT 1 OFFSET 5000"
        ).fetchone()
        newest: Any = conn.execute("SELECT max(created_at) FROM mcp_tasks").fetchone()
        some: Any = conn.execute(
            "SELECT job_id FROM mcp_tasks ORDER BY created_at LIMIT 1 OFFSET 12345"
        ).fetchone()
    since = (newest[0] - (newest[0] - middle[0]) * 2).isoformat()
    finished = {"sort": "finished"}
    return {
        "first page": {},
        "page 101 (cursor)": {"before": f"{middle[0].isoformat()}~{middle[1]}"},
        "status=working": {"status": "working"},
        "status=failed": {"status": "failed"},
        "status=errored": {"status": "errored"},
        "status=stopping": {"status": "stopping"},
        "status=suspended": {"status": "suspended"},
        "owner": {"owner": "token:user7"},
        "owner+status=failed": {"owner": "token:user7", "status": "failed"},
        "tool": {"tool": "tool_3"},
        "queue=gpu": {"queue": "gpu"},
        "time range": {"since": since},
        "job-id prefix, 2 chars": {"job": some[0][:2]},
        "job-id prefix, 3 chars": {"job": some[0][:3]},
        "job-id prefix, 4 chars": {"job": some[0][:4]},
        "job-id prefix, 8 chars": {"job": some[0][:8]},
        "whole job id (index probe)": {"job": some[0]},
        "sort: oldest first": {"order": "oldest"},
        "sort: finished, newest": finished,
        "sort: finished, oldest": {**finished, "order": "oldest"},
        "sort: finished, page 101 (cursor)": {
            **finished,
            "before": f"finished~{done[0].isoformat()}~{done[1]}",
        },
        "sort: finished + owner": {**finished, "owner": "token:user7"},
        "sort: finished + status=failed": {**finished, "status": "failed"},
        "sort: finished + tool": {**finished, "tool": "tool_3"},
        "sort: finished + status=working (none)": {**finished, "status": "working"},
    }


def _plan(dsn: str, params: dict[str, str]) -> str:
    sql, values = listing.parse(params).statement(51, listing.oldest(params))
    with psycopg.connect(dsn) as conn:
        cursor = psycopg.ClientCursor(conn)
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, values)
        row: Any = cursor.fetchone()
    node = row[0][0]["Plan"]
    while node["Node Type"] in ("Limit", "Incremental Sort", "Sort", "Result") and node.get("Plans"):
        node = node["Plans"][0]
    return f"{node['Node Type']} {node.get('Index Name', '')}".strip()


async def _measure(dsn: str, runs: int) -> None:
    store = ApiStore(Settings(database_url=dsn, db_pool_min=1, db_pool_max=2))
    await store.open()
    try:
        print("| filter | rows | query p50 ms | query p95 ms | page (query + render) p50 ms | plan |")
        print("|---|---|---|---|---|---|")
        for name, params in _cases(dsn).items():
            where, oldest = listing.parse(params), listing.oldest(params)
            query_ms: list[float] = []
            page_ms: list[float] = []
            count = 0
            for _ in range(runs):
                started = time.perf_counter()
                page = await store.console_tasks(where, 50, oldest=oldest)
                queried = time.perf_counter()
                render(
                    "tasks.html", prefix="/console", admin=_Admin(), rows=page.rows, params=params,
                    statuses=listing.STATUSES, older=None, newest=None, sort=where.sort,
                    sorts=listing.sort_links(params), oldest=oldest, follow="", bulk_fields=listing.FILTERS,
                )  # fmt: skip
                done = time.perf_counter()
                query_ms.append((queried - started) * 1000)
                page_ms.append((done - started) * 1000)
                count = len(page.rows)
            p95 = statistics.quantiles(query_ms, n=20)[-1]
            print(
                f"| {name} | {count} | {statistics.median(query_ms):.2f} | {p95:.2f} | "
                f"{statistics.median(page_ms):.2f} | {_plan(dsn, params)} |"
            )
        await _overview(store, runs)
    finally:
        await store.close()


async def _overview(store: ApiStore, runs: int) -> None:
    """The overview page: its store call (seven statements) and its render."""
    query_ms: list[float] = []
    page_ms: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        sections = await store.console_overview(default_limit=1000)
        queried = time.perf_counter()
        render("overview.html", prefix="/console", admin=_Admin(), **sections)
        done = time.perf_counter()
        query_ms.append((queried - started) * 1000)
        page_ms.append((done - started) * 1000)
    p95 = statistics.quantiles(query_ms, n=20)[-1]
    print(
        f"| overview | - | {statistics.median(query_ms):.2f} | {p95:.2f} |"
        f" {statistics.median(page_ms):.2f} | - |"
    )


class _Admin:
    actor = "admin:bench"
    csrf = "x"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    name = f"mcpt_console_bench_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name)
    try:
        settings = Settings(database_url=dsn)
        migrate.upgrade(settings, "0023")
        started = time.perf_counter()
        fill(dsn, args.rows, uuid_jobs=True)
        with psycopg.connect(dsn, autocommit=True) as conn:  # a few cancelled while running
            conn.execute(STOPPING)
        with psycopg.connect(dsn) as conn:
            size: Any = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('mcp_tasks'))").fetchone()
        print(f"{args.rows} rows inserted in {time.perf_counter() - started:.1f} s (mcp_tasks: {size[0]})")
        started = time.perf_counter()
        migrate.upgrade(settings)  # 0024's two indexes, built CONCURRENTLY over the filled table
        print(f"migration 0024 (its concurrent index builds) took {time.perf_counter() - started:.1f} s\n")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE mcp_tasks")
        asyncio.run(_measure(dsn, args.runs))
    finally:
        support.drop_database(name)
    print(json.dumps({"rows": args.rows, "runs": args.runs}))


if __name__ == "__main__":
    main()
