"""The HTTP edge: Streamable HTTP for protocol 2026-07-28 (stateless, one POST endpoint), and
2025-11-25 sessions on the same path.

Thin on purpose: read the body (bounded), authenticate, check Origin, hand the parsed body to
``dispatch``, and write JSON — or SSE with keep-alive comments for a call that must wait.
Closing that SSE stream cancels the request, and with it the task behind it. What a process
shares (``Services``) is built by ``app.running`` in the lifespan and reaches each request as
lifespan state.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import pydantic_core
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from mcp_celery_tasks.api import compose as composition
from mcp_celery_tasks.api import intake, streams
from mcp_celery_tasks.api.auth import ANONYMOUS, METADATA_PATH, Authenticator, Identity, Unauthorized
from mcp_celery_tasks.api.gate import Gate
from mcp_celery_tasks.console import console_routes
from mcp_celery_tasks.errors import (
    InfrastructureError,
    InternalError,
    InvalidRequest,
    ProtocolError,
    QuotaExceeded,
)
from mcp_celery_tasks.protocol import dispatch
from mcp_celery_tasks.protocol.rpc import Reply, error_body, settle
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import RequestId
from mcp_celery_tasks.protocol.shapes import Response as RpcResponse
from mcp_celery_tasks.settings import Settings, get_settings
from mcp_celery_tasks.store import migrate
from mcp_celery_tasks.telemetry import metrics

__all__ = ["ServicesOf", "add_mcp_routes", "create_server", "from_environment"]

logger = logging.getLogger("mcp_celery_tasks.server")

_JSON = "application/json"
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def _json(status: int, body: object, headers: dict[str, str] | None = None) -> Response:
    return Response(pydantic_core.to_json(body), status_code=status, media_type=_JSON, headers=headers)


def _error(
    status: int, error: ProtocolError, request_id: RequestId | None = None, **headers: str
) -> Response:
    return _json(status, error_body(request_id, error), headers or None)


def _origin_allowed(origin: str, settings: Settings) -> bool:
    if origin in settings.allowed_origins:
        return True
    host = urlsplit(origin).hostname or ""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_ANSWER_TYPES = frozenset({"*/*", "application/*", "application/json", "text/*", "text/event-stream"})


def _acceptable(accept: str | None) -> bool:
    """Whether an ``Accept`` header admits a JSON or an SSE answer. Streamable HTTP has the
    client list both; a header that names neither (``text/html``: a browser, a crawler) gets
    406, while a missing header means anything (RFC 9110 §12.5.1) and a client that lists only
    ``application/json`` is still served: the call then waits for its answer instead of
    streaming. A type refused with ``q=0`` does not count."""
    if accept is None or not accept.strip():
        return True
    for item in accept.split(","):
        media, *parameters = (part.strip().lower() for part in item.split(";"))
        refused = any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in parameters)
        if media in _ANSWER_TYPES and not refused:
            return True
    return False


SSE_COMMIT_S = 2.0
"""A synchronous call that settles within this is answered as plain JSON with its own HTTP
status (-32021: 400); only a longer one commits to an SSE stream and 200. Shorter than any
sensible keep-alive interval: no proxy cuts a request that has been silent for 2 s."""


async def _handle(
    services: Services,
    request: Request,
    headers: dict[str, str],
    identity: Identity,
    budget: intake.BodyBudget,
) -> Reply:
    """Read, parse and dispatch one request within its principal's and the process's limits."""
    settings = services.settings
    principal = identity.principal
    quotas = services.tasks.quotas
    limits = await quotas.limits(principal)
    # Unauthenticated callers share one principal: their share of the body budget is per client
    # address instead (the forwarded one behind a trusted proxy: httpserver sets it in the scope).
    holder = principal if principal != ANONYMOUS else f"{ANONYMOUS}@{_client_host(request)}"
    with quotas.request(principal, limits):
        body = await intake.parsed_body(
            request.receive, headers.get("content-length"), settings, budget, holder
        )
        return await dispatch.dispatch(
            services, body, intake.rpc_headers(headers), principal, identity.scopes
        )


class _Endpoint:
    """An ASGI endpoint over ``handler(request) -> Response``: Starlette's ``request_response``
    without its per-request exception-handler wrapping (this app registers no handlers; an
    escaped exception still reaches ServerErrorMiddleware, a bare 500)."""

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive, send))
        await response(scope, receive, send)


ServicesOf = Callable[[Request], Services]
"""Where a request finds its process's ``Services``: the lifespan state (``create_server``) or the
embedding's own reference (``embed.mount``)."""


