"""JSON-RPC dispatch over the method table: era, headers, ``_meta``, params, errors.

No HTTP here: the transport hands over the parsed body plus the few header values the
2026-07-28 rules compare against the body (``rpc.Headers``), and gets back an ``rpc.Reply``; a
synchronous call's reply carries its ``SyncCall``, which the transport settles (``rpc.settle``)
without coming back here. Era detection happens here only (``_is_legacy``). A request belongs to the
2026-07-28 era (stateless, ``_meta`` on every request, Streamable HTTP header rules, errors with
their HTTP status) unless it is a 2025-11-25 handshake request (``initialize``, or a session
header without modern ``_meta``), which is served from the session and answered with HTTP 200
(the 1.x SDKs read JSON-RPC errors only from 200 responses).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pydantic import BaseModel, ValidationError

from mcp_celery_tasks.errors import (
    HeaderMismatch,
    InsufficientScope,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    UnsupportedVersion,
)
from mcp_celery_tasks.json_types import JSONObject, JSONValue, as_object
from mcp_celery_tasks.protocol import methods
from mcp_celery_tasks.protocol import v2025_11_25 as legacy
from mcp_celery_tasks.protocol.rpc import (
    Headers,
    Method,
    Reply,
    Stream,
    WithHeaders,
    as_protocol_error,
    decode_header_value,
    error_body,
    observe,
    result_body,
    valid_id,
)
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import RequestId, ServerInfo
from mcp_celery_tasks.protocol.synccall import SyncCall
from mcp_celery_tasks.tasks.service import RequestContext
from mcp_celery_tasks.telemetry import semconv
from mcp_celery_tasks.tools.registry import get_tool
from mcp_celery_tasks.wire import ALL_VERSIONS, LEGACY_VERSIONS, RequestMeta, dump

__all__ = ["dispatch"]

logger = logging.getLogger("mcp_celery_tasks.dispatch")


# ---- entry points ------------------------------------------------------------------------------


async def dispatch(
    services: Services,
    body: JSONValue,
    headers: Headers,
    principal: str,
    scopes: frozenset[str] | None = None,
) -> Reply:
    """Answer one parsed request body (any JSON: what is not a request is refused here).
    ``scopes``: those of the caller's JWT (None: not scope-limited)."""
    raw_id = body.get("id") if isinstance(body, dict) else None
    request_id = raw_id if valid_id(raw_id) else None
    name = body.get("method") if isinstance(body, dict) else None
    label = name if isinstance(name, str) and name in methods.NAMES else "other"
    started = time.perf_counter()
    operation = _operation(label, body, headers, request_id)
    with semconv.current(operation):
        try:
            reply = await _dispatch(services, body, headers, principal, scopes)
        except Exception as exc:
            error = as_protocol_error(exc)
            reply = Reply(error.http_status, error_body(request_id, error), request_id=request_id)
            reply.headers = error.headers or None  # Retry-After of a quota or an outage
    reply.method, reply.started, reply.operation = label, started, operation
    reply.counted = services.settings.metrics_enabled
    if reply.sync is None:
        observe(reply)  # a stream's span ends here, when it opens; a synchronous call's when it settles
    return reply


def _operation(
    method: str, body: JSONValue, headers: Headers, request_id: RequestId | None
) -> semconv.Operation:
    """The request's span of the MCP conventions (``telemetry.semconv``)."""
    params = body.get("params") if isinstance(body, dict) else None
    params = params if isinstance(params, dict) else {}
    tool = params.get("name") if method == "tools/call" else None
    known = tool if isinstance(tool, str) and get_tool(tool) is not None else None
    meta = params.get("_meta")
    version = meta.get("io.modelcontextprotocol/protocolVersion") if isinstance(meta, dict) else None
    return semconv.start(
        method,
        params,
        tool=known,
        request_id=request_id,
        protocol_version=version if isinstance(version, str) else headers.protocol_version,
        session_id=headers.session_id,
    )


# ---- routing -----------------------------------------------------------------------------------


def _is_legacy(body: JSONValue, session_id: str | None, header_version: str | None) -> bool:
    """Whether a request belongs to the handshake era (2025-11-25 and before): ``initialize``,
    or a session header, without 2026-07-28 ``_meta`` or a modern version header."""
    if not isinstance(body, dict):
        return False
    params = body.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    modern_meta = isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta
    if modern_meta or (header_version is not None and header_version not in LEGACY_VERSIONS):
        # A 2026-07-28 request is served statelessly, session header or not; there,
        # ``initialize`` does not exist (-32601, HTTP 404).
        return False
    return body.get("method") == "initialize" or session_id is not None


