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
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from mcp_celery_tasks.api import compose as composition
from mcp_celery_tasks.api import intake
from mcp_celery_tasks.api.auth import ANONYMOUS, METADATA_PATH, Authenticator, Unauthorized
from mcp_celery_tasks.errors import (
    InfrastructureError,
    InternalError,
    InvalidRequest,
    ProtocolError,
    QuotaExceeded,
)
from mcp_celery_tasks.protocol import dispatch
from mcp_celery_tasks.protocol.rpc import Reply, Stream, error_body, settle
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import Message, RequestId
from mcp_celery_tasks.protocol.shapes import Response as RpcResponse
from mcp_celery_tasks.settings import Settings, get_settings
from mcp_celery_tasks.store import migrate
from mcp_celery_tasks.telemetry import metrics

__all__ = ["create_server", "from_environment"]

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
    services: Services, request: Request, headers: dict[str, str], principal: str, budget: intake.BodyBudget
) -> Reply:
    """Read, parse and dispatch one request within its principal's and the process's limits."""
    settings = services.settings
    quotas = services.tasks.quotas
    limits = await quotas.limits(principal)
    # Unauthenticated callers share one principal: their share of the body budget is per client
    # address instead (the forwarded one behind a trusted proxy: httpserver sets it in the scope).
    holder = principal if principal != ANONYMOUS else f"{ANONYMOUS}@{_client_host(request)}"
    with quotas.request(principal, limits):
        body = await intake.parsed_body(
            request.receive, headers.get("content-length"), settings, budget, holder
        )
        return await dispatch.dispatch(services, body, intake.rpc_headers(headers), principal)


class _Endpoint:
    """An ASGI endpoint over ``handler(request) -> Response``: Starlette's ``request_response``
    without its per-request exception-handler wrapping (this app registers no handlers; an
    escaped exception still reaches ServerErrorMiddleware, a bare 500)."""

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive, send))
        await response(scope, receive, send)


def create_server(settings: Settings) -> FastAPI:
    """The ASGI app. The services start with the lifespan (``app.running``)."""
    authenticator = Authenticator(settings)
    app = _app(settings)
    # The hot path is a plain Starlette route: the JSON-RPC body is parsed and validated by
    # dispatch, so FastAPI's per-request dependency solving and query parsing would buy nothing.
    budget = intake.BodyBudget(
        settings.max_inflight_body_bytes, settings.max_inflight_body_bytes_per_principal
    )
    post = _McpPost(settings, authenticator, budget)
    app.router.routes.append(Route("/mcp", _Endpoint(post), methods=["POST"]))
    _session_routes(app, authenticator)
    _health_routes(app, migrate.head_revision())
    if settings.metrics_enabled:
        app.add_api_route("/metrics", _Prometheus(settings.metrics_token), methods=["GET"])
    return app


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

    def __init__(self, settings: Settings, authenticator: Authenticator, budget: intake.BodyBudget) -> None:
        self.settings = settings
        self.authenticator = authenticator
        self.budget = budget

    async def __call__(self, request: Request) -> Response:
        services: Services = request.state.services
        headers = intake.request_headers(request.scope["headers"])
        origin = headers.get("origin")
        if origin is not None and not _origin_allowed(origin, self.settings):
            return _error(403, InvalidRequest("Origin not allowed"))
        if not _acceptable(headers.get("accept")):
            refused = InvalidRequest("Not Acceptable: accept application/json and text/event-stream")
            return _error(406, refused)
        authorization = headers.get("authorization")
        try:
            if authorization and authorization.count(".") == 2 and self.settings.jwt_jwks_url:
                principal = await asyncio.to_thread(
                    self.authenticator.principal, authorization
                )  # may fetch JWKS
            else:
                principal = self.authenticator.principal(authorization)
        except Unauthorized as exc:
            challenge = self.authenticator.challenge(str(request.base_url), str(exc))
            return _error(401, InvalidRequest(f"Unauthorized: {exc}"), **{"WWW-Authenticate": challenge})
        try:
            reply = await _handle(services, request, headers, principal, self.budget)
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
        return await _respond(services, reply, headers, request)


async def _respond(services: Services, reply: Reply, headers: dict[str, str], request: Request) -> Response:
    """A reply as JSON, an SSE stream of its messages, or a synchronous call awaited."""
    if reply.stream is not None:
        return StreamingResponse(
            _sse_stream(services, reply.stream),
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
            _sse(services, settled),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _json_when_settled(reply, settled, request)


def _session_routes(app: FastAPI, authenticator: Authenticator) -> None:
    """GET and DELETE /mcp (2025-11-25 sessions), and the protected resource metadata."""

    @app.get("/mcp")
    async def mcp_get() -> Response:
        # No standalone server stream (2026-07-28 has none; for 2025-11-25 it is optional).
        return Response(status_code=405, headers={"Allow": "POST, DELETE"})

    @app.delete("/mcp")
    async def mcp_delete(request: Request) -> Response:
        """Ends a 2025-11-25 session; stateless 2026-07-28 requests have none to end."""
        session_id = intake.header_value(intake.request_headers(request.scope["headers"]), "mcp-session-id")
        if session_id is None:
            return Response(status_code=405, headers={"Allow": "POST"})
        try:
            principal = authenticator.principal(request.headers.get("authorization"))
        except Unauthorized:
            return Response(status_code=401)
        deleted = await request.state.services.tasks.end_session(session_id, principal)
        return Response(status_code=200 if deleted else 404)

    @app.get(METADATA_PATH)
    async def protected_resource_metadata(request: Request) -> Response:
        return _json(200, authenticator.metadata(str(request.base_url)))


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


async def _sse(services: Services, settled: asyncio.Task[RpcResponse]) -> AsyncIterator[str]:
    try:
        while True:
            done, _ = await asyncio.wait({settled}, timeout=services.settings.sse_keepalive_seconds)
            if done:
                data = pydantic_core.to_json(settled.result()).decode()
                yield f"event: message\ndata: {data}\n\n"
                return
            yield ": keep-alive\n\n"  # keeps proxies from cutting a long synchronous call
    finally:
        if not settled.done():
            settled.cancel()  # the client closed the stream: cancel the request (and its task)
            with contextlib.suppress(asyncio.CancelledError):
                await settled


async def _sse_stream(services: Services, stream: Stream) -> AsyncIterator[str]:
    """Forward a notification stream as SSE, with keep-alive comments while it is quiet."""
    messages = aiter(stream.messages)
    upcoming: asyncio.Task[Message] | None = None
    try:
        while True:
            if upcoming is None:
                upcoming = asyncio.ensure_future(anext(messages))
            done, _ = await asyncio.wait({upcoming}, timeout=services.settings.sse_keepalive_seconds)
            if not done:
                yield ": keep-alive\n\n"
                continue
            try:
                message = upcoming.result()
            except StopAsyncIteration:
                return
            upcoming = None
            yield f"event: message\ndata: {pydantic_core.to_json(message).decode()}\n\n"
    finally:
        if upcoming is not None and not upcoming.done():
            upcoming.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await upcoming
        with contextlib.suppress(Exception):
            await stream.messages.aclose()  # type: ignore[attr-defined]


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
