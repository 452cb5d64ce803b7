"""MCP wire shapes for protocol 2026-07-28 and the tasks extension (SEP-2663).

Core models come from ``mcp_types``; its task models are the old SEP-1686 shapes (nested
``task``, ``ttl``, ``tasks/result``), so the SEP-2663 shapes are defined here with names that
say so: ``TaskCreated`` is SEP-2663's ``CreateTaskResult``, ``DetailedTaskResult`` its
``GetTaskResult``. Spec names travel through camelCase aliases.

A field holding open JSON (a tool's arguments or result, ``_meta``, capabilities) is a
``dict[str, object]``: pydantic checks that it is an object and keeps its values as they are
(``object`` validates like ``Any``), and code reading a value narrows it first.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    LOG_LEVEL_META_KEY,
    PROTOCOL_VERSION_META_KEY,
    SERVER_INFO_META_KEY,
    LoggingLevel,
)
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from mcp_celery_tasks.errors import TASKS_EXTENSION
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.lifecycle import Status

__all__ = [
    "ALL_VERSIONS",
    "CLIENT_CAPABILITIES_META_KEY",
    "CLIENT_INFO_META_KEY",
    "IDEMPOTENCY_KEY_META_KEY",
    "LEGACY_VERSIONS",
    "MODERN_VERSION",
    "PLACE_IN_LINE",
    "PROTOCOL_VERSION_META_KEY",
    "SERVER_INFO_META_KEY",
    "TASKS_EXTENSION",
    "TOOL_MODE_META_KEY",
    "CallToolParams",
    "DetailedTaskResult",
    "EmptyAck",
    "InputRequired",
    "LegacyCallToolParams",
    "LegacyListParams",
    "LegacyParams",
    "LegacyReadResourceParams",
    "LegacyTaskParams",
    "ListenParams",
    "MetaParams",
    "PagedParams",
    "ReadResourceParams",
    "RequestMeta",
    "SetLevelParams",
    "TaskCreated",
    "TaskIdParams",
    "TaskUpdateParams",
    "WireModel",
    "declares_tasks",
    "dump",
    "iso",
    "progress_token",
]

MODERN_VERSION = "2026-07-28"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""Served through ``initialize`` and a session (the handshake era)."""
ALL_VERSIONS = (MODERN_VERSION, *LEGACY_VERSIONS)
"""What ``server/discover`` and -32022's ``data.supported`` list: every version this server speaks,
statelessly (2026-07-28) or after ``initialize`` (the others)."""

TOOL_MODE_META_KEY = "io.github.mcp-celery-tasks/taskSupport"
"""A tool's task mode in its ``_meta`` (forbidden / optional / required): 2026-07-28 has no
tool-level task flag (SPEC-CHECKLIST Q-19). Our own prefix: ``io.modelcontextprotocol/`` is
reserved for MCP's keys, and a key's name may not contain a slash (CORE-BASIC ``_meta``)."""

IDEMPOTENCY_KEY_META_KEY = "io.github.mcp-celery-tasks/idempotencyKey"
"""A ``tools/call``'s idempotency key in its ``params._meta`` (SEP-3182's ``idempotencyKey``,
closed without a replacement, under our prefix): a retry with the same key gets the task the
first call made (``tasks.idempotency``)."""

PLACE_IN_LINE = "queued: "
"""How the ``statusMessage`` of a task still in the fair backlog begins (``queued: 12 ahead``);
the terminal client reads it as the server's word, not the tool's."""


class WireModel(BaseModel):
    """Base for our wire models: snake_case in Python, camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class RequestMeta(BaseModel):
    """The per-request ``_meta`` envelope every 2026-07-28 request carries.

    Read by its wire keys only: a client's own ``log_level`` or ``protocol_version`` key is an
    unknown ``_meta`` entry like any other, never one of these fields."""

    model_config = ConfigDict(extra="allow")

    protocol_version: str = Field(alias=PROTOCOL_VERSION_META_KEY)
    client_capabilities: dict[str, object] = Field(alias=CLIENT_CAPABILITIES_META_KEY)
    client_info: dict[str, object] | None = Field(default=None, alias=CLIENT_INFO_META_KEY)
    log_level: LoggingLevel | None = Field(default=None, alias=LOG_LEVEL_META_KEY)
    """The lowest log level the caller wants as ``notifications/message`` on this request; absent,
    the server MUST NOT send any (2026-07-28). A 2025-11-25 session's ``logging/setLevel``."""