async def _dispatch(
    services: Services, body: JSONValue, headers: Headers, principal: str, scopes: frozenset[str] | None
) -> Reply:
    if isinstance(body, list):
        raise InvalidRequest("JSON-RPC batches are not supported")
    if isinstance(body, dict) and "id" in body and not valid_id(body["id"]):
        raise InvalidRequest("The request id must be a string or an integer")
    if isinstance(body, dict) and "method" not in body and ("result" in body or "error" in body):
        # A client's response to one of our 2025-11-25 server-to-client requests.
        if headers.session_id is not None:
            await legacy.client_response(services, principal, body)
        return Reply(202, None)
    name = body.get("method") if isinstance(body, dict) else None
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(name, str):
        raise InvalidRequest("Not a JSON-RPC 2.0 request")
    raw_id = body.get("id")
    request_id = raw_id if valid_id(raw_id) else None  # absent (a notification): checked above
    params = body.get("params", {})
    if params is None:
        params = {}
    if _is_legacy(body, headers.session_id, headers.protocol_version):
        try:
            return await _legacy(services, body, name, params, headers, principal, scopes)
        except InsufficientScope:
            raise  # an authorization error of the transport: 403 on either revision
        except Exception as exc:
            # 2025-11-25 clients read JSON-RPC errors from 200 responses (the 1.x SDKs treat a
            # 4xx as a transport failure); the status codes are 2026-07-28 rules.
            return Reply(200, error_body(request_id, as_protocol_error(exc)), request_id=request_id)
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    if "id" not in body:
        # notifications/cancelled MUST NOT cancel tasks (SEP-2663); nothing else is expected.
        return Reply(202, None)
    if _sessionless_legacy(params, headers):
        # 2025-11-25 Streamable HTTP: a server that requires a session answers a request without
        # one (other than initialize) with 400 Bad Request; the 2026-07-28 header errors would
        # send such a client looking for an Mcp-Method header its revision does not know.
        raise InvalidRequest(
            "Bad Request: no Mcp-Session-Id header. A 2025-11-25 client sends initialize first, "
            "then its session id; a 2026-07-28 request carries Mcp-Method and params._meta"
        )
    _check_method_header(name, headers)
    method = methods.lookup(methods.MODERN, name)
    if method is None:
        raise MethodNotFound(f"Method not found: {name}")
    _check_name_header(method, params, headers)
    if method.param_headers:
        _check_param_headers(params, headers)
    meta = _meta(params, headers)
    ctx = RequestContext(
        principal, meta, request_id=request_id, accepts_sse=headers.accepts_sse, scopes=scopes
    )
    return await _call(services, method, ctx, params, server_info=services.server_info)


def _sessionless_legacy(params: JSONObject, headers: Headers) -> bool:
    """A request of the handshake era (a 2025-11-25 or older version header, or none) with no
    session, no ``Mcp-Method`` header and no 2026-07-28 ``_meta``: nothing marks it as modern."""
    meta = params.get("_meta")
    if isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta:
        return False
    version = headers.protocol_version
    return headers.method is None and (version is None or version in LEGACY_VERSIONS)


async def _legacy(
    services: Services,
    body: JSONObject,
    name: str,
    params: JSONValue,
    headers: Headers,
    principal: str,
    scopes: frozenset[str] | None,
) -> Reply:
    raw_id = body.get("id")
    request_id = raw_id if valid_id(raw_id) else None  # absent (a notification): checked by _dispatch
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
        principal,
        meta,
        request_id=request_id,
        session_id=headers.session_id,
        accepts_sse=headers.accepts_sse,
        scopes=scopes,
    )
    return await _call(services, method, ctx, params, server_info=None)


async def _call(
    services: Services,
    method: Method[Any],
    ctx: RequestContext,
    params: JSONObject,
    *,
    server_info: ServerInfo | None,
) -> Reply:
    """Validate the params with the method's model, run its handler, shape the reply."""
    if method.requires_tasks:
        ctx.require_tasks()  # before the params: SEP-2663 names -32021 for any such request
    validated = method.params.model_validate(params)
    result = await method.handler(services, ctx, validated)
    request_id = ctx.request_id
    if isinstance(result, Stream):
        return Reply(200, None, request_id=request_id, stream=result)
    if isinstance(result, SyncCall):
        return Reply(200, None, sync=result, request_id=request_id, server_info=server_info)
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


def _check_name_header(method: Method[Any], params: JSONObject, headers: Headers) -> None:
    field = method.name_param
    if field is None:
        return
    if headers.name is None:
        if method.name_required and field in params:
            raise HeaderMismatch("Missing Mcp-Name header")
        return
    if decode_header_value(headers.name) != params.get(field):
        raise HeaderMismatch(f"Mcp-Name header does not match params.{field}")


def _check_param_headers(params: JSONObject, headers: Headers) -> None:
    """SEP-2243: an argument whose schema names an ``x-mcp-header`` travels in the body and in
    ``Mcp-Param-<Name>`` (so intermediaries can route on it); the two MUST agree, and a header
    missing while the body has the argument is refused too (-32020, HTTP 400)."""
    name = params.get("name")
    spec = get_tool(name) if isinstance(name, str) else None
    arguments = params.get("arguments")
    if spec is None or not isinstance(arguments, dict):
        return
    for argument, schema in as_object(spec.input_schema.get("properties")).items():
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


def _meta(params: JSONObject, headers: Headers) -> RequestMeta:
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
