"""What a principal holds open in this API process: synchronous waits and SSE streams.

A synchronous ``tools/call`` keeps its request open until its task ends (up to
``max_sync_wait_seconds``), and a stream (``subscriptions/listen``, a synchronous call relayed on
SSE) keeps a connection and a waiter; one principal opening hundreds of them holds memory, file
descriptors and the event hub for everybody. So each principal may hold at most
``max_sync_waits_per_principal`` waits and ``max_open_streams_per_principal`` streams at once.

The slot is taken when the call is dispatched, **before** its task row exists, with no await
between the check and the count (as ``push._Slot``): a refused call (-32001 ``QuotaExceeded``,
HTTP 429 with ``Retry-After``) leaves no task behind. It is released when the response ends:
the wait settled, the stream's last message sent, the client gone (its await cancelled) or an
error, through ``finally``; a response dropped before it began (the client left while the
request was still being dispatched, so no ``finally`` ever runs) releases it when collected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final

from mcp_celery_tasks.errors import QuotaExceeded
from mcp_celery_tasks.protocol.shapes import Message

__all__ = ["Hold", "Holds", "streamed"]

RETRY_AFTER_S: Final = 1.0
"""What a refusal suggests: the waits of a principal end as their tasks do, any second."""


@dataclass
class Holds:
    """Open synchronous waits and streams per principal, counted in this process."""

    waits: dict[str, int] = field(default_factory=dict)
    streams: dict[str, int] = field(default_factory=dict)

    def take(self, principal: str, *, wait: int | None = None, stream: int | None = None) -> Hold:
        """Reserve a wait (under the cap ``wait``) and/or a stream (under ``stream``) for
        ``principal``; a cap of 0 is no limit, None takes no slot of that kind. Refused with
        ``QuotaExceeded`` when either is full (then nothing is taken)."""
        if wait and self.waits.get(principal, 0) >= wait:
            raise QuotaExceeded(
                f"Too many synchronous calls waiting: at most {wait} at once; wait for one to "
                "finish, or call the tool as a task",
                limit="sync_waits",
                maximum=wait,
                retry_after_s=RETRY_AFTER_S,
            )
        if stream and self.streams.get(principal, 0) >= stream:
            raise QuotaExceeded(
                f"Too many open streams: at most {stream} at once; close one first",
                limit="open_streams",
                maximum=stream,
                retry_after_s=RETRY_AFTER_S,
            )
        kinds: list[dict[str, int]] = []
        if wait is not None:
            kinds.append(self.waits)
        if stream is not None:
            kinds.append(self.streams)
        for counts in kinds:
            counts[principal] = counts.get(principal, 0) + 1
        return Hold(principal, tuple(kinds))


class Hold:
    """One reservation of ``Holds.take``; ``release`` gives it back, once."""

    def __init__(self, principal: str, kinds: tuple[dict[str, int], ...]) -> None:
        self._principal = principal
        self._kinds = kinds

    @property
    def held(self) -> bool:
        return bool(self._kinds)

    def release(self) -> None:
        kinds, self._kinds = self._kinds, ()
        for counts in kinds:
            left = counts.get(self._principal, 1) - 1
            if left > 0:
                counts[self._principal] = left
            else:
                counts.pop(self._principal, None)

    def __del__(self) -> None:
        self.release()


async def streamed(hold: Hold, messages: AsyncIterator[Message]) -> AsyncIterator[Message]:
    """``messages``, with ``hold`` given back once the last is sent or the stream is closed."""
    try:
        async for message in messages:
            yield message
    finally:
        hold.release()
