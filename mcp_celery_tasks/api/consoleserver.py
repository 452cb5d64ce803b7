"""The console on its own port (``mcp-celery-tasks console``): the admins' pages and nothing
else, no MCP endpoint, no health or metrics routes.

It runs the API's composition (``compose.running``): its pages read the store, follow tasks
through the event hub (live pages), and cancel and retry through the task service, which
publishes wake-ups and revokes to the broker and releases retried jobs through the fair
publisher, as an API replica does. A retry counts against its principal's quotas, shared with
the API replicas (``shared_load``); the demand gauges are not sampled (nothing scrapes this
process). The console's prefix is the root by default (``--path``): it owns the port.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request

from mcp_celery_tasks.api import compose as composition
from mcp_celery_tasks.api.auth import Authenticator
from mcp_celery_tasks.console import console_routes
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.settings import Settings

__all__ = ["DEFAULT_PORT", "NoAdmins", "create_console_server", "exposure_warning"]

logger = logging.getLogger("mcp_celery_tasks.console")

DEFAULT_PORT = 8090
"""The console command's port: not ``serve``'s 8000, nor the 8001 the README suggests for a
second dev stack."""


class NoAdmins(ValueError):
    """No admin token is configured: nobody could sign in to the console."""


def create_console_server(settings: Settings, *, path: str = "/") -> Starlette:
    """The console's ASGI app at ``path``; the services start with its lifespan. ``NoAdmins``
    without ``console_admin_tokens``; ``ValueError`` for a malformed one or a bad ``path``."""
    if not settings.console_admin_tokens:
        raise NoAdmins(
            "MCP_TASKS_CONSOLE_ADMIN_TOKENS is empty: nobody could sign in. Set it to "
            '{"<name>": "<SHA-256 hex of the admin\'s token>"} (see the README\'s console section)'
        )
    # Metrics off: no /metrics here, so no demand gauges sampled for nobody.
    settings = settings.model_copy(update={"metrics_enabled": False})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Services]]:
        async with composition.running(settings) as services:
            yield {"services": services}

    routes = console_routes(settings, Authenticator(settings).calls_tools, _services, prefix=path)
    return Starlette(routes=list(routes), lifespan=lifespan)


def _services(request: Request) -> Services:
    services: Services = request.state.services
    return services


def exposure_warning(host: str, settings: Settings) -> str | None:
    """What to say when the console listens beyond this machine: its session cookie and admin
    tokens then cross the network, which only TLS (a reverse proxy in front) protects."""
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to anything
    tls = settings.resource_url is not None and settings.resource_url.startswith("https://")
    return (
        f"the console listens on {host}, beyond this machine: put it behind a TLS reverse proxy "
        "(admin tokens and session cookies cross the network in the clear otherwise)"
        + ("" if tls else "; set MCP_TASKS_RESOURCE_URL=https://… so its cookies are sent over https only")
    )
