"""Fixtures shared by the store-level integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

Db = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    """A raw autocommit connection for moving clocks and reading columns the store hides."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn
