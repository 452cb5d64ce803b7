"""Reading one request at the HTTP edge: its headers once, its body bounded, parsed and checked.

What ``server`` hands to ``dispatch``: the parsed JSON-RPC body and the few header values the
2026-07-28 rules compare against it. A body that cannot be handled is refused here (``Refused``:
the HTTP status and the JSON-RPC error to answer), before any of it reaches the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any, NoReturn

from mcp_celery_tasks.errors import InvalidRequest, ParseError, ProtocolError
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.protocol import rpc
from mcp_celery_tasks.protocol.shapes import RequestId
from mcp_celery_tasks.settings import Settings

__all__ = [
    "BUDGET_WAIT_S",
    "LARGE_BODY",
    "BodyBudget",
    "Busy",
    "Disconnected",
    "Refused",
    "TooSlow",
    "header_value",
    "parsed_body",
    "read_body",
    "request_headers",
    "rpc_headers",
]

LARGE_BODY = 64 * 1024
"""Bodies above this size share the process's parse budget (``max_inflight_body_bytes``)."""
BUDGET_WAIT_S = 10.0


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
"""An ASGI ``receive``."""


class Busy(Exception):
    """The large-body budget stayed full for ``BUDGET_WAIT_S``."""


class Disconnected(Exception):
    """The client went away before its whole body arrived."""


class TooSlow(Exception):
    """The body did not arrive whole within ``body_read_timeout_seconds`` (HTTP 408)."""


class Refused(Exception):
    """The request is answered before dispatch (too large, not JSON, not storable)."""

    def __init__(self, status: int, error: ProtocolError, request_id: RequestId | None = None) -> None:
        super().__init__(str(error))
        self.status = status
        self.error = error
        self.request_id = request_id


class BodyBudget:
    """Bytes of large request bodies read and parsed at once in this process: concurrent large
    bodies wait for each other instead of taking the memory they would expand to.

    Each holder (a principal; for unauthenticated callers a client address) may hold at most
    ``share`` of it: 64 bodies trickled in by one principal fill its share, never the process's
    budget, so another principal's large request is still read at once.
    """

    def __init__(self, limit: int, share: int | None = None) -> None:
        self.limit = limit
        self.share = min(share or limit, limit)
        self.used = 0
        self.held: dict[str, int] = {}
        self._freed = asyncio.Condition()

    def _fits(self, holder: str, size: int) -> bool:
        return self.used + size <= self.limit and self.held.get(holder, 0) + size <= self.share

    @contextlib.asynccontextmanager
    async def reserve(self, size: int, holder: str = "") -> AsyncIterator[None]:
        size = min(size, self.share)
        async with self._freed:
            try:
                await asyncio.wait_for(self._freed.wait_for(lambda: self._fits(holder, size)), BUDGET_WAIT_S)
            except TimeoutError:
                raise Busy from None
            self.used += size
            self.held[holder] = self.held.get(holder, 0) + size
        try:
            yield
        finally:
            async with self._freed:
                self.used -= size
                left = self.held[holder] - size
                if left:
                    self.held[holder] = left
                else:
                    del self.held[holder]
                self._freed.notify_all()


def request_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Every header of an ASGI scope's ``headers`` in one pass (ASGI names are lower-case). A
    repeated header keeps its first value, as Starlette's ``Headers.get`` does: read in reverse,
    the first one lands last."""
    return {key.decode("latin-1"): value.decode("latin-1") for key, value in reversed(list(raw))}


def header_value(headers: dict[str, str], name: str) -> str | None:
    value = headers.get(name)
    return value.strip() if value is not None else None


def rpc_headers(headers: dict[str, str]) -> rpc.Headers:
    """The header values dispatch checks the body against."""
    return rpc.Headers(
        protocol_version=header_value(headers, "mcp-protocol-version"),
        method=header_value(headers, "mcp-method"),
        name=header_value(headers, "mcp-name"),
        session_id=header_value(headers, "mcp-session-id"),
        accepts_sse="text/event-stream" in headers.get("accept", ""),
        params={
            key[len("mcp-param-") :]: value.strip()
            for key, value in headers.items()
            if key.startswith("mcp-param-")
        },
    )


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes | None:
    """The body, or None when it is (or declares itself) larger than ``limit`` bytes."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:  # Request.stream() without its async generator: one message for most bodies
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity are JavaScript, not JSON


class _DuplicateKey(Exception):
    """A JSON object names one key twice."""


def _unique_keys(pairs: list[tuple[str, JSONValue]]) -> dict[str, JSONValue]:
    # RFC 8259 leaves duplicate names to the parser: Python keeps the last, some proxies and
    # gateways the first. A request that means two things to two parsers is refused instead.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _DuplicateKey(repeated)
    return obj


_DECODER = json.JSONDecoder(parse_constant=_no_constants, object_pairs_hook=_unique_keys)


async def parsed_body(
    receive: Receive, declared: str | None, settings: Settings, budget: BodyBudget, holder: str = ""
) -> JSONValue:
    """The JSON body, refused (``Refused``) when too large, not JSON or not storable. A body that
    declares more than ``LARGE_BODY`` bytes (or declares nothing) is read and parsed within
    ``holder``'s share of ``budget`` (``Busy`` when it stays full). The body must arrive within
    ``body_read_timeout_seconds`` (``TooSlow``)."""
    size = int(declared) if declared is not None and declared.isdigit() else settings.max_body_bytes
    async with budget.reserve(size, holder) if size > LARGE_BODY else contextlib.nullcontext():
        return await _parse(receive, declared, settings)


async def _parse(receive: Receive, declared: str | None, settings: Settings) -> JSONValue:
    try:
        async with asyncio.timeout(settings.body_read_timeout_seconds):
            raw = await read_body(receive, declared, settings.max_body_bytes)
    except TimeoutError:
        raise TooSlow from None
    if raw is None:
        raise Refused(413, InvalidRequest(f"Request body larger than {settings.max_body_bytes} bytes"))
    # An upper bound of the objects and arrays parsing would build (braces inside strings count
    # too): refused before json.loads allocates them.
    if raw.count(b"{") + raw.count(b"[") > settings.max_json_containers:
        tooling = InvalidRequest(
            f"Request body holds more than {settings.max_json_containers} JSON objects and arrays"
        )
        raise Refused(413, tooling)
    try:
        body: JSONValue = _DECODER.decode(raw.decode("utf-8-sig"))  # RFC 8259: UTF-8; a BOM may be ignored
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Refused(400, ParseError("Parse error: the body is not valid JSON")) from None
    except _DuplicateKey as duplicate:
        named = json.dumps(str(duplicate))[:100]
        raise Refused(
            400, InvalidRequest(f"Invalid request: the key {named} appears twice in one object")
        ) from None
    problem = rpc.unstorable(body)
    if problem is not None:
        raw_id = body.get("id") if isinstance(body, dict) else None
        request_id = raw_id if rpc.unstorable(raw_id) is None and rpc.valid_id(raw_id) else None
        raise Refused(400, InvalidRequest(f"Invalid request: {problem}"), request_id)
    return body
