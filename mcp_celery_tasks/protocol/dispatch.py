"""JSON-RPC dispatch over the method table: era, headers, ``_meta``, params, errors.

No HTTP here: the transport hands over the parsed body plus the few header values the
2026-07-28 rules compare against the body, and gets back a ``Reply``. A request belongs to the
2026-07-28 era (stateless, ``_meta`` on every request, Streamable HTTP header rules, errors with
their HTTP status) unless it is a 2025-11-25 handshake request (``initialize``, or a session
header without modern ``_meta``), which is served from the session and answered with HTTP 200
(the 1.x SDKs read JSON-RPC errors only from 200 responses).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from mcp_celery_tasks.errors import (
    HeaderMismatch,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    MissingCapability,
    QuotaExceeded,
    UnsupportedVersion,
)
from mcp_celery_tasks.protocol import methods
from mcp_celery_tasks.protocol import v2025_11_25 as legacy
from mcp_celery_tasks.protocol.rpc import (
    Deferred,
    Method,
    Stream,
    WithHeaders,
    as_protocol_error,
    error_body,
    result_body,
)
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.tasks.service import RequestContext
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.tools.registry import get_tool
from mcp_celery_tasks.wire import ALL_VERSIONS, RequestMeta, dump

__all__ = ["Headers", "Reply", "decode_header_value", "dispatch", "settle", "unstorable", "valid_id"]

logger = logging.getLogger("mcp_celery_tasks.dispatch")
request_log = logging.getLogger("mcp_celery_tasks.requests")

MAX_DEPTH = 64


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
    server_info: dict[str, str] | None = None


def decode_header_value(value: str) -> str:
    """Undo the ``=?base64?…?=`` encoding of non-ASCII header values (SEP-2243)."""
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= 11:
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise HeaderMismatch("Mcp-Name is not valid base64") from exc
    return value


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


# ---- entry points ------------------------------------------------------------------------------


async def dispatch(services: Services, body: Any, headers: Headers, principal: str) -> Reply:
    request_id = body.get("id") if isinstance(body, dict) and valid_id(body.get("id")) else None
    name = body.get("method") if isinstance(body, dict) else None
    label = name if isinstance(name, str) and name in methods.NAMES else "other"
    started = time.perf_counter()
    try:
        reply = await _dispatch(services, body, headers, principal)
    except Exception as exc:
        error = as_protocol_error(exc)
        reply = Reply(error.http_status, error_body(request_id, error), request_id=request_id)
        if isinstance(error, QuotaExceeded):
            reply.headers = error.headers or None
    reply.method, reply.started = label, started
    if reply.deferred is None and reply.stream is None:
        _observe(reply, services.settings.metrics_enabled)
    return reply


async def settle(services: Services, reply: Reply) -> dict[str, Any]:
    """Await a deferred reply and build its JSON-RPC response (errors mapped)."""
    assert reply.deferred is not None
    try:
        result = await reply.deferred.wait()
    except Exception as exc:
        error = as_protocol_error(exc)
        if isinstance(error, MissingCapability):
            reply.http_status = error.http_status  # -32021 is HTTP 400 where the status is still ours
        reply.body = error_body(reply.request_id, error)
    else:
        reply.body = result_body(reply.request_id, dict(result), reply.server_info)
    _observe(reply, services.settings.metrics_enabled)
    return reply.body


# ---- routing -----------------------------------------------------------------------------------


async def _dispatch(services: Services, body: Any, headers: Headers, principal: str) -> Reply:
    if isinstance(body, list):
        raise InvalidRequest("JSON-RPC batches are not supported")
    if isinstance(body, dict) and "id" in body and not valid_id(body["id"]):
        raise InvalidRequest("The request id must be a string or an integer")
    if isinstance(body, dict) and "method" not in body and ("result" in body or "error" in body):
        # A client's response to one of our 2025-11-25 server-to-client requests.
        if headers.session_id is not None:
            await legacy.client_response(services, principal, body)
        return Reply(202, None)
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        raise InvalidRequest("Not a JSON-RPC 2.0 request")
    name: str = body["method"]
    request_id = body.get("id")
    params = body.get("params", {})
    if params is None:
        params = {}
    if legacy.is_legacy(body, headers.session_id, headers.protocol_version):
        try:
            return await _legacy(services, body, name, params, headers, principal)
        except Exception as exc:
            # 2025-11-25 clients read JSON-RPC errors from 200 responses (the 1.x SDKs treat a
            # 4xx as a transport failure); the status codes are 2026-07-28 rules.
            return Reply(200, error_body(request_id, as_protocol_error(exc)), request_id=request_id)
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    if "id" not in body:
        # notifications/cancelled MUST NOT cancel tasks (SEP-2663); nothing else is expected.
        return Reply(202, None)
    _check_method_header(name, headers)
    method = methods.lookup(methods.MODERN, name)
    if method is None:
        raise MethodNotFound(f"Method not found: {name}")
    _check_name_header(method, params, headers)
    if name == "tools/call":
        _check_param_headers(params, headers)
    meta = _meta(params, headers)
    ctx = RequestContext(principal, meta, request_id=request_id, accepts_sse=headers.accepts_sse)
    return await _call(services, method, ctx, params, server_info=services.server_info)


async def _legacy(
    services: Services, body: dict[str, Any], name: str, params: Any, headers: Headers, principal: str
) -> Reply:
    request_id = body.get("id")
    if name == "initialize" and "id" not in body:
        return Reply(202, None)  # initialize as a notification: nothing to answer
    meta = None
    if name != "initialize":
        assert headers.session_id is not None  # is_legacy: initialize, or a session header
        session = await services.tasks.session(headers.session_id, principal)
        if session is None:
            # 2025-11-25 Streamable HTTP: an unknown session is 404; the client initializes again.
            return Reply(
                404, error_body(request_id, InvalidRequest("Session not found")), request_id=request_id
            )
        meta = RequestMeta.model_validate(
            {
                "io.modelcontextprotocol/protocolVersion": session["protocol_version"],
                "io.modelcontextprotocol/clientCapabilities": session["client_capabilities"],
                "io.modelcontextprotocol/clientInfo": session["client_info"],
                "io.modelcontextprotocol/logLevel": session.get("log_level"),  # logging/setLevel
            }
        )
    if "id" not in body:
        return Reply(202, None)  # notifications/initialized, notifications/cancelled, …
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    method = methods.lookup(methods.LEGACY, name)
    if method is None:
        raise MethodNotFound(f"Method not found: {name}")
    ctx = RequestContext(
        principal, meta, request_id=request_id, session_id=headers.session_id, accepts_sse=headers.accepts_sse
    )
    return await _call(services, method, ctx, params, server_info=None)


async def _call(
    services: Services,
    method: Method[Any],
    ctx: RequestContext,
    params: dict[str, Any],
    *,
    server_info: dict[str, str] | None,
) -> Reply:
    """Validate the params with the method's model, run its handler, shape the reply."""
    if method.requires_tasks:
        ctx.require_tasks()  # before the params: SEP-2663 names -32021 for any such request
    validated = method.params.model_validate(params)
    result = await method.handler(services, ctx, validated)
    request_id = ctx.request_id
    if isinstance(result, Stream):
        return Reply(200, None, request_id=request_id, stream=result)
    if isinstance(result, Deferred):
        return Reply(200, None, deferred=result, request_id=request_id, server_info=server_info)
    headers = None
    if isinstance(result, WithHeaders):
        headers = result.headers
        data = result.result
    else:
        data = dump(result) if isinstance(result, BaseModel) else result
    return Reply(200, result_body(request_id, data, server_info), request_id=request_id, headers=headers)


