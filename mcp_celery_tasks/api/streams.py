"""Server-sent event streams of the MCP endpoint: a synchronous call's keep-alives then its
answer, and a notification stream forwarded with keep-alives while it is quiet. Closing either
stream (the client left) cancels what it was waiting for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pydantic_core

from mcp_celery_tasks.protocol.rpc import Stream
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import Message
from mcp_celery_tasks.protocol.shapes import Response as RpcResponse

__all__ = ["sse", "sse_stream"]


async def sse(services: Services, settled: asyncio.Task[RpcResponse]) -> AsyncIterator[str]:
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


async def sse_stream(services: Services, stream: Stream) -> AsyncIterator[str]:
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
