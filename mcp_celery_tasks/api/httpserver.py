"""The HTTP server process (the home of uvicorn): limits that keep an API process serving
``/healthz`` and other clients while one client opens thousands of slow connections.

uvicorn arms no timer on a connection until its first response, so a client that connects and
never sends (or trickles a request head) holds a file descriptor forever. ``GuardedProtocol``
closes a connection that has not sent a complete request head within
``request_head_timeout_seconds``, and closes new connections beyond ``max_connections`` per
process or ``max_connections_per_client`` per client address. A request head over
``max_header_count`` headers or ``max_header_bytes`` bytes is answered 431 before the app sees
it (httptools itself buffers a head without bound). Behind a trusted reverse proxy
(``trusted_proxies``) the client address is the one it forwards (``forwarded``): the proxy's
connections are not capped per address, its requests are, per forwarded client, and the app
sees that client in the ASGI scope. uvicorn's own proxy-header middleware is turned off
(``proxy_headers=False``): it believes ``X-Forwarded-For`` from 127.0.0.1 and ::1 (its
``--forwarded-allow-ips`` default) whatever ``trusted_proxies`` says, so a client on the
loopback could pick its address for every per-address limit of the app (the console's sign-in
limit among them). What a process cannot do for
itself (TLS, limits across replicas, per-client rates) belongs in a reverse proxy in front:
``deploy/nginx.conf`` shows one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
from collections import Counter
from typing import Any, TypedDict

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcp_celery_tasks.api.forwarded import Networks, client_address, networks
from mcp_celery_tasks.settings import Settings, get_settings

__all__ = ["GuardedProtocol", "raise_fd_limit", "serve"]

_open_per_client: Counter[str] = Counter()

_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class _Refuse(Exception):
    """Raised in a parser callback: the request is answered ``status`` and the connection closed."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head timeout, head size limits and
    connection caps per client address (the forwarded one behind a trusted proxy)."""

    limits: Settings | None = None
    trusted: Networks | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self._limits()
        self._peer = self.client[0] if self.client else "?"
        self._counted: str | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_pending = False  # until the parser sees a request begin
        self._head_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        self._refusal = 0
        self._behind_proxy = False
        if len(self.connections) > limits.max_connections:
            transport.close()  # over the process's cap: the descriptor goes back at once
            return
        self._behind_proxy = _in(self._peer, self._trusted())
        if not self._behind_proxy:
            # A trusted proxy carries many users: they are counted per request, by the
            # address it forwards (on_headers_complete), never all under the proxy's.
            if _open_per_client[self._peer] >= limits.max_connections_per_client:
                transport.close()
                return
            self._count(self._peer)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        between_requests = self.cycle is None or self.cycle.response_complete
        if between_requests and self._head_timer is None:
            self._arm_head_timer()  # a new request head starts: it must complete in time too
        super().data_received(data)
        # httptools buffers a header until its end, so a head that never ends would grow
        # without bound (10 such connections took an API process past 1 GB).
        if self._head_pending:
            self._head_bytes += len(data)
            if self._head_bytes > self._limits().max_header_bytes and not self.transport.is_closing():
                self._answer(431, "Request head too large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_pending = True
        self._head_bytes = 0
        self._header_count = 0
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self._limits()
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._header_count > limits.max_header_count or self._header_bytes > limits.max_header_bytes:
            self._refusal = 431
            raise _Refuse  # httptools stops parsing; uvicorn answers through send_400_response
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_pending = False
        self._disarm_head_timer()
        if self._behind_proxy:
            limits = self._limits()
            client = client_address(self._peer, self.headers, self._trusted(), limits.forwarded_header)
            self.scope["client"] = (client, 0)  # what the app sees as the client
            if _open_per_client[client] >= limits.max_connections_per_client:
                self._refusal = 503
                raise _Refuse
            self._count(client)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if self._behind_proxy:
            self._uncount()  # the proxy's next request on this connection may be someone else's
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refusal:
            super().send_400_response(msg)
            return
        self._answer(self._refusal, "Too many requests from this client" if self._refusal == 503 else "")

    def _answer(self, status: int, message: str) -> None:
        """A bare response written before any request reached the app, then the connection closed."""
        body = (message or _REASONS[status].decode()).encode()
        head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])
        head += b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body)
        head += b"connection: close\r\n\r\n"
        self.transport.write(head + body)
        self.transport.close()

    def _count(self, client: str) -> None:
        self._uncount()  # a pipelined request behind a proxy replaces the one before it
        _open_per_client[client] += 1
        self._counted = client

    def _uncount(self) -> None:
        client = getattr(self, "_counted", None)
        if client is None:
            return
        _open_per_client[client] -= 1
        if _open_per_client[client] <= 0:
            del _open_per_client[client]
        self._counted = None

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

    @classmethod
    def _trusted(cls) -> Networks:
        if cls.trusted is None:
            cls.trusted = networks(cls._limits().trusted_proxies)
        return cls.trusted


def _in(address: str, trusted: Networks) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(parsed in network for network in trusted)


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
    proxy_headers: bool


def serve(app: Any, settings: Settings, *, host: str, port: int, workers: int, log_level: str) -> None:
    """Run uvicorn with the guarded protocol: ``app`` is the ASGI app, or for ``workers > 1`` an
    import string of a factory (each worker process builds its own app from the environment)."""
    raise_fd_limit()
    GuardedProtocol.limits = settings
    GuardedProtocol.trusted = networks(settings.trusted_proxies)
    options: _UvicornOptions = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": False,
        "http": GuardedProtocol if workers == 1 else "mcp_celery_tasks.api.httpserver:GuardedProtocol",
        "timeout_keep_alive": 5,
        "backlog": 2048,
        "proxy_headers": False,  # forwarded addresses are GuardedProtocol's, from trusted_proxies only
    }
    if workers == 1:
        uvicorn.run(app, **options)
    else:
        uvicorn.run(app, factory=True, workers=workers, **options)
