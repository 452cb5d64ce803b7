"""Our task shapes against the spec's own schema, where an installed package ships one.

``mcp_types`` ships the 2025-11-25 schema as generated models (``Task``, ``CreateTaskResult``,
``GetTaskResult``: SEP-1686), so what our 2025-11-25 handlers send is validated by those models
(strict: required fields, types, status values) and held to the keys of their JSON Schema.
SEP-2663's shapes (the 2026-07-28 tasks extension: flat ``CreateTaskResult``, ``DetailedTask``)
are in neither ``mcp_types._v2026_07_28`` nor a conformance install in this checkout; the e2e
and conformance suites pin those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp_types import _v2025_11_25 as spec
from pydantic import ValidationError

from mcp_celery_tasks.lifecycle import Status
from mcp_celery_tasks.protocol import v2025_11_25 as legacy
from mcp_celery_tasks.store import TaskRecord

CREATED = datetime(2026, 7, 28, 12, 0, tzinfo=UTC)

RECORD = TaskRecord(
    task_id="tsk_parity",
    job_id="job",
    owner="anon",
    tool_name="t",
    status="working",
    status_message=None,
    result=None,
    error=None,
    created_at=CREATED,
    last_updated_at=CREATED + timedelta(seconds=1),
    retention_ms=60_000,
    poll_interval_ms=500,
    expires_at=None,
    queue="q",
    inbox=None,
    dispatched_at=CREATED,
    progress=None,
    progress_total=None,
    log_seq=0,
    db_now=CREATED + timedelta(seconds=2),
)

STATES: list[tuple[Status, dict[str, Any]]] = [
    ("working", {}),
    ("input_required", {"status_message": "asks"}),
    ("completed", {"result": {"content": [], "isError": False}}),
    ("completed", {"result": {"content": [{"type": "text", "text": "bad"}], "isError": True}}),
    ("failed", {"error": {"code": -32603, "message": "boom"}}),
    ("cancelled", {"status_message": "cancelled by the client"}),
]


def _schema(model: type[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema(by_alias=True)
    return schema


def _check(shape: Mapping[str, object], model: type[Any]) -> None:
    """Valid under the spec model, and no key its JSON Schema does not name (the generated
    models ignore extras, so validation alone would let a stray field through)."""
    schema = _schema(model)
    model.model_validate(shape, strict=True)
    assert set(shape) <= set(schema["properties"]), set(shape) - set(schema["properties"])


@pytest.mark.parametrize(("status", "fields"), STATES)
def test_a_2025_task_matches_the_spec_task_schema(status: Status, fields: dict[str, Any]) -> None:
    record = dataclasses.replace(
        RECORD,
        status=status,
        expires_at=None if status in {"working", "input_required"} else CREATED + timedelta(minutes=1),
        **fields,
    )
    shown = legacy.task(record)
    _check(shown, spec.Task)
    _check(shown, spec.GetTaskResult)  # tasks/get answers the Task itself (Result & Task)
    created = {"task": shown}
    _check(created, spec.CreateTaskResult)


def test_the_parity_check_refuses_a_2026_field_name() -> None:
    shown: dict[str, object] = dict(legacy.task(RECORD))
    shown["ttlMs"] = shown.pop("ttl")  # SEP-2663's name: not the 2025-11-25 wire
    with pytest.raises((AssertionError, ValidationError)):
        _check(shown, spec.Task)
