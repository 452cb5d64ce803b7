"""A subscription stream over the in-memory store: it reads its tasks when the event hub says they
may have changed, never on a timer of its own (the hub's batched re-read finds statusMessage
changes, which send no NOTIFY)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from mcp_celery_tasks.protocol import push
from mcp_celery_tasks.protocol.rpc import Stream
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.store import NewTask, TaskRecord
from mcp_celery_tasks.tasks.service import RequestContext
from mcp_celery_tasks.wire import ListenParams
from tests.memory_api import MemoryApiStore
from tests.unit.conftest import meta

OWNER = "token:alice"
STREAMS = 20
"""Within the default per-principal limit of open subscriptions."""


def new_task(task_id: str) -> NewTask:
    return NewTask(
        task_id, f"job-{task_id}", OWNER, "t", {}, "q", 60_000, 60_000, 100, 3, "2026-07-28", {}, None
    )


async def open_stream(services: Services, task_id: str) -> AsyncIterator[dict[str, Any]]:
    params = ListenParams.model_validate({"notifications": {"taskIds": [task_id]}, "_meta": meta()})
    stream = await push.listen(services, RequestContext(OWNER, params.meta, request_id=1), params)
    assert isinstance(stream, Stream)
    # Read as plain dicts: each test indexes into the message it expects next.
    return cast(AsyncIterator[dict[str, Any]], aiter(stream.messages))


async def test_idle_streams_read_nothing_and_a_status_message_still_arrives(
    services: Services, memory: MemoryApiStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    read_rows = memory.get_tasks

    async def counted(task_ids: Any) -> list[TaskRecord]:  # the streams' own reads of their rows
        nonlocal reads
        reads += 1
        return await read_rows(task_ids)

    memory.get_tasks = counted  # type: ignore[method-assign]
    streams = []
    for i in range(STREAMS):
        await memory.create_task(new_task(f"t{i}"))
        messages = await open_stream(services, f"t{i}")
        assert (await anext(messages))["method"] == "notifications/subscriptions/acknowledged"
        first = await anext(messages)
        assert first["params"]["taskId"] == f"t{i}" and first["params"]["status"] == "working"
        streams.append(messages)
    pending = [asyncio.ensure_future(anext(messages)) for messages in streams]
    try:
        # The hub has seen every task once (one spurious read each) and polled again since.
        await memory.state_reads_reach(2)
        before, hub_reads = reads, services.events.rereads
        # 5.5 s pass on the loop's clock at once: longer than the stream's old timer (5 s) and
        # the hub's safety sweep (5 s); every timer due meanwhile fires, then real polls follow.
        loop = asyncio.get_running_loop()
        real_time = loop.time
        monkeypatch.setattr(loop, "time", lambda: real_time() + 5.5)
        await asyncio.sleep(0.25)
        assert services.events.rereads > hub_reads + 1  # the hub kept polling meanwhile
        assert reads == before  # idle streams cost no reads of their own
        assert not any(p.done() for p in pending)

        memory.rows["t7"].status_message = "epoch 2 of 3"  # no NOTIFY, as a worker's report
        done, _ = await asyncio.wait(pending, timeout=2, return_when=asyncio.FIRST_COMPLETED)
        assert [p.result()["params"]["statusMessage"] for p in done] == ["epoch 2 of 3"]
        assert pending[7] in done
    finally:
        for p in pending:
            p.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await p
        for messages in streams:
            with contextlib.suppress(Exception):
                await messages.aclose()  # type: ignore[attr-defined]