# ---- 2026-07-28 header and _meta rules -------------------------------------------------------


def _check_method_header(name: str, headers: Headers) -> None:
    if headers.method is None:
        raise HeaderMismatch("Missing Mcp-Method header")
    if headers.method != name:
        raise HeaderMismatch(f"Mcp-Method header {headers.method!r} does not match the body method {name!r}")


def _check_name_header(method: Method[Any], params: dict[str, Any], headers: Headers) -> None:
    field = method.name_param
    if field is None:
        return
    if headers.name is None:
        if method.name_required and field in params:
            raise HeaderMismatch("Missing Mcp-Name header")
        return
    if decode_header_value(headers.name) != params.get(field):
        raise HeaderMismatch(f"Mcp-Name header does not match params.{field}")


def _check_param_headers(params: dict[str, Any], headers: Headers) -> None:
    """SEP-2243: an argument whose schema names an ``x-mcp-header`` travels in the body and in
    ``Mcp-Param-<Name>`` (so intermediaries can route on it); the two MUST agree, and a header
    missing while the body has the argument is refused too (-32020, HTTP 400)."""
    spec = get_tool(params["name"]) if isinstance(params.get("name"), str) else None
    arguments = params.get("arguments")
    if spec is None or not isinstance(arguments, dict):
        return
    for argument, schema in spec.input_schema.get("properties", {}).items():
        header = schema.get("x-mcp-header") if isinstance(schema, dict) else None
        if not isinstance(header, str) or argument not in arguments:
            continue
        sent = headers.params.get(header.lower())
        if sent is None:
            raise HeaderMismatch(f"Missing Mcp-Param-{header} header (arguments.{argument} is set)")
        value = arguments[argument]
        expected = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        if decode_header_value(sent) != expected:
            raise HeaderMismatch(f"Mcp-Param-{header} header does not match arguments.{argument}")


def _meta(params: dict[str, Any], headers: Headers) -> RequestMeta:
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
    if meta.protocol_version not in methods.SUPPORTED_VERSIONS:
        raise UnsupportedVersion(
            f"Unsupported protocol version {meta.protocol_version!r}",
            {"supported": list(ALL_VERSIONS), "requested": meta.protocol_version},
        )
    return meta


# ---- observing -------------------------------------------------------------------------------


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


def _observe(reply: Reply, counted: bool) -> None:
    """Count and time a finished request; log it (method, code, latency; never its params)."""
    code = (reply.body or {}).get("error", {}).get("code", 0) if reply.body else 0
    elapsed = time.perf_counter() - reply.started
    if counted:
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
