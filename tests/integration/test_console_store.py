"""The console's store calls on real Postgres: keyset pages that never skip or repeat a row under
ties, filters, the audit, and plans that read a page through an index instead of sorting the table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg
import pytest

from mcp_celery_tasks.console import listing
from mcp_celery_tasks.store import ApiStore
from mcp_celery_tasks.store.console_calls import TaskFilter
from tests.console_rows import fill


async def _all_pages(api: ApiStore, where: TaskFilter, size: int) -> list[str]:
    seen: list[str] = []
    while True:
        page = await api.console_tasks(where, size)
        seen += [str(row["job_id"]) for row in page.rows]
        if not page.more:
            return seen
        cursor = listing.cursor(page.rows[-1])
        where = listing.parse({"before": cursor, **_fields(where)})


def _fields(where: TaskFilter) -> dict[str, str]:
    return {name: str(getattr(where, name)) for name in ("status", "owner") if getattr(where, name)}


async def test_pages_follow_each_other_without_a_gap_or_a_repeat_under_equal_times(
    api: ApiStore, db_url: str
) -> None:
    fill(db_url, 300, owners=4, active=10)
    with psycopg.connect(db_url) as conn:
        expected = [
            row[0]
            for row in conn.execute(
                "SELECT job_id FROM mcp_tasks WHERE owner = 'token:user1'"
                " ORDER BY created_at DESC, job_id DESC"
            )
        ]
    where = TaskFilter(owner="token:user1")
    assert await _all_pages(api, where, 7) == expected  # 75 rows in 11 pages, ties across page ends
    working = await _all_pages(api, TaskFilter(status="working"), 4)
    assert len(working) == 10


async def test_each_filter_narrows_the_list(api: ApiStore, db_url: str) -> None:
    fill(db_url, 200, owners=3, active=5)
    page = await api.console_tasks(TaskFilter(queue="gpu", status="completed", tool="tool_0"), 500)
    assert page.rows and all(
        (row["queue"], row["status"], row["tool"]) == ("gpu", "completed", "tool_0") for row in page.rows
    )
    errored = await api.console_tasks(TaskFilter(status="errored"), 500)
    assert errored.rows and {row["status"] for row in errored.rows} == {"errored"}
    prefix = await api.console_tasks(TaskFilter(job="bulk-job-a-0000010"), 500)
    assert sorted(str(row["job_id"]) for row in prefix.rows) == [
        f"bulk-job-a-{n:08d}" for n in range(100, 110)
    ]
    newest = page.rows[0]["created_at"]
    assert isinstance(newest, datetime)
    since = await api.console_tasks(TaskFilter(since=newest), 500)
    assert since.rows and all(_created(row) >= newest for row in since.rows)


def _created(row: Mapping[str, object]) -> datetime:
    created = row["created_at"]
    assert isinstance(created, datetime)
    return created


async def test_a_console_action_is_audited_with_its_actor_and_count(api: ApiStore) -> None:
    await api.record_console_action("admin:ops", "cancel", "job-1", 1, {"reason": "<b>runaway</b>"})
    actions, limits = await api.console_audit()
    assert [(a["actor"], a["action"], a["target"], a["affected"]) for a in actions] == [
        ("admin:ops", "cancel", "job-1", 1)
    ]
    assert actions[0]["detail"] == {"reason": "<b>runaway</b>"} and limits == []


def _plan(dsn: str, where: TaskFilter, size: int = 51) -> str:
    sql, params = where.statement(size)
    with psycopg.connect(dsn) as conn:
        cursor = psycopg.ClientCursor(conn)
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        row: Any = cursor.fetchone()
    return json.dumps(row[0])


@pytest.mark.timeout(120)
def test_a_page_is_read_through_an_index_not_by_sorting_the_table(db_url: str) -> None:
    fill(db_url, 60_000, owners=200, active=100)
    first = _plan(db_url, TaskFilter())
    assert "ix_mcp_tasks_created_at_job_id" in first and '"Seq Scan"' not in first
    owned = _plan(db_url, TaskFilter(owner="token:user7"))
    assert "ix_mcp_tasks_owner_created_at" in owned and '"Seq Scan"' not in owned
    with psycopg.connect(db_url) as conn:
        last: Any = conn.execute(
            "SELECT created_at, job_id FROM mcp_tasks ORDER BY created_at LIMIT 1 OFFSET 30000"
        ).fetchone()
    later = _plan(db_url, TaskFilter(before=(last[0], last[1])))
    assert "ix_mcp_tasks_created_at_job_id" in later and '"Seq Scan"' not in later


# ---- sorts and the job-id prefix (migration 0024) -----------------------------------------------


async def _pages_of(api: ApiStore, params: dict[str, str], size: int) -> list[str]:
    """Every page of the list a URL names, each through the cursor the page would link to."""
    seen: list[str] = []
    oldest = listing.oldest(params)
    while True:
        where = listing.parse(params)
        page = await api.console_tasks(where, size, oldest=oldest)
        seen += [str(row["job_id"]) for row in page.rows]
        if not page.more:
            return seen
        params = {**params, ("after" if oldest else "before"): listing.cursor(page.rows[-1], where.sort)}


@pytest.mark.parametrize("order", ["DESC", "ASC"])
async def test_pages_by_finish_time_follow_each_other_without_a_gap_or_a_repeat(
    api: ApiStore, db_url: str, order: str
) -> None:
    fill(db_url, 300, owners=4, active=10)  # every finish time shared by three rows
    with psycopg.connect(db_url) as conn:
        expected = [
            row[0]
            for row in conn.execute(
                "SELECT job_id FROM mcp_tasks WHERE owner = 'token:user2' AND finished_at IS NOT NULL"
                f" ORDER BY finished_at {order}, job_id {order}"
            )
        ]
    params = {"owner": "token:user2", "sort": "finished", "order": "oldest" if order == "ASC" else ""}
    seen = await _pages_of(api, params, 7)
    assert len(expected) > 60 and seen == expected  # ties across page ends, the working rows left out


async def test_oldest_first_by_creation_pages_forwards_through_every_row(api: ApiStore, db_url: str) -> None:
    fill(db_url, 120, owners=2, active=4)
    with psycopg.connect(db_url) as conn:
        expected = [
            row[0] for row in conn.execute("SELECT job_id FROM mcp_tasks ORDER BY created_at, job_id")
        ]
    assert await _pages_of(api, {"order": "oldest"}, 9) == expected


@pytest.mark.parametrize(
    ("params", "refusal"),
    [
        ({"sort": "last_updated_at"}, "sort: one of created, finished"),
        ({"sort": "created; DROP TABLE mcp_tasks"}, "sort: one of"),
        ({"sort": "finished", "before": "2026-12-03T10:00:00+00:00~bulk-job-a-1"}, "another sort"),
        ({"before": "finished~2026-12-03T10:00:00+00:00~bulk-job-a-1"}, "another sort"),
        ({"sort": "finished", "before": "finished~yesterday~bulk-job-a-1"}, "not a date"),
        ({"before": "no-cursor-here"}, "not a page cursor"),
        ({"sort": "finished", "after": "finished~2026-12-03T10:00~"}, "not a page cursor"),
        ({"owner": "token:\x00alice"}, "NUL"),
        ({"job": "bulk\x00"}, "NUL"),
    ],
)
def test_a_hostile_sort_or_cursor_is_refused_by_name(params: dict[str, str], refusal: str) -> None:
    with pytest.raises(listing.BadFilter, match=refusal):
        listing.parse(params)


@pytest.mark.timeout(120)
def test_a_job_id_prefix_and_the_finished_sort_read_their_own_indexes(db_url: str) -> None:
    fill(db_url, 60_000, owners=200, active=100)
    prefix = _plan(db_url, TaskFilter(job="bulk-job-a-000123"))
    assert "ix_mcp_tasks_job_id" in prefix and '"Seq Scan"' not in prefix
    finished = _plan(db_url, TaskFilter(sort="finished"))
    assert "ix_mcp_tasks_finished_at_job_id" in finished and '"Sort"' not in finished


async def test_a_job_id_prefix_lists_exactly_the_jobs_under_it(api: ApiStore, db_url: str) -> None:
    fill(db_url, 2_500, owners=3, active=5)
    page = await api.console_tasks(TaskFilter(job="bulk-job-a-0000012"), 500)
    assert [row["job_id"] for row in page.rows] == [f"bulk-job-a-{n:08d}" for n in range(129, 119, -1)]
    none = await api.console_tasks(TaskFilter(job="bulk-job-a-%"), 500)  # no LIKE wildcard in a prefix
    assert none.rows == []
