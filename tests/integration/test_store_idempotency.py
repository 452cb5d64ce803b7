"""The store's idempotent create against real Postgres: the insert yields to the row that won
the unique index on (owner, idempotency_key), at any concurrency, and an expired row frees its key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore
from tests.integration.conftest import Db
from tests.integration.test_store import OWNER, STRANGER, new_task


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiStore]:
    store = ApiStore(settings)
    await store.open()
    yield store
    await store.close()


def keyed_rows(db: Db, key: str) -> list[dict[str, Any]]:
    return db.execute(
        "SELECT task_id, owner FROM mcp_tasks WHERE idempotency_key = %s ORDER BY owner", (key,)
    ).fetchall()


async def test_fifty_concurrent_creates_with_one_key_insert_one_row(api: ApiStore, db: Db) -> None:
    tasks = [new_task(idempotency_key="k", request_digest="d") for _ in range(50)]
    records = await asyncio.gather(*(api.create_task(t) for t in tasks))
    winners = {r.task_id for r in records if r is not None}
    assert len(winners) == 1 and all(r is not None for r in records)
    assert [row["task_id"] for row in keyed_rows(db, "k")] == list(winners)
    assert winners <= {t.task_id for t in tasks}


async def test_one_key_of_two_owners_makes_two_rows(api: ApiStore, db: Db) -> None:
    mine = await api.create_task(new_task(idempotency_key="shared"))
    theirs = await api.create_task(new_task(owner=STRANGER, idempotency_key="shared"))
    assert mine is not None and theirs is not None and mine.task_id != theirs.task_id
    found_mine, found_theirs = (
        await api.task_by_key(OWNER, "shared"),
        await api.task_by_key(STRANGER, "shared"),
    )
    assert found_mine is not None and found_mine.task_id == mine.task_id
    assert found_theirs is not None and found_theirs.task_id == theirs.task_id
    assert await api.task_by_key("token:nobody", "shared") is None
    assert sorted(row["owner"] for row in keyed_rows(db, "shared")) == sorted([OWNER, STRANGER])


async def test_an_expired_row_gives_its_key_to_the_next_create(api: ApiStore, db: Db) -> None:
    first = await api.create_task(new_task(idempotency_key="e"))
    assert first is not None
    db.execute(
        "UPDATE mcp_tasks SET status = 'completed', expires_at = now() - interval '1 second' "
        "WHERE task_id = %s",
        (first.task_id,),
    )
    assert await api.task_by_key(OWNER, "e") is None
    second_task = new_task(idempotency_key="e")
    second = await api.create_task(second_task)
    assert second is not None and second.task_id == second_task.task_id
    rows = db.execute("SELECT task_id, idempotency_key FROM mcp_tasks ORDER BY created_at").fetchall()
    assert rows == [
        {"task_id": first.task_id, "idempotency_key": None},
        {"task_id": second.task_id, "idempotency_key": "e"},
    ]


async def test_a_row_without_a_key_never_conflicts(api: ApiStore, db: Db) -> None:
    for _ in range(3):
        assert await api.create_task(new_task()) is not None
    assert db.execute("SELECT count(*) AS n FROM mcp_tasks").fetchone() == {"n": 3}


def test_the_unique_index_refuses_a_second_live_row_for_one_owner_and_key(db: Db) -> None:
    """The invariant is the database's, not the store's code path: a raw duplicate fails."""
    db.execute(
        "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms, "
        "poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, idempotency_key) "
        "VALUES ('a', 'ja', 'o', 't', '{}', 'working', 1, 1, 'q', 1, 'v', '{}', 'dup')"
    )
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(
            "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms, "
            "poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, "
            "idempotency_key) VALUES ('b', 'jb', 'o', 't', '{}', 'working', 1, 1, 'q', 1, 'v', '{}', 'dup')"
        )
