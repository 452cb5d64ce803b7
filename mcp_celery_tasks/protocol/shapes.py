"""The JSON the protocol layer builds and sends, as TypedDicts: plain dicts at runtime, checked
by mypy where they are built.

Shared by both revisions: the JSON-RPC envelopes (a result or an error response, a notification,
one of our server-to-client requests) and the progress and log notifications of a synchronous
call. The task shapes differ per revision: SEP-1686's (2025-11-25: ``ttl``, ``pollInterval``,
``CreateTaskResult`` nesting the task) are here; SEP-2663's (2026-07-28: flat, ``ttlMs``,
``resultType``) are ``wire``'s models (``TaskCreated``, ``DetailedTaskResult``), dumped by
``wire.dump``. A result's own body is a ``Mapping[str, object]`` in an envelope: a dumped model,
a TypedDict below, or a tool's stored result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NotRequired, TypeAlias, TypedDict, final

from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.lifecycle import Status

__all__ = [
    "ErrorObject",
    "ErrorResponse",
    "InitializeResult",
    "LegacyCreateTaskResult",
    "LegacyListTasksResult",
    "LegacyListToolsResult",
    "LegacyTask",
    "LegacyTool",
    "LogMessageParams",
    "Message",
    "Notification",
    "ProgressParams",
    "RequestId",
    "Response",
    "ResultResponse",
    "ServerInfo",
    "ServerRequest",
]

RequestId: TypeAlias = str | int
"""A JSON-RPC request id as this server accepts it (``rpc.valid_id``)."""


# ---- JSON-RPC envelopes (mcp_types.jsonrpc's shapes) ---------------------------------------------


class ErrorObject(TypedDict):
    """A JSON-RPC error object: the ``error`` of a response, a failed task's ``error``."""

    code: int
    message: str
    data: NotRequired[JSONValue]


@final  # so that ``"error" in message`` tells the envelopes apart
class ResultResponse(TypedDict):
    jsonrpc: Literal["2.0"]
    id: RequestId | None
    result: Mapping[str, object]


@final
class ErrorResponse(TypedDict):
    jsonrpc: Literal["2.0"]
    id: RequestId | None
    """null when the request's id could not be read."""
    error: ErrorObject


Response: TypeAlias = ResultResponse | ErrorResponse


@final
class Notification(TypedDict):
    jsonrpc: Literal["2.0"]
    method: str
    params: Mapping[str, object]


@final
class ServerRequest(TypedDict):
    """A 2025-11-25 server-to-client request (``elicitation/create``, ``roots/list`` …)."""

    jsonrpc: Literal["2.0"]
    id: str
    method: str
    params: NotRequired[JSONObject]


Message: TypeAlias = ResultResponse | ErrorResponse | Notification | ServerRequest
"""One message of an SSE response stream."""


class ServerInfo(TypedDict):
    """``serverInfo`` (2025-11-25 initialize) and 2026-07-28 results' ``_meta`` serverInfo."""

    name: str
    version: str


# ---- a synchronous call's notifications -----------------------------------------------------------


class ProgressParams(TypedDict):
    """``notifications/progress``."""

    progressToken: str | int
    progress: float
    total: NotRequired[float]
    message: NotRequired[str]


class LogMessageParams(TypedDict):
    """``notifications/message``."""

    level: str
    data: JSONValue
    logger: NotRequired[str]


# ---- 2025-11-25 (SEP-1686) ------------------------------------------------------------------------


class LegacyTask(TypedDict):
    """SEP-1686 ``Task`` (also the ``GetTaskResult`` of tasks/get and tasks/cancel)."""

    taskId: str
    status: Status
    statusMessage: NotRequired[str]
    createdAt: str
    lastUpdatedAt: str
    ttl: int
    pollInterval: int


class LegacyCreateTaskResult(TypedDict):
    """SEP-1686 ``CreateTaskResult``: the task, nested."""

    task: LegacyTask


class LegacyListTasksResult(TypedDict):
    tasks: list[LegacyTask]
    nextCursor: NotRequired[str]


class LegacyToolExecution(TypedDict):
    taskSupport: Literal["forbidden", "optional", "required"]


class LegacyTool(TypedDict):
    name: str
    inputSchema: JSONObject
    description: NotRequired[str]
    execution: LegacyToolExecution


class LegacyListToolsResult(TypedDict):
    tools: list[LegacyTool]


class InitializeResult(TypedDict):
    protocolVersion: str
    capabilities: JSONObject
    serverInfo: ServerInfo
    instructions: str
