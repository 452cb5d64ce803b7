"""Per-principal holds (``protocol.holds``): the count is taken at once, refused past the cap with
nothing taken, given back once whatever ends the response (a settled call, a closed stream, an
error, a result that does not wait)."""

from __future__ import annotations

import gc
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import InvalidParams, QuotaExceeded
from mcp_celery_tasks.protocol.holds import Holds
from mcp_celery_tasks.protocol.rpc import Result, Stream
from mcp_celery_tasks.protocol.shapes import Message
from mcp_celery_tasks.protocol.synccall import held


def test_a_take_past_either_cap_is_refused_and_takes_nothing() -> None:
    holds = Holds()
    first = holds.take("alice", wait=2, stream=1)
    with pytest.raises(QuotaExceeded) as refused:
        holds.take("alice", wait=2, stream=1)
    assert refused.value.data == {"limit": "open_streams", "max": 1, "retryAfterMs": 1000}
    assert refused.value.headers == {"Retry-After": "1"}
    assert holds.waits == {"alice": 1}  # the refused take left the wait count alone
    second = holds.take("alice", wait=2)  # a wait without a stream still fits
    with pytest.raises(QuotaExceeded, match="synchronous"):
        holds.take("alice", wait=2)
    holds.take("bob", wait=2, stream=1).release()  # another principal is counted apart
    first.release()
    first.release()  # once only
    assert holds.waits == {"alice": 1} and holds.streams == {}
    second.release()
    assert holds.waits == {}


def test_zero_is_no_limit() -> None:
    holds = Holds()
    taken = [holds.take("alice", wait=0, stream=0) for _ in range(100)]
    assert holds.waits["alice"] == holds.streams["alice"] == 100
    for hold in taken:
        hold.release()
    assert holds.waits == holds.streams == {}


def test_a_hold_dropped_unreleased_is_given_back_when_collected() -> None:
    holds = Holds()
    holds.take("alice", wait=1)
    gc.collect()
    assert holds.waits == {}


async def test_held_gives_the_slot_back_on_an_error_and_on_a_result_that_does_not_wait() -> None:
    holds = Holds()

    async def fails() -> Result:
        assert holds.waits == {"alice": 1}  # taken before the call ran
        raise InvalidParams("no")

    async def answers() -> Result:
        return {"resultType": "complete"}

    hold = holds.take("alice", wait=1)
    with pytest.raises(InvalidParams) as raised:
        await held(hold, fails())
    assert raised.value.code == codes.INVALID_PARAMS and holds.waits == {}
    assert await held(holds.take("alice", wait=1), answers()) == {"resultType": "complete"}
    assert holds.waits == {}


async def test_a_held_stream_gives_its_slot_back_when_closed_early() -> None:
    holds = Holds()

    async def messages() -> AsyncIterator[Message]:
        for n in range(3):
            yield {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"n": n}}

    async def streams() -> Result:
        return Stream(messages())

    kept = await held(holds.take("alice", stream=1), streams())
    assert isinstance(kept, Stream)
    iterator = cast(AsyncGenerator[Message], kept.messages)
    assert await anext(iterator)  # one message sent, then the client goes away
    assert holds.streams == {"alice": 1}
    await iterator.aclose()
    assert holds.streams == {}
