"""The event hub: waiters are woken by notifications, never by a per-waiter timer; what a lost
notification hides is found by one batched re-read for everyone."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from mcp_celery_tasks.store import ApiStore, NewTask, TaskRecord
from mcp_celery_tasks.tasks.events import TaskEvents
from tests.memory_api import MemoryApiStore


class CountingStore(MemoryApiStore):
    def __init__(self) -> None:
        super().__init__()
        self.single_reads = 0
        self.batched_reads = 0

    async def get_task(self, task_id: str, owner: str) -> TaskRecord | None:
        self.single_reads += 1
        return await super().get_task(task_id, owner)

    async def task_states(self, task_ids: Any) -> list[tuple[Any, ...]]:
        self.batched_reads += 1
        return await super().task_states(task_ids)


def new_task(task_id: str) -> NewTask:
    return NewTask(
        task_id, f"job-{task_id}", "anon", "t", {}, "q", 60_000, 60_000, 100, 3, "2026-07-28", {}, None
    )


async def test_a_thousand_waiters_cost_one_read_each_and_a_few_batched_reads() -> None:
    store = CountingStore()
    hub = TaskEvents(cast(ApiStore, store), safety_s=0.5, poll_s=0.05)
    await hub.start()
    try:
        for i in range(1000):
            await store.create_task(new_task(f"t{i}"))
        waiters = [asyncio.create_task(hub.wait_for(f"t{i}", "anon", 30)) for i in range(1000)]
        await asyncio.sleep(1.6)  # three safety sweeps
        assert not any(w.done() for w in waiters)
        # One read each at the start, one more each after the first sweep saw them, then nothing.
        assert store.single_reads <= 2000
        assert store.batched_reads <= 6
        before = store.single_reads
        await asyncio.sleep(1.0)
        assert store.single_reads == before  # idle waiters cost nothing
        for i in range(1000):
            store.as_worker_finish(f"t{i}", "completed", result={"content": []})
        done = await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert all(record is not None and record.status == "completed" for record in done)
    finally:
        await hub.stop()


async def test_a_change_whose_notification_was_lost_is_found_by_the_sweep() -> None:
    store = CountingStore()
    hub = TaskEvents(cast(ApiStore, store), safety_s=0.3, poll_s=0.05)
    await hub.start()
    try:
        await store.create_task(new_task("quiet"))
        waiter = asyncio.create_task(hub.wait_for("quiet", "anon", 10))
        await asyncio.sleep(0.5)  # the sweep has seen it once
        row = store.rows["quiet"]
        row.status, row.result = "completed", {"content": []}  # changed without any NOTIFY
        record = await asyncio.wait_for(waiter, 3)
        assert record is not None and record.status == "completed"
    finally:
        await hub.stop()