def create_server(settings: Settings) -> FastAPI:
    """The ASGI app. The services start with the lifespan (``app.running``)."""
    app = _app(settings)
    authenticator = Authenticator(settings)
    add_mcp_routes(app, settings, path="/mcp", gate=Gate(authenticator), services_of=_lifespan_services)
    if settings.console_enabled:
        app.router.routes[0:0] = console_routes(settings, authenticator.calls_tools, _lifespan_services)
    _health_routes(app, migrate.head_revision())
    if settings.metrics_enabled:
        app.add_api_route("/metrics", _Prometheus(settings.metrics_token), methods=["GET"])
    return app


def _lifespan_services(request: Request) -> Services:
    services: Services = request.state.services
    return services


def add_mcp_routes(
    app: Starlette,
    settings: Settings,
    *,
    path: str,
    gate: Gate,
    services_of: ServicesOf,
    metadata: bool = True,
) -> None:
    """POST, GET and DELETE ``path``, and (``metadata``) the OAuth protected-resource metadata at
    the root well-known URL and at its path-inserted form (RFC 9728 §3.1:
    ``/.well-known/oauth-protected-resource/mcp`` for ``/mcp``). Put first in ``app``'s routes:
    a host's catch-all route added earlier must not shadow them."""
    # The hot path is a plain Starlette route: the JSON-RPC body is parsed and validated by
    # dispatch, so FastAPI's per-request dependency solving and query parsing would buy nothing.
    budget = intake.BodyBudget(
        settings.max_inflight_body_bytes, settings.max_inflight_body_bytes_per_principal
    )
    post = _McpPost(settings, gate, budget, services_of)
    routes = [
        Route(path, _Endpoint(post), methods=["POST"]),
        Route(path, _Endpoint(_mcp_get), methods=["GET"]),
        Route(path, _Endpoint(_McpDelete(gate, services_of)), methods=["DELETE"]),
    ]
    if metadata:
        document = _Endpoint(lambda request: _metadata(gate, request))
        routes += [
            Route(METADATA_PATH, document, methods=["GET"]),
            Route(METADATA_PATH + path, document, methods=["GET"]),
        ]
    app.router.routes[0:0] = routes


async def _metadata(gate: Gate, request: Request) -> Response:
    return _json(200, gate.authenticator.metadata(str(request.base_url)))


async def _mcp_get(request: Request) -> Response:
    # No standalone server stream (2026-07-28 has none; for 2025-11-25 it is optional).
    return Response(status_code=405, headers={"Allow": "POST, DELETE"})


class _McpDelete:
    """DELETE: ends a 2025-11-25 session; stateless 2026-07-28 requests have none to end."""

    def __init__(self, gate: Gate, services_of: ServicesOf) -> None:
        self.gate = gate
        self.services_of = services_of

    async def __call__(self, request: Request) -> Response:
        headers = intake.request_headers(request.scope["headers"])
        session_id = intake.header_value(headers, "mcp-session-id")
        if session_id is None:
            return Response(status_code=405, headers={"Allow": "POST"})
        try:
            principal = await self.gate.principal(request, headers.get("authorization"))
        except Unauthorized:
            return Response(status_code=401)
        deleted = await self.services_of(request).tasks.end_session(session_id, principal)
        return Response(status_code=200 if deleted else 404)


def _app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Services]]:
        async with composition.running(settings) as services:
            yield {"services": services}

    return FastAPI(
        title="mcp-celery-tasks",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # FastAPI's own request spans only when this process exports traces (tracing.configure);
        # otherwise it looks up three OpenTelemetry providers on every request for nothing.
        telemetry={
            "tracing": bool(settings.trace_file or settings.otlp_endpoint),
            "metrics": False,
            "logs": False,
        },
    )


