"""The detail page's live updates: an SSE stream fed by the process's task event hub.

The stream registers its task with the hub (``watch``: status transitions, NOTIFY; ``polled``:
statusMessage and progress, which send none, found by the hub's one batched re-read per
``push_recheck_seconds`` for the whole process). The page's rows are read again only when the hub
says the task may have changed, so an open page costs no query of its own while nothing happens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from mcp_celery_tasks.console.views import live_state
from mcp_celery_tasks.protocol.services import Services

__all__ = ["KEEPALIVE_S", "changes"]

KEEPALIVE_S = 15.0


async def changes(services: Services, task_id: str, job_id: str) -> AsyncIterator[str]:
    """SSE messages: the task's state now, then after every change, until nothing can change."""
    events = services.events
    last: str | None = None
    with events.watch(task_id) as changed, events.polled(task_id):
        while True:
            changed.clear()  # before the read: a change after it wakes us
            detail = await services.store.console_task(job_id)
            if detail is None:
                yield "event: gone\ndata: {}\n\n"
                return
            state = live_state(detail.task, detail.inputs)
            data = json.dumps(state, ensure_ascii=True)
            if data != last:
                last = data
                yield f"event: state\ndata: {data}\n\n"
            if state["final"]:
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield ": keep-alive\n\n"
