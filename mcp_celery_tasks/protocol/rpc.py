"""JSON-RPC building blocks shared by the method table, the handlers and the transport.

A method is one ``Method`` entry: its name, protocol era, params model (validated before the
handler runs), handler and header rules (``methods`` holds the table). A handler returns a
result model, a ``SyncCall`` (a result that needs waiting: a synchronous tools/call,
``synccall``) or a ``Stream`` (notifications, then the result: subscriptions/listen, 2025-11-25
SSE calls). The envelope rules live here, once: what a request id may be, what a body may hold
(``unstorable``), the response and error envelopes (``mcp_types.jsonrpc``'s shapes), the
``Reply`` the transport writes, and how a synchronous call's reply is settled and observed.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeGuard, TypeVar, cast

from mcp_types import SERVER_INFO_META_KEY
from mcp_types.jsonrpc import ErrorData, JSONRPCError
from pydantic import BaseModel, ValidationError

from mcp_celery_tasks.errors import (
    BrokerUnreachable,
    HeaderMismatch,
    InfrastructureError,
    InternalError,
    InvalidParams,
    MissingCapability,
    ProtocolError,
    ServiceUnavailable,
)
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.protocol.shapes import (
    ErrorResponse,
    Message,
    RequestId,
    Response,
    ResultResponse,
    ServerInfo,
)
from mcp_celery_tasks.telemetry import metrics, semconv

if TYPE_CHECKING:
    from mcp_celery_tasks.protocol.services import Services
    from mcp_celery_tasks.protocol.synccall import SyncCall
    from mcp_celery_tasks.tasks.service import RequestContext

__all__ = [
    "Handler",
    "Headers",
    "Method",
    "Reply",
    "Result",
    "Stream",
    "WithHeaders",
    "as_protocol_error",
    "decode_header_value",
    "error_body",
    "observe",
    "result_body",
    "settle",
    "unstorable",
    "valid_id",
]

logger = logging.getLogger("mcp_celery_tasks.rpc")
request_log = logging.getLogger("mcp_celery_tasks.requests")

MAX_DEPTH = 64

P = TypeVar("P", bound=BaseModel)


@dataclass(frozen=True)
class Stream:
    """Messages for an SSE response; the last one is the JSON-RPC response."""

    messages: AsyncIterator[Message]


@dataclass(frozen=True)
class WithHeaders:
    """A result sent with extra response headers (2025-11-25 initialize: ``Mcp-Session-Id``)."""

    result: Mapping[str, object]
    headers: dict[str, str]


Result: TypeAlias = "BaseModel | Mapping[str, object] | SyncCall | Stream | WithHeaders"
Handler = Callable[["Services", "RequestContext", P], Awaitable[Result]]


@dataclass(frozen=True)
class Method(Generic[P]):
    """One JSON-RPC method of one protocol era: everything dispatch needs to serve it."""

    name: str
    era: str
    params: type[P]
    handler: Handler[P]
    name_param: str | None = None
    """Streamable HTTP 2026-07-28: the ``Mcp-Name`` header mirrors this params field."""
    name_required: bool = False
    """A missing ``Mcp-Name`` is refused (else tolerated: SPEC-CHECKLIST Q-10)."""
    param_headers: bool = False
    """SEP-2243: arguments marked ``x-mcp-header`` are mirrored in ``Mcp-Param-*`` headers."""
    requires_tasks: bool = False
    """SEP-2663: the request must declare the tasks extension (-32021 otherwise)."""
    needs_session: bool = False
    """2025-11-25 methods after initialize: served only within a known session."""


def error_body(request_id: RequestId | None, error: ProtocolError) -> ErrorResponse:
    """A JSON-RPC error response (``id`` null when the request's id could not be read)."""
    envelope = JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(**error.to_error()))
    # mcp_types' JSONRPCError, dumped by alias: ErrorResponse's keys, its values JSON.
    return cast(ErrorResponse, envelope.model_dump(mode="json", exclude_unset=True))


def result_body(
    request_id: RequestId | None, result: Mapping[str, object], server_info: ServerInfo | None
) -> ResultResponse:
    """A JSON-RPC response; 2026-07-28 results carry ``_meta`` serverInfo (CORE-BASIC SHOULD)."""
    if server_info is not None:
        # Merged into a copy (the caller's result and its ``_meta`` stay as they were); the keys
        # keep their order, an added ``_meta`` or serverInfo comes last.
        meta = result.get("_meta", {})
        if not isinstance(meta, dict):  # JSON: a dict (not the slower Mapping check)
            raise TypeError(f"a result's _meta must be an object, not {type(meta).__name__}")
        result = {**result, "_meta": {**meta, SERVER_INFO_META_KEY: server_info}}
    # mcp_types.jsonrpc.JSONRPCResponse's shape, built as a dict: the result is already a JSON
    # value and the id was checked by dispatch (a model round trip cost more than the rest).
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


RETRY_AFTER_S = 1.0
"""What an answer during an outage tells the client to wait before sending the request again."""