class _McpPost:
    """POST /mcp: Origin, authentication, then read, dispatch and answer one JSON-RPC message."""

    def __init__(
        self, settings: Settings, gate: Gate, budget: intake.BodyBudget, services_of: ServicesOf
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.budget = budget
        self.services_of = services_of

    async def __call__(self, request: Request) -> Response:
        services = self.services_of(request)
        headers = intake.request_headers(request.scope["headers"])
        origin = headers.get("origin")
        if origin is not None and not _origin_allowed(origin, self.settings):
            return _error(403, InvalidRequest("Origin not allowed"))
        if not _acceptable(headers.get("accept")):
            refused = InvalidRequest("Not Acceptable: accept application/json and text/event-stream")
            return _error(406, refused)
        try:
            identity = await self.gate.identity(request, headers.get("authorization"))
        except Unauthorized as exc:
            challenge = self.gate.challenge(str(request.base_url), str(exc))
            return _error(401, InvalidRequest(f"Unauthorized: {exc}"), **{"WWW-Authenticate": challenge})
        try:
            reply = await _handle(services, request, headers, identity, self.budget)
        except QuotaExceeded as exc:
            return _error(exc.http_status, exc, **exc.headers)
        except intake.Busy:
            busy = InternalError("The server is busy reading other large requests; retry shortly")
            return _error(503, busy, **{"Retry-After": "1"})
        except intake.Refused as refused:
            return _error(refused.status, refused.error, refused.request_id)
        except intake.TooSlow:
            slow = InvalidRequest(
                f"Request body not received within {self.settings.body_read_timeout_seconds} s"
            )
            return _error(408, slow, Connection="close")
        except intake.Disconnected:
            return Response(status_code=499)  # nobody reads it: the client left mid-body
        if reply.http_status == 403 and reply.headers and "WWW-Authenticate" in reply.headers:
            # insufficient_scope: the client finds the authorization server from here (step-up).
            where = self.gate.authenticator.metadata_url(str(request.base_url))
            reply.headers["WWW-Authenticate"] += f', resource_metadata="{where}"'
        return await _respond(services, reply, headers, request)


async def _respond(services: Services, reply: Reply, headers: dict[str, str], request: Request) -> Response:
    """A reply as JSON, an SSE stream of its messages, or a synchronous call awaited."""
    if reply.stream is not None:
        return StreamingResponse(
            streams.sse_stream(services, reply.stream),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(reply.headers or {})},
        )
    if reply.sync is None:
        if reply.body is None:
            return Response(status_code=reply.http_status, headers=reply.headers)
        return _json(reply.http_status, reply.body, reply.headers)
    settled = asyncio.create_task(settle(reply))
    if "text/event-stream" in headers.get("accept", ""):
        # A call that settles at once is answered as JSON, with its own status (-32021 is
        # HTTP 400); a longer one streams, and its status is committed as 200.
        try:
            done, _ = await asyncio.wait({settled}, timeout=SSE_COMMIT_S)
        except asyncio.CancelledError:
            settled.cancel()
            raise
        if done:
            return _json(reply.http_status, settled.result())
        return StreamingResponse(
            streams.sse(services, settled),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _json_when_settled(reply, settled, request)


def _health_routes(app: FastAPI, head: str | None) -> None:
    @app.get("/healthz")
    async def healthz() -> Response:
        """The process is alive (it answers); nothing else is checked."""
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Ready: Postgres answers with the migrations at head, and the broker is reachable."""
        services: Services = request.state.services
        checks: dict[str, str] = {}
        try:
            revision = await asyncio.wait_for(services.store.schema_revision(), 5)
            checks["postgres"] = "ok"
            checks["migrations"] = "ok" if revision == head else f"at {revision}, head is {head}"
        except (InfrastructureError, TimeoutError):
            checks["postgres"] = "unreachable"
        try:
            reached = await asyncio.wait_for(asyncio.wrap_future(services.publisher.check_broker()), 5)
            checks["broker"] = "ok" if reached else "unreachable"
        except TimeoutError:
            checks["broker"] = "unreachable"
        ready = all(value == "ok" for value in checks.values()) and len(checks) == 3
        return _json(200 if ready else 503, {"ready": ready, "checks": checks})


def _client_host(request: Request) -> str:
    return request.client.host if request.client else "?"


class _Prometheus:
    """GET /metrics: for loopback clients (a scraper beside the process, or through a port
    forward), or anyone presenting ``metrics_token``. The counters name tools, queues and load;
    nothing a caller of the MCP endpoint needs, and a public page for an attacker's timing."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    async def __call__(self, request: Request) -> Response:
        if not self._allowed(request):
            return Response(status_code=403)
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE_LATEST)

    def _allowed(self, request: Request) -> bool:
        presented = request.headers.get("authorization", "")
        if self.token is not None:
            scheme, _, token = presented.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                token.strip().encode(), self.token.encode()
            ):
                return True
        try:
            return ipaddress.ip_address(_client_host(request)).is_loopback
        except ValueError:
            return False


def from_environment() -> FastAPI:
    """``uvicorn --factory mcp_celery_tasks.api.server:from_environment``: the app from ``MCP_TASKS_*``
    (what ``serve --workers N`` runs in each worker process)."""
    return create_server(get_settings())


async def _json_when_settled(reply: Reply, settled: asyncio.Task[RpcResponse], request: Request) -> Response:
    try:
        while True:
            done, _ = await asyncio.wait({settled}, timeout=1.0)
            if done:
                return _json(reply.http_status, settled.result())
            if await request.is_disconnected():
                settled.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await settled
                return Response(status_code=499)
    finally:
        if not settled.done():
            settled.cancel()
