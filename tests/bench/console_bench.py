"""Benchmark of the web console's task list at scale (run by hand; pytest never collects this file).

    .venv/bin/python tests/bench/console_bench.py [--rows 1000000] [--runs 20]

In a throwaway database (the machine's Postgres, dropped at the end), inserts ``--rows`` task rows
(``tests.console_rows``: 200 principals, 7 tools, 2 queues, the newest 100 working, about 1 % failed),
then times what the list page's handler does for each filter: the store call (one statement, 51
rows) and the page's render, through the API's own store (``ApiStore``) and template. Prints the
median and p95 of ``--runs`` runs of each, in milliseconds, and each statement's plan root.
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


def _cases(dsn: str) -> dict[str, dict[str, str]]:
    with psycopg.connect(dsn) as conn:
        middle: Any = conn.execute(
            "SELECT created_at, job_id FROM mcp_tasks"
            " ORDER BY created_at DESC, job_id DESC LIMIT 1 OFFSET 5000"
        ).fetchone()
        newest: Any = conn.execute("SELECT max(created_at) FROM mcp_tasks").fetchone()
    since = (newest[0] - (newest[0] - middle[0]) * 2).isoformat()
    return {
        "first page": {},
        "page 101 (cursor)": {"before": f"{middle[0].isoformat()}~{middle[1]}"},
        "status=working": {"status": "working"},
        "status=failed": {"status": "failed"},
        "status=errored": {"status": "errored"},
        "owner": {"owner": "token:user7"},
        "owner+status=failed": {"owner": "token:user7", "status": "failed"},
        "tool": {"tool": "tool_3"},
        "queue=gpu": {"queue": "gpu"},
        "time range": {"since": since},
        "job-id prefix": {"job": "bulk-job-a-0012"},
        "whole job id (index probe)": {"job": "bulk-job-a-00012345-padded-to-36-chars"[:36]},
    }


def _plan(dsn: str, params: dict[str, str]) -> str:
    sql, values = listing.parse(params).statement(51)
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
            where = listing.parse(params)
            query_ms: list[float] = []
            page_ms: list[float] = []
            count = 0
            for _ in range(runs):
                started = time.perf_counter()
                page = await store.console_tasks(where, 50)
                queried = time.perf_counter()
                render(
                    "tasks.html", prefix="/console", admin=_Admin(), rows=page.rows, params=params,
                    statuses=listing.STATUSES, older=None, newest=None,
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
    finally:
        await store.close()


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
        migrate.upgrade(Settings(database_url=dsn))
        started = time.perf_counter()
        fill(dsn, args.rows)
        with psycopg.connect(dsn) as conn:
            size: Any = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('mcp_tasks'))").fetchone()
        print(f"{args.rows} rows inserted in {time.perf_counter() - started:.1f} s (mcp_tasks: {size[0]})\n")
        asyncio.run(_measure(dsn, args.runs))
    finally:
        support.drop_database(name)
    print(json.dumps({"rows": args.rows, "runs": args.runs}))


if __name__ == "__main__":
    main()
