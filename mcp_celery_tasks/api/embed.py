"""The MCP endpoint inside a team's own FastAPI or Starlette app.

``mount(app, "/mcp")`` adds the endpoint's routes to ``app`` itself (not a sub-application) and
wraps ``app``'s lifespan, so the services start before the host's own lifespan runs and stop
after it: a mounted sub-app's lifespan never runs, which is how embedded MCP servers usually
break (fastmcp#2671). The host's routes, middleware, exception handlers and lifespan state stay
as they were; its own authentication may give the principal (``principal=``), otherwise the
bearer tokens and JWTs of the settings apply as in the standalone server.

``mount(app, "/mcp", console="/admin/tasks")`` also serves the admins' console there, on the same
running services. It keeps its own sign-in (the admin tokens of ``console_admin_tokens``, never
the host's users nor ``principal=``), its CSRF tokens and its headers (CSP, no framing,
``no-store``), set on its own responses only: the host's routes keep theirs, and the host's
middleware runs around the console's pages as around any route.

Not added: ``/healthz``, ``/readyz`` and ``/metrics`` (the host has its own; the Prometheus
counters are in the default registry of ``prometheus_client`` for the host's exporter).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request

from mcp_celery_tasks.api import compose as composition
from mcp_celery_tasks.api.auth import Authenticator
from mcp_celery_tasks.api.gate import Gate, PrincipalOf
from mcp_celery_tasks.api.server import add_mcp_routes
from mcp_celery_tasks.console import console_routes
from mcp_celery_tasks.console.http import prefix_of
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.settings import Settings, get_settings

__all__ = ["mount"]

_MOUNTED = "mcp_celery_tasks_mounted"


class _ServicesRef:
    """The running services of the app's lifespan, for its MCP routes."""

    services: Services | None = None

    def get(self, request: Request) -> Services:
        if self.services is None:
            raise RuntimeError(
                "mcp_celery_tasks.mount: the app's lifespan has not run. Mount on the app the "
                "server runs (not on an app mounted inside another one), and serve it with "
                "lifespan on (uvicorn's default)."
            )
        return self.services


def mount(
    app: Starlette,
    path: str = "/mcp",
    *,
    settings: Settings | None = None,
    principal: PrincipalOf | None = None,
    console: str | None = None,
) -> None:
    """Serve the MCP endpoint at ``path`` of ``app`` (FastAPI or Starlette), once per app.

    ``principal(request)`` (sync or async), when given, is the host's own authentication: it
    returns the caller's principal (the owner of the tasks it creates: a printable string of at
    most 256 characters, unique per user, e.g. ``"user:42"``), None for HTTP 401, or raises the
    host's own error. Without it, ``settings``' bearer tokens and JWTs apply and the OAuth
    protected-resource metadata is served at ``/.well-known/oauth-protected-resource`` and
    ``/.well-known/oauth-protected-resource<path>``. ``settings`` default to ``MCP_TASKS_*``.

    ``console`` (a path such as ``"/admin/tasks"``, never the root): serve the admins' console
    there too (``console_admin_tokens`` sign in; put the host behind TLS).
    """
    if not path.startswith("/") or path == "/" or path.endswith("/"):
        raise ValueError(f"mount path must start with '/' and not end with one: {path!r}")
    at = None if console is None else prefix_of(console)
    if at is not None and (at == "" or at == path or at.startswith(path + "/") or path.startswith(at + "/")):
        raise ValueError(f"console path must be a path of its own, not the root nor {path!r}'s: {console!r}")
    if getattr(app.state, _MOUNTED, False):
        raise RuntimeError("mcp_celery_tasks.mount: this app already serves the MCP endpoint")
    setattr(app.state, _MOUNTED, True)
    settings = settings or get_settings()
    ref = _ServicesRef()
    gate = Gate(Authenticator(settings), principal_of=principal)
    add_mcp_routes(app, settings, path=path, gate=gate, services_of=ref.get, metadata=principal is None)
    if at is not None:
        app.router.routes[0:0] = console_routes(settings, gate.authenticator.calls_tools, ref.get, prefix=at)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(host: Any) -> AsyncIterator[Any]:
        async with composition.running(settings) as services:
            ref.services = services
            try:
                context: AbstractAsyncContextManager[Any] = inner(host)
                async with context as state:
                    yield state  # the host's own lifespan state, untouched
            finally:
                ref.services = None

    app.router.lifespan_context = lifespan
