"""JSON-RPC dispatch: the method table keyed by protocol era, ``_meta``, headers, errors.

No HTTP here: the transport hands over the parsed body plus the few header values the
2026-07-28 rules compare against the body, and gets back a ``Reply``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from mcp_celery_tasks import handlers, legacy, metrics, push
from mcp_celery_tasks.errors import (
    HeaderMismatch,
    InfrastructureError,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ProtocolError,
    UnsupportedVersion,
)
from mcp_celery_tasks.handlers import Deferred, RequestContext, Services
from mcp_celery_tasks.push import Stream
from mcp_celery_tasks.wire import MODERN_VERSION, SERVER_INFO_META_KEY, RequestMeta

__all__ = ["METHODS", "Headers", "Reply", "dispatch"]

logger = logging.getLogger(__name__)
request_log = logging.getLogger("mcp_celery_tasks.requests")

Handler = Callable[[Services, RequestContext, dict[str, Any]], Awaitable[handlers.Result]]

METHODS: dict[str, dict[str, Handler]] = {
    MODERN_VERSION: {
        "server/discover": handlers.discover,
        "tools/list": handlers.list_tools,
        "tools/call": handlers.call_tool,
        "tasks/get": handlers.get_task,
        "tasks/update": handlers.update_task,
        "tasks/cancel": handlers.cancel_task,
    },
}
"""Methods per protocol era. Absent on purpose: ``tasks/result`` and ``tasks/list`` (SEP-2663
removed them; callers MUST get -32601) and ``ping`` (removed in 2026-07-28)."""

StreamHandler = Callable[[Services, RequestContext, dict[str, Any], Any], Awaitable[Stream]]

STREAMS: dict[str, dict[str, StreamHandler]] = {MODERN_VERSION: {"subscriptions/listen": push.listen}}
"""Methods answered with an SSE stream of notifications before their result."""

SUPPORTED_VERSIONS = tuple(METHODS)

# Requests whose ``Mcp-Name`` header mirrors a params field (Streamable HTTP 2026-07-28).
_NAME_PARAM = {
    "tools/call": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
# A missing Mcp-Name is tolerated on tasks/* (SPEC-CHECKLIST Q-10: fastmcp's client omits it).
_NAME_REQUIRED = frozenset({"tools/call"})


@dataclass(frozen=True)
class Headers:
    """The request headers the body is checked against (values already stripped)."""

    protocol_version: str | None
    method: str | None
    name: str | None
    session_id: str | None = None
    accepts_sse: bool = True


@dataclass
class Reply:
    """What to send: a JSON-RPC response (or nothing for a notification), maybe after waiting."""

    http_status: int
    body: dict[str, Any] | None
    deferred: Deferred | None = None
    request_id: Any = None
    stream: Stream | None = None
    headers: dict[str, str] | None = None
    method: str = "other"
    started: float = 0.0


def decode_header_value(value: str) -> str:
    """Undo the ``=?base64?…?=`` encoding of non-ASCII header values (SEP-2243)."""
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= 11:
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise HeaderMismatch("Mcp-Name is not valid base64") from exc
    return value


def error_body(request_id: Any, error: ProtocolError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_error()}


def result_body(services: Services, request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    meta = result.setdefault("_meta", {})
    meta[SERVER_INFO_META_KEY] = {"name": services.settings.server_name, "version": services.server_version}
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


async def dispatch(services: Services, body: Any, headers: Headers, principal: str) -> Reply:
    request_id = body.get("id") if isinstance(body, dict) and valid_id(body.get("id")) else None
    method = metrics.method_label(str(body.get("method"))) if isinstance(body, dict) else "other"
    started = time.perf_counter()
    try:
        reply = await _dispatch(services, body, headers, principal)
    except Exception as exc:
        error = as_protocol_error(exc)
        reply = Reply(error.http_status, error_body(request_id, error), request_id=request_id)
    reply.method, reply.started = method, started
    if reply.deferred is None and reply.stream is None:
        _observe(reply, services.settings.metrics_enabled)
    return reply


def _observe(reply: Reply, counted: bool) -> None:
    """Count and time a finished request; log it (method, code, latency; never its params)."""
    code = (reply.body or {}).get("error", {}).get("code", 0) if reply.body else 0
    elapsed = time.perf_counter() - reply.started
    if counted:
        metrics.rpc_requests.labels(reply.method, str(code)).inc()
        metrics.rpc_seconds.labels(reply.method).observe(elapsed)
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


def _check_headers(method: str, params: dict[str, Any], headers: Headers) -> None:
    if headers.method is None:
        raise HeaderMismatch("Missing Mcp-Method header")
    if headers.method != method:
        raise HeaderMismatch(
            f"Mcp-Method header {headers.method!r} does not match the body method {method!r}"
        )
    field = _NAME_PARAM.get(method)
    if field is None:
        return
    if headers.name is None:
        if method in _NAME_REQUIRED and field in params:
            raise HeaderMismatch("Missing Mcp-Name header")
        return
    if decode_header_value(headers.name) != params.get(field):
        raise HeaderMismatch(f"Mcp-Name header does not match params.{field}")


def _meta(method: str, params: dict[str, Any], headers: Headers) -> RequestMeta:
    raw = params.get("_meta")
    if not isinstance(raw, dict):
        raise InvalidParams("Missing params._meta (protocol version and client capabilities)")
    try:
        meta = RequestMeta.model_validate(raw)
    except ValidationError as exc:
        missing = ", ".join(str(err["loc"][-1]) for err in exc.errors(include_url=False))
        raise InvalidParams(f"Invalid params._meta: {missing}") from exc
    if headers.protocol_version is None:
        raise HeaderMismatch("Missing MCP-Protocol-Version header")
    if headers.protocol_version != meta.protocol_version:
        raise HeaderMismatch("MCP-Protocol-Version header does not match params._meta")
    if meta.protocol_version not in METHODS:
        raise UnsupportedVersion(
            f"Unsupported protocol version {meta.protocol_version!r}",
            {"supported": list(SUPPORTED_VERSIONS), "requested": meta.protocol_version},
        )
    return meta


MAX_DEPTH = 64


def unstorable(value: Any, depth: int = 0) -> str | None:
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


def valid_id(request_id: Any) -> bool:
    # JSON-RPC ids are strings or integers here (bool is an int in Python, not in JSON).
    return isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool))


async def _dispatch(services: Services, body: Any, headers: Headers, principal: str) -> Reply:
    if isinstance(body, dict) and "id" in body and not valid_id(body["id"]):
        raise InvalidRequest("The request id must be a string or an integer")
    answers_us = isinstance(body, dict) and "method" not in body and ("result" in body or "error" in body)
    if answers_us and headers.session_id is None:
        return Reply(202, None)  # a response to nothing we asked: ignored
    if legacy.is_legacy(body, headers.session_id, headers.protocol_version) or answers_us:
        if not answers_us and (body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str)):
            raise InvalidRequest("Not a JSON-RPC 2.0 request")
        if body.get("method") == "initialize" and "id" not in body:
            return Reply(202, None)  # initialize as a notification: nothing to answer
        try:
            outcome = await legacy.handle(services, body, headers.session_id, principal, headers.accepts_sse)
        except Exception as exc:
            # 2025-11-25 clients read JSON-RPC errors from 200 responses (the 1.x SDKs treat a
            # 4xx as a transport failure); the status codes above are 2026-07-28 rules.
            error = as_protocol_error(exc)
            return Reply(200, error_body(body.get("id"), error), request_id=body.get("id"))
        return Reply(
            outcome.status,
            outcome.body,
            deferred=outcome.deferred,
            request_id=body.get("id"),
            stream=outcome.stream,
            headers=outcome.headers,
        )
    if isinstance(body, list):
        raise InvalidRequest("JSON-RPC batches are not supported")
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        raise InvalidRequest("Not a JSON-RPC 2.0 request")
    method: str = body["method"]
    is_notification = "id" not in body
    request_id = body.get("id")
    if not is_notification and not valid_id(request_id):
        raise InvalidRequest("The request id must be a string or an integer")
    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    if is_notification:
        # notifications/cancelled MUST NOT cancel tasks (SEP-2663); nothing else is expected.
        return Reply(202, None)
    _check_headers(method, params, headers)
    handler = METHODS[MODERN_VERSION].get(method)
    streamer = STREAMS[MODERN_VERSION].get(method)
    if handler is None and streamer is None:
        raise MethodNotFound(f"Method not found: {method}")
    meta = _meta(method, params, headers)
    ctx = RequestContext(principal=principal, meta=meta)
    if streamer is not None:
        stream = await streamer(services, ctx, params, request_id)
        return Reply(200, None, request_id=request_id, stream=stream)
    assert handler is not None
    result = await handler(services, ctx, params)
    if isinstance(result, Deferred):
        return Reply(200, None, deferred=result, request_id=request_id)
    return Reply(200, result_body(services, request_id, result), request_id=request_id)


async def settle(services: Services, reply: Reply) -> dict[str, Any]:
    """Await a deferred reply and build its JSON-RPC response (errors mapped)."""
    assert reply.deferred is not None
    try:
        result = await reply.deferred.wait()
    except Exception as exc:
        reply.body = error_body(reply.request_id, as_protocol_error(exc))
    else:
        reply.body = result_body(services, reply.request_id, dict(result))
    _observe(reply, services.settings.metrics_enabled)
    return reply.body