class MetaParams(WireModel):
    """Params of a 2026-07-28 request: the ``_meta`` envelope (checked by dispatch), and any
    other field (unknown fields are ignored)."""

    model_config = ConfigDict(extra="allow")
    meta: RequestMeta | None = Field(default=None, alias="_meta")


class PagedParams(MetaParams):
    cursor: str | None = None


class CallToolParams(MetaParams):
    name: str
    arguments: dict[str, object] | None = None
    input_responses: dict[str, object] | None = None
    request_state: str | None = None
    # ``task`` (SEP-1686's opt-in) is deliberately not a field: SEP-2663 says servers MUST
    # ignore it, so it lands in the extras and nothing reads it.


class TaskIdParams(MetaParams):
    task_id: str = Field(min_length=1)


class ReadResourceParams(MetaParams):
    uri: str


class TaskUpdateParams(TaskIdParams):
    input_responses: dict[str, object]


class ListenFilter(WireModel):
    model_config = ConfigDict(extra="allow")
    task_ids: list[str] | None = None


class ListenParams(MetaParams):
    """``subscriptions/listen``: the notifications the caller wants (only task ids are offered)."""

    notifications: ListenFilter | None = None


class LegacyParams(WireModel):
    """Params of a 2025-11-25 request: ``_meta`` is free-form there (``progressToken`` …)."""

    model_config = ConfigDict(extra="allow")
    meta: dict[str, object] | None = Field(default=None, alias="_meta")


class LegacyCallToolParams(LegacyParams):
    name: str
    arguments: dict[str, object] | None = None
    task: dict[str, object] | None = None
    """SEP-1686's opt-in to a task (``{"ttl": ms}``); the server advertised tasks.requests."""


class LegacyTaskParams(LegacyParams):
    task_id: str = Field(min_length=1)


class LegacyListParams(LegacyParams):
    cursor: str | None = None


class LegacyReadResourceParams(LegacyParams):
    uri: str


class SetLevelParams(LegacyParams):
    """2025-11-25 ``logging/setLevel``."""

    level: LoggingLevel


class _TaskFields(WireModel):
    task_id: str
    status: Status
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskCreated(_TaskFields):
    """SEP-2663 ``CreateTaskResult``: flat ``Result & Task`` with ``resultType: "task"``."""

    result_type: Literal["task"] = "task"
    meta: dict[str, object] | None = Field(default=None, alias="_meta")


class DetailedTaskResult(_TaskFields):
    """SEP-2663 ``GetTaskResult``: the DetailedTask with ``resultType: "complete"``."""

    result_type: Literal["complete"] = "complete"
    input_requests: dict[str, object] | None = None
    result: dict[str, object] | None = None
    error: dict[str, object] | None = None
    meta: dict[str, object] | None = Field(default=None, alias="_meta")


class InputRequired(WireModel):
    """MRTR's ``InputRequiredResult`` (SEP-2322): input requests, and a sealed ``requestState``
    for the retry. The requests are passed through as the tool asked them."""

    result_type: Literal["input_required"] = "input_required"
    input_requests: dict[str, object]
    request_state: str | None = None


class EmptyAck(WireModel):
    """The empty acknowledgement of tasks/update and tasks/cancel."""

    result_type: Literal["complete"] = "complete"
    meta: dict[str, object] | None = Field(default=None, alias="_meta")


_ALWAYS = frozenset({"ttlMs"})  # required on the wire even when null


def dump(model: BaseModel) -> JSONObject:
    """Serialize by alias without nulls, keeping the keys the spec requires even when null."""
    data: JSONObject = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    for alias in _always(type(model)):
        if alias not in data:
            data[alias] = None
    return data


@functools.cache
def _always(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(
        alias for name, field in model.model_fields.items() if (alias := field.alias or name) in _ALWAYS
    )


def iso(moment: datetime) -> str:
    """ISO 8601 in UTC with millisecond precision (truncated) and a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"  # drops "+00:00"


def declares_tasks(capabilities: Mapping[str, object] | None) -> bool:
    """Whether a request's client capabilities declare the tasks extension.

    The key's presence is the declaration (SPEC-CHECKLIST Q-15); the legacy ``tasks`` slot
    does not count (SEP-2663: clients declaring only it are non-declaring).
    """
    if not capabilities:
        return False
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def progress_token(meta: Mapping[str, object] | None) -> str | int | None:
    """A request's ``_meta.progressToken`` (a string or an integer), or None: then no
    ``notifications/progress`` may refer to the request."""
    token = (meta or {}).get("progressToken")
    if isinstance(token, str) or (isinstance(token, int) and not isinstance(token, bool)):
        return token
    return None
