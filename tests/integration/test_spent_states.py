"""Spent MRTR request states in Postgres (issue 33): a state is spent once across every API
replica, the same request's own retried INSERT is not a replay, the collector forgets expired
states (only while it holds the GC lock), and only the API and maintenance roles reach the table."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore, queries, session_queries
from tests.integration.conftest import Db
from tests.integration.test_roles import Login, _allowed, _denied, login  # noqa: F401 (fixture)


@pytest.fixture
async def replicas(db_url: str) -> AsyncIterator[tuple[ApiStore, ApiStore]]:
    """Two API stores on one database, as two API replicas hold them."""
    first, second = ApiStore(Settings(database_url=db_url)), ApiStore(Settings(database_url=db_url))
    await first.open()
    await second.open()
    yield first, second
    await first.close()
    await second.close()


@pytest.fixture
def store(db_url: str) -> Iterator[WorkerStore]:
    worker_store = WorkerStore(Settings(database_url=db_url))
    yield worker_store
    worker_store.close()


def digest() -> str:
    return uuid.uuid4().hex


async def test_a_state_spent_on_one_replica_is_refused_on_the_other(
    replicas: tuple[ApiStore, ApiStore],
) -> None:
    first, second = replicas
    state, expires = digest(), time.time() + 60
    assert await first.spend_request_state(state, expires) is True
    assert await second.spend_request_state(state, expires) is False
    assert await first.spend_request_state(state, expires) is False
    assert await second.spend_request_state(digest(), expires) is True  # another state is its own


def test_the_same_requests_retried_insert_is_not_a_replay(db: Db) -> None:
    # ``ApiStore._rows`` sends a statement again when the connection broke after it went out:
    # the first INSERT may have committed, and the retry must still count as this spend.
    params = {"digest": digest(), "spent_by": "request-a", "expires": time.time() + 60}
    spend = session_queries.SPEND_REQUEST_STATE
    assert db.execute(spend, params).fetchall() == [{"digest": params["digest"]}]
    assert db.execute(spend, params).fetchall() == [{"digest": params["digest"]}]
    assert db.execute(spend, {**params, "spent_by": "request-b"}).fetchall() == []
    owner = db.execute("SELECT spent_by FROM mcp_spent_request_states").fetchone()
    assert owner == {"spent_by": "request-a"}


async def test_collect_garbage_forgets_expired_states_and_keeps_live_ones(
    replicas: tuple[ApiStore, ApiStore], store: WorkerStore, db: Db
) -> None:
    api, _ = replicas
    expired = [digest() for _ in range(5)]
    for state in expired:
        assert await api.spend_request_state(state, time.time() - 1)
    live = digest()
    assert await api.spend_request_state(live, time.time() + 60)

    gc.collect_garbage(store, batch=2, max_batches=10)  # in bounded batches, as the tasks

    left = [row["digest"] for row in db.execute("SELECT digest FROM mcp_spent_request_states")]
    assert left == [live]
    # Still spent: a replay within its lifetime is refused after the collector ran.
    assert await api.spend_request_state(live, time.time() + 60) is False


async def test_collect_garbage_leaves_spent_states_while_another_collector_holds_the_lock(
    replicas: tuple[ApiStore, ApiStore], store: WorkerStore, db_url: str, db: Db
) -> None:
    api, _ = replicas
    assert await api.spend_request_state(digest(), time.time() - 1)
    with psycopg.connect(db_url) as other, other.transaction():
        other.execute(queries.TRY_GC_LOCK, {"key": queries.GC_LOCK_KEY})
        assert gc.collect_garbage(store) == 0
        assert db.execute("SELECT count(*) AS n FROM mcp_spent_request_states").fetchone() == {"n": 1}
    gc.collect_garbage(store)
    assert db.execute("SELECT count(*) AS n FROM mcp_spent_request_states").fetchone() == {"n": 0}


async def test_only_the_api_spends_and_only_maintenance_forgets(login: Login, db: Db) -> None:  # noqa: F811
    api_dsn, worker_dsn = login("mcp_tasks_api"), login("mcp_tasks_worker")
    api = ApiStore(Settings(database_url=api_dsn))
    await api.open()
    try:
        assert await api.spend_request_state(digest(), time.time() - 1) is True
    finally:
        await api.close()
    _denied(api_dsn, "DELETE FROM mcp_spent_request_states")
    _denied(worker_dsn, "SELECT count(*) FROM mcp_spent_request_states")
    _denied(worker_dsn, "DELETE FROM mcp_spent_request_states")
    _allowed(login("mcp_tasks_maintenance"), "DELETE FROM mcp_spent_request_states WHERE false")
    maintenance = WorkerStore(Settings(database_url=login("mcp_tasks_maintenance")))
    try:
        gc.collect_garbage(maintenance)
    finally:
        maintenance.close()
    assert db.execute("SELECT count(*) AS n FROM mcp_spent_request_states").fetchone() == {"n": 0}
