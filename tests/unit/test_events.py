"""The event hub: waiters are woken by notifications, never by a per-waiter timer; what a lost
notification hides is found by one batched re-read for everyone."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from mcp_celery_tasks.store import ApiStore, NewTask, TaskRecord
from mcp_celery_tasks.tasks.events import TaskEvents
from tests.memory_api import MemoryApiStore


class CountingStore(MemoryApiStore):
    def __init__(self) -> None:
        super().__init__()
        self.single_reads = 0

    async def get_task(self, task_id: str, owner: str) -> TaskRecord | None:
        self.single_reads += 1
        return await super().get_task(task_id, owner)


def new_task(task_id: str) -> NewTask:
    return NewTask(
        task_id, f"job-{task_id}", "anon", "t", {}, "q", 60_000, 60_000, 100, 3, "2026-07-28", {}, None
    )


async def test_a_thousand_waiters_cost_one_read_each_and_a_few_batched_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = CountingStore()
    hub = TaskEvents(cast(ApiStore, store), safety_s=0.1, poll_s=0.02)
    await hub.start()
    try:
        for i in range(1000):
            await store.create_task(new_task(f"t{i}"))
        waiters = [asyncio.create_task(hub.wait_for(f"t{i}", "anon", 30)) for i in range(1000)]
        await store.state_reads_reach(3)  # three safety sweeps
        assert not any(w.done() for w in waiters)
        # One read each at the start, one more each after the first sweep saw them, then nothing.
        assert store.single_reads <= 2000
        assert store.state_reads <= 6
        before, sweeps = store.single_reads, store.state_reads
        # 20 of the waiters' 30 s pass on the loop's clock at once (any timer of a waiter's own
        # would fire now), then three more sweeps in real time.
        loop = asyncio.get_running_loop()
        real_time = loop.time
        monkeypatch.setattr(loop, "time", lambda: real_time() + 20)
        await store.state_reads_reach(sweeps + 3)
        assert store.single_reads == before  # idle waiters cost nothing
        for i in range(1000):
            store.as_worker_finish(f"t{i}", "completed", result={"content": []})
        done = await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert all(record is not None and record.status == "completed" for record in done)
    finally:
        await hub.stop()


async def test_a_change_whose_notification_was_lost_is_found_by_the_sweep() -> None:
    store = CountingStore()
    hub = TaskEvents(cast(ApiStore, store), safety_s=0.05, poll_s=0.01)
    await hub.start()
    try:
        await store.create_task(new_task("quiet"))
        waiter = asyncio.create_task(hub.wait_for("quiet", "anon", 10))
        await store.state_reads_reach(1)  # the sweep has seen it once
        row = store.rows["quiet"]
        row.status, row.result = "completed", {"content": []}  # changed without any NOTIFY
        record = await asyncio.wait_for(waiter, 3)
        assert record is not None and record.status == "completed"
    finally:
        await hub.stop()
