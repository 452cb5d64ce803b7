"""One exception tree, and one deliberate exception outside it. Every error a client can see
knows its JSON-RPC code.

::

    McpTasksError
    ├── ProtocolError            a JSON-RPC error answered to the client (code, message, data)
    │   ├── InvalidParams        -32602
    │   ├── MethodNotFound       -32601  (HTTP 404)
    │   ├── InvalidRequest       -32600
    │   ├── ParseError           -32700
    │   ├── HeaderMismatch       -32020  (HTTP 400)
    │   ├── MissingCapability    -32021  (HTTP 400)
    │   ├── UnsupportedVersion   -32022  (HTTP 400)
    │   ├── QuotaExceeded        -32001  (HTTP 429, Retry-After)
    │   ├── ResourceNotFound     -32002  resources/read of an unknown (or another's) uri (2025-11-25;
    │   │                        -32602 on 2026-07-28, SEP-2164)
    │   └── InternalError        -32603
    │       └── ServiceUnavailable  -32603 (HTTP 503, Retry-After, data.retryAfterMs): Postgres
    │                            is out of reach; the request may be sent again
    ├── ToolError                raised by tool code: the task completes with isError: true
    │   ├── InputTimedOut        nobody answered an input request in time
    │   ├── InputNotSupported    the client did not declare the kind of input asked for
    │   ├── SoftTimeLimitExceeded  the tool ran past its soft time limit
    │   ├── StepOrderError     a run met its durable steps in another order than recorded
    │   ├── StepResultError    a step's result is not JSON, or over max_step_result_bytes
    │   ├── CheckpointTooLarge a checkpoint over max_checkpoint_bytes (the previous one stays)
    │   └── ArtifactRefused    an artifact over max_artifact_bytes or its principal's
    │                          artifact_quota_bytes (nothing of it is kept)
    ├── McpError                 raised by tool code: the task fails with this JSON-RPC error
    └── InfrastructureError      Postgres or the broker failed; never a tool result (retried)
        ├── BrokerUnreachable    (``broker``) a kombu, redis-py or py-amqp error, wrapped where
        │                        the broker call is made
        └── OutageTooLong        (``blips``) unreachable past the outage budget: the task fails

    BaseException
    ├── TaskCancelled            the task was cancelled; the worker stops quietly. Not an
    │                            Exception (as asyncio.CancelledError): a tool's ``except
    │                            Exception`` or ``except ToolError`` cannot swallow a cancel
    └── WorkerStopping           the worker process is being stopped (a deploy): the job is
                                 given back, not failed, and resumes elsewhere
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NotRequired, TypedDict

from mcp_types import jsonrpc as codes

from mcp_celery_tasks.json_types import JSONObject, JSONValue

__all__ = [
    "ArtifactRefused",
    "BrokerUnreachable",
    "CheckpointTooLarge",
    "HeaderMismatch",
    "InfrastructureError",
    "InputNotSupported",
    "InputTimedOut",
    "InsufficientScope",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "JobSuspended",
    "McpError",
    "McpTasksError",
    "MethodNotFound",
    "MissingCapability",
    "ParseError",
    "ProtocolError",
    "QuotaExceeded",
    "ResourceNotFound",
    "ServiceUnavailable",
    "SoftTimeLimitExceeded",
    "StepOrderError",
    "StepResultError",
    "TaskCancelled",
    "TaskError",
    "TooManyWaiting",
    "ToolError",
    "UnsupportedVersion",
    "WorkerStopping",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class TaskError(TypedDict):
    """A JSON-RPC error object as ``to_error`` builds it: a failed task's stored ``error``
    (SEP-2663: code, message, data?), a response's ``error``."""

    code: int
    message: str
    data: NotRequired[JSONValue]


class McpTasksError(Exception):
    """Root of every error this package raises on purpose."""


