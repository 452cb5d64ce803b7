"""JSON-RPC building blocks shared by the method table, the handlers and the transport.

A method is one ``Method`` entry: its name, protocol era, params model (validated before the
handler runs), handler and header rules (``methods`` holds the table). A handler returns a
result model, a ``Deferred`` (a result that needs waiting: a synchronous tools/call) or a
``Stream`` (notifications, then the result: subscriptions/listen, 2025-11-25 SSE calls). The
envelopes are ``mcp_types.jsonrpc``'s.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from mcp_types import SERVER_INFO_META_KEY
from mcp_types.jsonrpc import ErrorData, JSONRPCError
from pydantic import BaseModel, ValidationError

from mcp_celery_tasks.errors import InfrastructureError, InternalError, InvalidParams, ProtocolError

if TYPE_CHECKING:
    from mcp_celery_tasks.protocol.services import Services
    from mcp_celery_tasks.tasks.service import RequestContext

__all__ = [
    "Deferred",
    "Handler",
    "Method",
    "Result",
    "Stream",
    "WithHeaders",
    "as_protocol_error",
    "error_body",
    "result_body",
]

logger = logging.getLogger("mcp_celery_tasks.rpc")

P = TypeVar("P", bound=BaseModel)


@dataclass(frozen=True)
class Deferred:
    """A result that is only ready after waiting (a synchronous tools/call).

    The transport awaits ``wait()``; cancelling that await (the client went away) cancels the
    task behind it.
    """

    wait: Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Stream:
    """Messages for an SSE response; the last one is the JSON-RPC response."""

    messages: AsyncIterator[dict[str, Any]]


@dataclass(frozen=True)
class WithHeaders:
    """A result sent with extra response headers (2025-11-25 initialize: ``Mcp-Session-Id``)."""

    result: dict[str, Any]
    headers: dict[str, str]


Result = BaseModel | dict[str, Any] | Deferred | Stream | WithHeaders
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
    requires_tasks: bool = False
    """SEP-2663: the request must declare the tasks extension (-32021 otherwise)."""
    needs_session: bool = False
    """2025-11-25 methods after initialize: served only within a known session."""


def error_body(request_id: Any, error: ProtocolError) -> dict[str, Any]:
    """A JSON-RPC error response (``id`` null when the request's id could not be read)."""
    envelope = JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(**error.to_error()))
    return envelope.model_dump(mode="json", exclude_unset=True)


def result_body(
    request_id: Any, result: dict[str, Any], server_info: dict[str, str] | None
) -> dict[str, Any]:
    """A JSON-RPC response; 2026-07-28 results carry ``_meta`` serverInfo (CORE-BASIC SHOULD)."""
    if server_info is not None:
        meta = result.setdefault("_meta", {})
        meta[SERVER_INFO_META_KEY] = server_info
    # mcp_types.jsonrpc.JSONRPCResponse's shape, built as a dict: the result is already a JSON
    # value and the id was checked by dispatch (a model round trip cost more than the rest).
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


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
        error = InternalError(f"Temporarily unavailable: {exc}")
        error.http_status = 503
        return error
    logger.error("unexpected error while handling a request", exc_info=exc)
    return InternalError("Internal error")
