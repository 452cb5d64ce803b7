"""The detail page's live updates: an SSE stream fed by the process's task event hub.

The stream registers its task with the hub (``watch``: status transitions, NOTIFY; ``polled``:
statusMessage and progress, which send none, found by the hub's one batched re-read per
``push_recheck_seconds`` for the whole process). The page's rows are read again only when the hub
says the task may have changed, so an open page costs no query of its own while nothing happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping

from mcp_celery_tasks.console.render import text
from mcp_celery_tasks.console.views import live_state
from mcp_celery_tasks.protocol.services import Services

__all__ = ["KEEPALIVE_S", "MAX_LIVE_ROWS", "changes", "row_changes"]

KEEPALIVE_S = 15.0
MAX_LIVE_ROWS = 200
"""A list page follows at most this many rows live (a longer page is still shown, not followed)."""
_TERMINAL = frozenset({"completed", "failed", "cancelled"})


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


def _row_state(row: Mapping[str, object]) -> dict[str, object]:
    return {
        "job": text(row["job_id"]),
        "status": text(row["shown"]),
        "status_message": text(row["status_message"])[:120],  # as the page cuts it
        "attempts": text(row["attempts"]),
    }


def _settled(row: Mapping[str, object]) -> bool:
    return row["status"] in _TERMINAL and (row["finished_at"] is not None or row["started_at"] is None)


async def row_changes(services: Services, job_ids: list[str]) -> AsyncIterator[str]:
    """SSE messages for a list page: each shown row's status, statusMessage and attempts when
    they change, until every row has settled. One hub event for the whole page; one read of the
    page's rows (by job id) when the hub says one of them may have changed."""
    events = services.events
    rows = await services.store.console_rows(job_ids)
    changed = asyncio.Event()
    last: dict[str, str] = {}
    with contextlib.ExitStack() as watching:
        for row in rows:
            if not _settled(row):
                task_id = str(row["task_id"])
                watching.enter_context(events.watch_with(task_id, changed))
                watching.enter_context(events.polled(task_id))
        while True:
            for row in rows:
                data = json.dumps(_row_state(row), ensure_ascii=True)
                if last.get(str(row["job_id"])) != data:  # the first pass too: the page may be older
                    yield f"event: row\ndata: {data}\n\n"
                last[str(row["job_id"])] = data
            if all(_settled(row) for row in rows):
                yield "event: settled\ndata: {}\n\n"
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            changed.clear()  # before the read: a change after it wakes us
            rows = await services.store.console_rows(job_ids)