class ProtocolError(McpTasksError):
    """A JSON-RPC error for the client."""

    code: int = codes.INTERNAL_ERROR
    http_status: int = 200

    def __init__(self, message: str, data: JSONValue = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers that go with the error (``Retry-After``, when waiting helps)."""
        return {}

    def to_error(self) -> TaskError:
        """The JSON-RPC error object: ``code``, ``message`` and, when there is any, ``data``."""
        error: TaskError = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ParseError(ProtocolError):
    code = codes.PARSE_ERROR
    http_status = 400


class InvalidRequest(ProtocolError):
    code = codes.INVALID_REQUEST
    http_status = 400


class InvalidParams(ProtocolError):
    code = codes.INVALID_PARAMS
    http_status = 400


class MethodNotFound(ProtocolError):
    code = codes.METHOD_NOT_FOUND
    http_status = 404  # Streamable HTTP 2026-07-28: unknown method -> 404


class HeaderMismatch(ProtocolError):
    code = codes.HEADER_MISMATCH
    http_status = 400


class MissingCapability(ProtocolError):
    code = codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    http_status = 400

    def __init__(
        self, message: str = "Missing required client capability", required: JSONObject | None = None
    ) -> None:
        needed = required if required is not None else {"extensions": {TASKS_EXTENSION: {}}}
        super().__init__(message, {"requiredCapabilities": needed})


class UnsupportedVersion(ProtocolError):
    code = codes.UNSUPPORTED_PROTOCOL_VERSION
    http_status = 400


RESOURCE_NOT_FOUND = -32002
"""MCP's resources/read code for a uri the server does not have (2025-11-25, server/resources
"Error Handling"). SEP-2164 replaced it with -32602 for 2026-07-28 (``protocol.resources``)."""


class ResourceNotFound(ProtocolError):
    """An unknown, malformed or another principal's resource uri: one error for all three
    (so a uri's existence never leaks), the uri in ``data``."""

    code = RESOURCE_NOT_FOUND

    def __init__(self, uri: str, message: str = "Resource not found") -> None:
        super().__init__(message, {"uri": uri})


QUOTA_EXCEEDED = -32001
"""A principal's quota refused the request (implementation-defined server error: MCP reserves
-32020..-32099 for itself, JSON-RPC -32000..-32099 for servers)."""


class QuotaExceeded(ProtocolError):
    """A per-principal limit refused the request: ``data`` names the limit, its maximum and,
    when waiting helps, ``retryAfterMs`` (also sent as the HTTP ``Retry-After`` header)."""

    code = QUOTA_EXCEEDED
    http_status = 429

    def __init__(
        self, message: str, *, limit: str, maximum: float, retry_after_s: float | None = None
    ) -> None:
        data: JSONObject = {"limit": limit, "max": maximum}
        if retry_after_s is not None:
            data["retryAfterMs"] = max(1, int(retry_after_s * 1000))
        super().__init__(message, data)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of the refusal: ``Retry-After`` in whole seconds, when waiting helps."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class InsufficientScope(InvalidRequest):
    """A valid access token without the scopes this operation needs: HTTP 403 with
    ``WWW-Authenticate: Bearer error="insufficient_scope", scope="…"`` (MCP authorization,
    "Scope Challenge Handling"; RFC 6750 §3.1), so the client can ask for them (a step-up). An
    authorization error of the transport: 403 on either protocol revision."""

    http_status = 403

    def __init__(self, scopes: Sequence[str]) -> None:
        self.scopes = tuple(scopes)
        super().__init__(f"Forbidden: this operation needs the scopes {' '.join(self.scopes)}")

    @property
    def headers(self) -> dict[str, str]:
        # scope-tokens hold no quote or backslash (RFC 6749 §3.3; ``tool(scopes=…)`` checks).
        return {
            "WWW-Authenticate": 'Bearer realm="mcp", error="insufficient_scope", '
            f'scope="{" ".join(self.scopes)}", error_description="the token lacks a required scope"'
        }


class InternalError(ProtocolError):
    code = codes.INTERNAL_ERROR
    http_status = 500


class ServiceUnavailable(InternalError):
    """Postgres is out of reach (down, restarting, failing over, cut off): answered after a short
    bounded wait (``db_unavailable_after_seconds``), never a hang or a stack trace.

    The code stays -32603: SEP-2663 and the MCP core name no code for "temporarily unavailable",
    -32603 is the internal error (SPEC-CHECKLIST S-45), and MCP reserves -32020..-32099 for the
    spec itself (S-48). What tells a client to retry is HTTP 503 with ``Retry-After`` (RFC 9110
    §15.6.4, §10.2.3) and ``data``: ``{"unavailable": "database", "retryAfterMs": …}``.

    Sending the same request again is safe for every method but one: tasks/get reads,
    tasks/cancel and tasks/update are idempotent (a second cancel or a repeated answer is
    acknowledged and changes nothing). A tools/call whose row may have been written before the
    connection broke (``task_id`` given) says so with ``data.taskId`` and ``data.maybeCreated``:
    ``tasks/get`` that id once the service answers again; a task means it was created (do not
    call again), -32602 means it was not (call again). Nothing is lost: a row that was written
    is run like any other.
    """

    http_status = 503

    def __init__(
        self, message: str, *, what: str = "database", retry_after_s: float = 1.0, task_id: str | None = None
    ) -> None:
        data: JSONObject = {"unavailable": what, "retryAfterMs": max(1, int(retry_after_s * 1000))}
        if task_id is not None:
            data.update(taskId=task_id, maybeCreated=True)
        super().__init__(message, data)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class ToolError(McpTasksError):
    """Raise from a tool to end the call with ``isError: true`` and this message.

    The task still ends ``completed``: SEP-2663 reserves ``failed`` for JSON-RPC errors.
    """


class TaskCancelled(BaseException):
    """The task was cancelled; raised at the tool's next checkpoint (``raise_if_cancelled``,
    ``sleep``, an input request).

    A ``BaseException``, for the reason ``asyncio.CancelledError`` is one: tool code wraps its
    work in ``except Exception:`` (or ``except ToolError:``) to turn failures into results, and
    such a handler must not catch a cancel and carry on. Let it through; clean up in
    ``finally``. The worker catches it by name and records that the job stopped.
    """


class WorkerStopping(BaseException):
    """The worker process running the job is being stopped (a cold shutdown of a deploy sends
    its pool children SIGTERM). Raised at the job's next safe point; the runner gives the job
    back (its attempt is not counted) and the process then dies as it was told to. A
    ``BaseException`` for the reason ``TaskCancelled`` is one."""


class JobSuspended(BaseException):
    """The job gave its worker slot back while waiting for input (suspend): raised out of the
    input request, through the tool, to the runner, which acknowledges the message. The tool runs
    again from the top once the answers are in; the question then returns its answer at once.
    A ``BaseException`` for the reason ``TaskCancelled`` is one: let it through."""


class InputTimedOut(ToolError):
    """Nobody answered an input request within the tool's input timeout."""


class SoftTimeLimitExceeded(ToolError):
    """The tool ran past its soft time limit (``@tool(soft_time_limit=…)``; time waiting for input
    does not count). Raised inside the tool at its next ``ctx`` checkpoint, or at once in plain
    Python code; catch it to clean up. Uncaught, the call ends with ``isError: true``. The hard
    limit (``time_limit``) stops the process without asking."""


class InputNotSupported(ToolError):
    """The originating tools/call did not declare the capability this input request needs.

    A task ends ``completed`` with ``isError``; a synchronous call answers -32021 naming
    ``capability`` in ``requiredCapabilities`` (SEP-2322: never ask for an undeclared kind).
    """

    def __init__(self, message: str, capability: str | None = None) -> None:
        super().__init__(message)
        self.capability = capability


class StepOrderError(ToolError):
    """A run reached a recorded durable step (``ctx.step``) at another position, or another step
    at a recorded position: steps must run in the same order on every run of a task, or a
    recorded result would be handed to the wrong code. Nothing is reused."""


class StepResultError(ToolError):
    """A step's result cannot be recorded: it is not JSON (``json.dumps`` refused it), or its
    JSON is larger than ``max_step_result_bytes``. Nothing is recorded."""


class CheckpointTooLarge(ToolError):
    """A checkpoint is larger than ``max_checkpoint_bytes``; the previous one stays as it was."""


class ArtifactRefused(ToolError):
    """An artifact (``ctx.artifact``, or a large result stored as one) would pass
    ``max_artifact_bytes`` or its principal's ``artifact_quota_bytes``: the upload stopped at the
    chunk that would pass it and what it wrote was removed. ``limit`` names the setting."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class TooManyWaiting(ToolError):
    """The principal already has ``max_waiting_inputs`` jobs of this queue blocked on input: this
    input request is refused (the call ends with ``isError: true``), so unanswered questions
    never hold every worker slot of a queue. Answer or cancel a waiting task, then call again."""


class McpError(McpTasksError):
    """Raise from a tool to end the task ``failed`` with this JSON-RPC error."""

    def __init__(self, code: int, message: str, data: JSONValue = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_error(self) -> TaskError:
        """The JSON-RPC error object the failed task records: ``code``, ``message``, ``data``?"""
        error: TaskError = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class InfrastructureError(McpTasksError):
    """Postgres or the broker failed. The precise error is on ``__cause__``.

    ``maybe_applied``: the statement had been sent when the connection broke, and could not be
    confirmed since (it may have committed)."""

    maybe_applied: bool = False


class BrokerUnreachable(InfrastructureError):
    """The broker failed under one of our calls (``broker.channel``): the transport's own error
    (kombu, redis-py, py-amqp) is on ``__cause__``, so callers catch ours only."""
