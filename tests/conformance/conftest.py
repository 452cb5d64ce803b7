"""The conformance suite gets a stack of its own: its MRTR scenarios leave many rounds
unanswered on purpose, and each such synchronous job holds a worker slot until its question
times out. Here that is 5 s (not 120), with three slots, so later scenarios never queue behind
abandoned rounds; the shared e2e stack keeps the defaults."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import support
from tests.conftest import SUFFIX


@pytest.fixture(scope="module")
def stack(template_db: str) -> Iterator[support.Stack]:
    name = f"mcpt_{SUFFIX}_conformance"
    dsn = support.create_database(name, template=template_db)
    try:
        with support.running_stack(
            "conformance",
            dsn,
            support.REDIS_URL,
            f"{SUFFIX}c",
            concurrency=3,
            MCP_TASKS_SYNC_INPUT_TIMEOUT_SECONDS="5",
            # Scenarios leave jobs running; at teardown there is nothing to hand back gracefully.
            MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS="1",
        ) as live:
            yield live
    finally:
        support.drop_database(name)
