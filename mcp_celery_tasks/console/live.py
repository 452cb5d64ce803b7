"""The detail page's live updates: an SSE stream fed by the process's task event hub.

The stream registers its task with the hub (``watch``: status transitions, NOTIFY; ``polled``:
statusMessage and progress, which send none, found by the hub's one batched re-read per
``push_recheck_seconds`` for the whole process). The page's rows are read again only when the hub
says the task may have changed, so an open page costs no query of its own while nothing happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from datetime import datetime

from mcp_celery_tasks.console.render import text
from mcp_celery_tasks.console.views import live_state
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.store.console_calls import TaskFilter

__all__ = ["KEEPALIVE_S", "MAX_LIVE_ROWS", "MAX_NEW_ROWS", "changes", "row_changes"]

KEEPALIVE_S = 15.0
MAX_LIVE_ROWS = 200
"""A list page follows at most this many rows live (a longer page is still shown, not followed)."""
MAX_NEW_ROWS = 50
"""New rows sent per look (a flood of creates shows its newest; the page links to the rest)."""
NEWS_MIN_S = 0.2
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


def _new_row(row: Mapping[str, object]) -> dict[str, object]:
    """A row the list did not show yet, with the cells its page shows (as text)."""
    return {
        "job": text(row["job_id"]),
        "status": text(row["status"]),
        "tool": text(row["tool"]),
        "owner": text(row["owner"]),
        "queue": text(row["queue"]),
        "status_message": text(row["status_message"])[:120],
        "created": text(row["created_at"]),
        "attempts": text(row["attempts"]),
        "finished": text(row["finished_at"]),
    }


async def row_changes(
    services: Services, job_ids: list[str], news: TaskFilter | None = None
) -> AsyncIterator[str]:
    """SSE messages for a list page: each shown row's status, statusMessage and attempts when
    they change, until every row has settled. One hub event for the whole page; one read of the
    page's rows (by job id) when the hub says one of them may have changed.

    With ``news`` (the filter of a list's first page, ``after`` its newest row), tasks created
    since under that filter are sent as ``new`` rows and followed like the others, and the stream
    stays open. The hub's ``any_change`` says when to look (this process's creates, any NOTIFY):
    one read of the filter's newer rows per wake, at most every ``NEWS_MIN_S``; nothing while
    nothing happens."""
    events = services.events
    job_ids = list(job_ids)
    rows = await services.store.console_rows(job_ids)
    changed = asyncio.Event()
    last: dict[str, str] = {}
    followed: set[str] = set()
    with contextlib.ExitStack() as watching:
        if news is not None:
            watching.enter_context(events.any_change(changed))
        while True:
            if news is not None:
                page = await services.store.console_tasks(news, MAX_NEW_ROWS)
                for row in reversed(page.rows):  # oldest first: the page puts each on top
                    yield f"event: new\ndata: {json.dumps(_new_row(row), ensure_ascii=True)}\n\n"
                if page.rows:
                    newest = page.rows[0]
                    news = dataclasses.replace(news, after=(_moment(newest), str(newest["job_id"])))
                    room = MAX_LIVE_ROWS - len(job_ids)
                    added = [str(row["job_id"]) for row in page.rows][: max(room, 0)]
                    job_ids += added
                    rows = await services.store.console_rows(job_ids) if added else rows
            for row in rows:
                if not _settled(row) and row["job_id"] not in followed:
                    followed.add(str(row["job_id"]))
                    task_id = str(row["task_id"])
                    watching.enter_context(events.watch_with(task_id, changed))
                    watching.enter_context(events.polled(task_id))
                data = json.dumps(_row_state(row), ensure_ascii=True)
                if last.get(str(row["job_id"])) != data:  # the first pass too: the page may be older
                    yield f"event: row\ndata: {data}\n\n"
                last[str(row["job_id"])] = data
            if news is None and all(_settled(row) for row in rows):
                yield "event: settled\ndata: {}\n\n"
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if news is not None:
                await asyncio.sleep(NEWS_MIN_S)  # a busy pool's NOTIFYs: one read for a burst
            changed.clear()  # before the read: a change after it wakes us
            rows = await services.store.console_rows(job_ids)


def _moment(row: Mapping[str, object]) -> datetime:
    created = row["created_at"]
    assert isinstance(created, datetime)
    return created
