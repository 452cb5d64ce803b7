"""Our task shapes against the spec's own schema.

``mcp_types`` ships the 2025-11-25 schema as generated models (``Task``, ``CreateTaskResult``,
``GetTaskResult``: SEP-1686), so what our 2025-11-25 handlers send is validated by those models
(strict: required fields, types, status values) and held to the keys of their JSON Schema.

SEP-2663's shapes (the 2026-07-28 tasks extension: flat ``CreateTaskResult``, ``DetailedTask``)
are in neither ``mcp_types._v2026_07_28`` nor a conformance install in this checkout. Their keys
are written out below from the extension's schema (modelcontextprotocol/ext-tasks,
``schema/draft/schema.ts``: ``Task``, the ``DetailedTask`` variants, ``CreateTaskResult``,
``GetTaskResult``, ``CancelTaskResult``) and what we send is held to them: every required key
present, no key the schema does not name. The e2e and conformance suites pin the values.
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
from mcp_celery_tasks.protocol import v2026_07_28 as modern
from mcp_celery_tasks.store import InputRecord, TaskRecord
from mcp_celery_tasks.tasks.service import TaskView
from mcp_celery_tasks.wire import EmptyAck, dump

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
    request_digest=None,
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


# ---- 2026-07-28 (SEP-2663) ------------------------------------------------------------------------

TASK_REQUIRED = {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
"""SEP-2663 ``Task``: ``ttlMs`` is required (null for unlimited)."""
TASK_OPTIONAL = {"statusMessage", "pollIntervalMs"}
RESULT_REQUIRED = {"resultType"}
RESULT_OPTIONAL = {"_meta"}
VARIANT_REQUIRED: dict[str, set[str]] = {
    "working": set(),
    "input_required": {"inputRequests"},
    "completed": {"result"},
    "failed": {"error"},
    "cancelled": set(),
}
"""The ``DetailedTask`` variants: what each status adds (and requires)."""

ASKED = InputRecord(
    key="confirm",
    method="elicitation/create",
    params={"message": "Go?", "requestedSchema": {"type": "object", "properties": {}}},
    params_hash="h",
    response=None,
    superseded=False,
)


def _held(shape: Mapping[str, object], required: set[str], optional: set[str]) -> None:
    assert required <= set(shape), required - set(shape)
    assert set(shape) <= required | optional, set(shape) - (required | optional)


def _record(status: Status, fields: dict[str, Any]) -> TaskRecord:
    return dataclasses.replace(
        RECORD,
        status=status,
        expires_at=None if status in {"working", "input_required"} else CREATED + timedelta(minutes=1),
        **fields,
    )


@pytest.mark.parametrize(("status", "fields"), STATES)
def test_a_2026_created_task_matches_the_extension_create_task_result(
    status: Status, fields: dict[str, Any]
) -> None:
    shown = dump(modern.created(_record(status, fields)))
    assert shown["resultType"] == "task"
    _held(shown, TASK_REQUIRED | RESULT_REQUIRED, TASK_OPTIONAL | RESULT_OPTIONAL)


@pytest.mark.parametrize(("status", "fields"), STATES)
def test_a_2026_task_matches_the_extension_detailed_task_variant(
    status: Status, fields: dict[str, Any]
) -> None:
    inputs = (ASKED,) if status == "input_required" else ()
    shown = dump(modern.detailed(TaskView(_record(status, fields), inputs)))
    assert shown["resultType"] == "complete" and shown["status"] == status
    variant = VARIANT_REQUIRED[status]
    _held(shown, TASK_REQUIRED | RESULT_REQUIRED | variant, TASK_OPTIONAL | RESULT_OPTIONAL)


def test_the_2026_acknowledgements_match_the_extension_results() -> None:
    _held(dump(EmptyAck()), RESULT_REQUIRED, RESULT_OPTIONAL)  # tasks/update and tasks/cancel


def test_the_2026_parity_check_refuses_a_2025_field_name() -> None:
    shown: dict[str, object] = dict(dump(modern.detailed(TaskView(RECORD))))
    shown["ttl"] = shown.pop("ttlMs")  # SEP-1686's name: not the 2026-07-28 wire
    with pytest.raises(AssertionError):
        _held(shown, TASK_REQUIRED | RESULT_REQUIRED, TASK_OPTIONAL | RESULT_OPTIONAL)
