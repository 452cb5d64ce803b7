"""Fixtures shared by the store-level integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore

Db = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    """A raw autocommit connection for moving clocks and reading columns the store hides."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def store_settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, tool_modules=["workers"])


@pytest.fixture
async def api(store_settings: Settings) -> AsyncIterator[ApiStore]:
    """The API's store on the test database (a module's own ``api`` fixture takes precedence)."""
    store = ApiStore(store_settings)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def store(store_settings: Settings) -> Iterator[WorkerStore]:
    """A worker's store on the test database (a module's own ``store`` fixture takes precedence)."""
    worker_store = WorkerStore(store_settings)
    yield worker_store
    worker_store.close()
