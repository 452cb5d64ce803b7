"""Services over in-memory doubles: the protocol layer and the task service without Postgres or a
broker (the e2e tests run the same paths on real ones)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from mcp_celery_tasks.protocol.sealing import Sealer
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore
from mcp_celery_tasks.tasks.events import TaskEvents
from mcp_celery_tasks.tasks.service import TaskService
from tests.memory_api import MemoryApiStore, RecordingPublisher


@pytest.fixture
def memory() -> MemoryApiStore:
    return MemoryApiStore()


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
async def services(memory: MemoryApiStore, publisher: RecordingPublisher) -> AsyncIterator[Services]:
    settings = Settings(max_sync_wait_seconds=5.0)
    store = cast(ApiStore, memory)
    events = TaskEvents(store, poll_s=0.05)
    await events.start()
    tasks = TaskService(settings, store, events, publisher, "mcp.default")
    yield Services(settings, tasks, store, events, publisher, Sealer([]), "9.9.9")
    await events.stop()


def meta(extension: bool = True, **capabilities: Any) -> dict[str, Any]:
    caps: dict[str, Any] = dict(capabilities)
    if extension:
        caps.setdefault("extensions", {})["io.modelcontextprotocol/tasks"] = {}
    return {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
    }


# ---- the watchdog's clock and process table (test_watchdog, test_fence) --------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr("mcp_celery_tasks.worker.watchdog.time.monotonic", lambda: now[0])
    return now


@pytest.fixture
def procs(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[str, int]]:
    """pid -> (state letter, RSS bytes)."""
    table: dict[int, tuple[str, int]] = {}
    monkeypatch.setattr(
        "mcp_celery_tasks.worker.watchdog.process_state", lambda pid: table[pid][0] if pid in table else None
    )
    monkeypatch.setattr(
        "mcp_celery_tasks.worker.watchdog.rss_bytes", lambda pid: table[pid][1] if pid in table else 0
    )
    return table
