"""The bulk actions' store calls on real Postgres: what cancel and retry may act on, the dry run's
bounded count, and the rows acted on (newest first, at most the limit)."""

from __future__ import annotations

import psycopg

from mcp_celery_tasks.store import ApiStore
from mcp_celery_tasks.store.console_calls import TaskFilter
from tests.console_rows import fill


def _expected(db_url: str, action: str) -> list[str]:
    """The rows an action may act on, from the rows' fields in Python (not the store's SQL)."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT job_id, status, started_at, finished_at, error_kind FROM mcp_tasks"
            " ORDER BY created_at DESC, job_id DESC"
        ).fetchall()
    if action == "cancel":
        return [job for job, status, *_ in rows if status in ("working", "input_required")]
    return [
        job
        for job, status, started, finished, error_kind in rows
        if status == "failed"
        or (status == "cancelled" and (finished is not None or started is None))
        or (status == "completed" and error_kind is not None)
    ]


async def test_bulk_actions_find_exactly_the_tasks_they_may_act_on(api: ApiStore, db_url: str) -> None:
    fill(db_url, 600, owners=3, active=7)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Two cancelled tasks still stopping (their worker has not finished): no retry yet.
        conn.execute(
            "UPDATE mcp_tasks SET finished_at = NULL WHERE job_id IN"
            " (SELECT job_id FROM mcp_tasks WHERE status = 'cancelled' ORDER BY job_id LIMIT 2)"
        )
    retryable, cancellable = _expected(db_url, "retry"), _expected(db_url, "cancel")
    assert len(retryable) > 5 and len(cancellable) == 7
    everything = TaskFilter()
    assert await api.console_bulk_count(everything, "retry", 10_000) == len(retryable)
    assert await api.console_bulk_count(everything, "cancel", 10_000) == 7
    assert await api.console_bulk_count(everything, "retry", 3) == 3  # bounded
    rows = await api.console_bulk_rows(everything, "retry", 4)
    assert [row["job_id"] for row in rows] == retryable[:4]
    assert all(row["arguments"] is not None and row["task_id"] for row in rows)
    with psycopg.connect(db_url) as conn:
        owned = {row[0] for row in conn.execute("SELECT job_id FROM mcp_tasks WHERE owner = 'token:user1'")}
    narrowed = await api.console_bulk_rows(TaskFilter(owner="token:user1"), "retry", 10_000)
    assert [row["job_id"] for row in narrowed] == [job for job in retryable if job in owned]


async def test_the_list_pages_oldest_first_by_the_same_keyset(api: ApiStore, db_url: str) -> None:
    from mcp_celery_tasks.console import listing

    fill(db_url, 120, owners=2, active=3)
    with psycopg.connect(db_url) as conn:
        expected = [
            row[0]
            for row in conn.execute(
                "SELECT job_id FROM mcp_tasks WHERE owner = 'token:user0' ORDER BY created_at, job_id"
            )
        ]
    seen: list[str] = []
    params = {"owner": "token:user0", "order": "oldest"}
    while True:
        page = await api.console_tasks(listing.parse(params), 7, oldest=listing.oldest(params))
        seen += [str(row["job_id"]) for row in page.rows]
        if not page.more:
            break
        params = {**params, "after": listing.cursor(page.rows[-1])}
    assert seen == expected  # ties on created_at across page ends: none skipped, none twice