def as_protocol_error(exc: BaseException) -> ProtocolError:
    """Map anything raised while handling a request to the error the client sees."""
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'params'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        return InvalidParams(f"Invalid params: {problems}")
    if isinstance(exc, InfrastructureError):
        # -32603 (SPEC-CHECKLIST S-45; S-48 forbids inventing one in -32020..-32099) with HTTP 503,
        # Retry-After and data.retryAfterMs: the ServiceUnavailable docstring says why and what
        # a client does with it.
        what = "broker" if isinstance(exc, BrokerUnreachable) else "database"
        return ServiceUnavailable(f"Temporarily unavailable: {exc}; retry in {RETRY_AFTER_S:g} s", what=what)
    logger.error("unexpected error while handling a request", exc_info=exc)
    return InternalError("Internal error")


# ---- what a request may be ------------------------------------------------------------------------


@dataclass(frozen=True)
class Headers:
    """The request headers the body is checked against (values already stripped)."""

    protocol_version: str | None
    method: str | None
    name: str | None
    session_id: str | None = None
    accepts_sse: bool = True
    params: Mapping[str, str] = field(default_factory=dict)
    """``Mcp-Param-<Name>`` headers by lower-cased name (SEP-2243 custom headers)."""


def decode_header_value(value: str) -> str:
    """Undo the ``=?base64?…?=`` encoding of non-ASCII header values (SEP-2243)."""
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= 11:
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise HeaderMismatch("Mcp-Name is not valid base64") from exc
    return value


def unstorable(value: JSONValue, depth: int = 0) -> str | None:
    """Why a parsed body cannot be handled safely, or None: too deep, a NUL (Postgres text
    cannot hold one), an unpaired surrogate (not UTF-8), or a non-finite number."""
    if depth > MAX_DEPTH:
        return f"JSON nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, str):
        if "\x00" in value:
            return "strings may not contain NUL characters"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "strings may not contain unpaired surrogates"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "numbers must be finite"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = unstorable(key, depth + 1) or unstorable(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, list):
        for item in value:
            problem = unstorable(item, depth + 1)
            if problem:
                return problem
    return None


def valid_id(request_id: object) -> TypeGuard[RequestId]:
    # JSON-RPC ids are strings or integers here (bool is an int in Python, not in JSON).
    return isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool))


# ---- what to answer -------------------------------------------------------------------------------


@dataclass
class Reply:
    """What to send: a JSON-RPC response (or nothing for a notification), maybe after waiting."""

    http_status: int
    body: Response | None
    sync: SyncCall | None = None
    request_id: RequestId | None = None
    stream: Stream | None = None
    headers: dict[str, str] | None = None
    method: str = "other"
    started: float = 0.0
    server_info: ServerInfo | None = None
    counted: bool = False
    """Prometheus counts this request (``metrics_enabled``)."""
    operation: semconv.Operation | None = None
    """Its span of the MCP conventions, ended by ``observe``."""


async def settle(reply: Reply) -> Response:
    """Await a synchronous call's reply and build its JSON-RPC response (errors mapped)."""
    assert reply.sync is not None
    try:
        result = await reply.sync.result()
    except Exception as exc:
        error = as_protocol_error(exc)
        if isinstance(error, MissingCapability):
            reply.http_status = error.http_status  # -32021 is HTTP 400 where the status is still ours
        reply.body = error_body(reply.request_id, error)
    else:
        reply.body = result_body(reply.request_id, dict(result), reply.server_info)
    observe(reply)
    return reply.body


_SERIES: dict[tuple[str, int], tuple[Any, Any]] = {}
_SERIES_CACHED = 512  # methods x codes seen; a tool's own error codes could be many


def _series(method: str, code: int) -> tuple[Any, Any]:
    """The request counter and latency histogram of one method and code (``labels()`` looks
    them up under a lock on every call; a few µs per request)."""
    series = _SERIES.get((method, code))
    if series is None:
        series = (metrics.rpc_requests.labels(method, str(code)), metrics.rpc_seconds.labels(method))
        if len(_SERIES) < _SERIES_CACHED:
            _SERIES[(method, code)] = series
    return series


def observe(reply: Reply) -> None:
    """Count and time a finished request; log it (method, code, latency; never its params)."""
    body = reply.body
    code = body["error"]["code"] if body is not None and "error" in body else 0
    elapsed = time.perf_counter() - reply.started
    if reply.operation is not None:
        semconv.end(reply.operation, body, elapsed, counted=reply.counted)
        reply.operation = None
    if reply.counted:
        requests, seconds = _series(reply.method, code)
        requests.inc()
        seconds.observe(elapsed)
    if request_log.isEnabledFor(logging.INFO):
        request_log.info(
            "%s %s %.1f ms",
            reply.method,
            code,
            elapsed * 1000,
            extra={
                "event": "rpc",
                "method": reply.method,
                "code": code,
                "latency_ms": round(elapsed * 1000, 2),
            },
        )
