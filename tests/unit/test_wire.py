"""Wire shapes: serialization by alias, timestamps, and what declares the tasks extension."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from mcp_celery_tasks.wire import (
    TASKS_EXTENSION,
    DetailedTaskResult,
    EmptyAck,
    TaskCreated,
    declares_tasks,
    dump,
    iso,
)

ISO_MS_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
STAMP = "2026-07-28T10:00:00.000Z"


def created(**overrides: Any) -> TaskCreated:
    fields: dict[str, Any] = {
        "task_id": "t-1",
        "status": "working",
        "created_at": STAMP,
        "last_updated_at": STAMP,
        "ttl_ms": None,
    }
    fields.update(overrides)
    return TaskCreated(**fields)


def test_dump_keeps_a_null_ttl() -> None:
    data = dump(created(ttl_ms=None))
    assert "ttlMs" in data
    assert data["ttlMs"] is None


def test_dump_drops_other_nulls() -> None:
    data = dump(created())
    assert "statusMessage" not in data
    assert "pollIntervalMs" not in data
    assert "_meta" not in data


def test_dump_uses_the_spec_names() -> None:
    data = dump(created(ttl_ms=60_000, poll_interval_ms=500, status_message="queued"))
    assert data == {
        "taskId": "t-1",
        "status": "working",
        "statusMessage": "queued",
        "createdAt": STAMP,
        "lastUpdatedAt": STAMP,
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
        "resultType": "task",
    }


def test_dump_of_a_detailed_task_keeps_null_ttl_and_its_result() -> None:
    result = {"content": [], "isError": False}
    data = dump(
        DetailedTaskResult(
            task_id="t-1",
            status="completed",
            created_at=STAMP,
            last_updated_at=STAMP,
            ttl_ms=None,
            result=result,
        )
    )
    assert data["ttlMs"] is None
    assert data["resultType"] == "complete"
    assert data["result"] == result
    assert "error" not in data and "inputRequests" not in data


def test_empty_ack_has_no_ttl() -> None:
    assert dump(EmptyAck()) == {"resultType": "complete"}


def test_iso_has_millisecond_precision_and_a_z() -> None:
    stamp = iso(datetime(2026, 7, 28, 9, 5, 3, 123456, tzinfo=UTC))
    assert ISO_MS_Z.match(stamp)
    assert stamp == "2026-07-28T09:05:03.123Z"


def test_iso_pads_whole_seconds_to_three_digits() -> None:
    assert iso(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000Z"


def test_iso_converts_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    stamp = iso(datetime(2026, 1, 1, 1, 30, 0, 5000, tzinfo=plus_two))
    assert ISO_MS_Z.match(stamp)
    assert stamp == "2025-12-31T23:30:00.005Z"


def test_declares_tasks_with_the_extension_key() -> None:
    assert declares_tasks({"extensions": {TASKS_EXTENSION: {}}})
    assert declares_tasks({"extensions": {"other/ext": {}, TASKS_EXTENSION: {"x": 1}}, "sampling": {}})


@pytest.mark.parametrize(
    "capabilities",
    [
        None,
        {},
        {"tasks": {"requests": {"tools": {"call": {}}}}},
        {"tasks": {}, "extensions": {}},
        {"extensions": {"other/ext": {}}},
        {"extensions": [TASKS_EXTENSION]},
        {TASKS_EXTENSION: {}},
    ],
    ids=[
        "none",
        "empty",
        "legacy-tasks-slot",
        "legacy-slot-and-empty-extensions",
        "other-extension",
        "extensions-as-list",
        "key-at-top-level",
    ],
)
def test_does_not_declare_tasks_without_the_extension_key(capabilities: dict[str, Any] | None) -> None:
    assert not declares_tasks(capabilities)
