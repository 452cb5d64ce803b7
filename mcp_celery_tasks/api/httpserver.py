"""The HTTP server process (the home of uvicorn): limits that keep an API process serving
``/healthz`` and other clients while one client opens thousands of slow connections.

uvicorn arms no timer on a connection until its first response, so a client that connects and
never sends (or trickles a request head) holds a file descriptor forever. ``GuardedProtocol``
closes a connection that has not sent a complete request head within
``request_head_timeout_seconds``, and closes new connections beyond ``max_connections`` per
process or ``max_connections_per_client`` per client address. What a process cannot do for
itself (TLS, limits across replicas, per-client rates) belongs in a reverse proxy in front:
``deploy/nginx.conf`` shows one.
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from typing import Any, TypedDict

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcp_celery_tasks.settings import Settings, get_settings

__all__ = ["GuardedProtocol", "raise_fd_limit", "serve"]

_open_per_client: Counter[str] = Counter()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head timeout and connection caps."""

    limits: Settings | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self._limits()
        self._peer = self.client[0] if self.client else "?"
        self._counted = False
        self._head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > limits.max_connections:
            transport.close()  # over the process's cap: the descriptor goes back at once
            return
        if _open_per_client[self._peer] >= limits.max_connections_per_client:
            transport.close()
            return
        _open_per_client[self._peer] += 1
        self._counted = True
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_counted", False):
            _open_per_client[self._peer] -= 1
            if _open_per_client[self._peer] <= 0:
                del _open_per_client[self._peer]
            self._counted = False
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        between_requests = self.cycle is None or self.cycle.response_complete
        if between_requests and self._head_timer is None:
            self._arm_head_timer()  # a new request head starts: it must complete in time too
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        super().on_headers_complete()

    def _arm_head_timer(self) -> None:
        timeout = self._limits().request_head_timeout_seconds
        self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    @classmethod
    def _limits(cls) -> Settings:
        if cls.limits is None:
            cls.limits = get_settings()  # each uvicorn worker process reads its own environment
        return cls.limits


def raise_fd_limit() -> int:
    """Raise this process's soft file-descriptor limit to the hard one; returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _UvicornOptions(TypedDict):
    """The ``uvicorn.run`` options ``serve`` passes for one worker or many."""

    host: str
    port: int
    log_level: str
    access_log: bool
    http: type[GuardedProtocol] | str
    timeout_keep_alive: int
    backlog: int


def serve(app: Any, settings: Settings, *, host: str, port: int, workers: int, log_level: str) -> None:
    """Run uvicorn with the guarded protocol: ``app`` is the ASGI app, or for ``workers > 1`` an
    import string of a factory (each worker process builds its own app from the environment)."""
    raise_fd_limit()
    GuardedProtocol.limits = settings
    options: _UvicornOptions = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": False,
        "http": GuardedProtocol if workers == 1 else "mcp_celery_tasks.api.httpserver:GuardedProtocol",
        "timeout_keep_alive": 5,
        "backlog": 2048,
    }
    if workers == 1:
        uvicorn.run(app, **options)
    else:
        uvicorn.run(app, factory=True, workers=workers, **options)
