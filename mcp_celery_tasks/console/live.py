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
import weakref
from collections.abc import AsyncGenerator, Mapping
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
READS_AT_ONCE = 2
"""Live pages' reads in flight at once in a process. A busy pool wakes every open list page on
every burst of NOTIFYs; without a bound, 30 pages took 30 of the pool's ``db_pool_max`` (10)
connections together and the API's own requests (creates, ``tasks/get``) queued behind them
(measured: a pool completing 64 tasks/s fell to 23/s). Pages wait their turn instead."""
_TERMINAL = frozenset({"completed", "failed", "cancelled"})
_reads: weakref.WeakKeyDictionary[object, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _turn(services: Services) -> asyncio.Semaphore:
    """The bound on live pages' reads of one app's services (one event hub, one loop)."""
    turn = _reads.get(services.events)
    if turn is None:
        turn = _reads[services.events] = asyncio.Semaphore(READS_AT_ONCE)
    return turn


async def changes(services: Services, task_id: str, job_id: str) -> AsyncGenerator[str, None]:
    """SSE messages: the task's state now, then after every change, until nothing can change."""
    events = services.events
    last: str | None = None
    with events.watch(task_id) as changed, events.polled(task_id):
        while True:
            changed.clear()  # before the read: a change after it wakes us
            async with _turn(services):
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
) -> AsyncGenerator[str, None]:
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
                async with _turn(services):
                    page = await services.store.console_tasks(news, MAX_NEW_ROWS)
                for row in reversed(page.rows):  # oldest first: the page puts each on top
                    yield f"event: new\ndata: {json.dumps(_new_row(row), ensure_ascii=True)}\n\n"
                if page.rows:
                    newest = page.rows[0]
                    news = dataclasses.replace(news, after=(_moment(newest), str(newest["job_id"])))
                    room = MAX_LIVE_ROWS - len(job_ids)
                    added = [str(row["job_id"]) for row in page.rows][: max(room, 0)]
                    job_ids += added
                    rows = await _reread(services, rows, job_ids) if added else rows
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
            rows = await _reread(services, rows, job_ids)


async def _reread(
    services: Services, rows: list[Mapping[str, object]], job_ids: list[str]
) -> list[Mapping[str, object]]:
    """The page's rows again, reading only those that can still change: a settled row stays as
    it was (a busy pool's page follows up to ``MAX_LIVE_ROWS`` rows, most of them done, and
    re-read all of them on every wake: 200 rows per page every ``NEWS_MIN_S``)."""
    settled = {str(row["job_id"]): row for row in rows if _settled(row)}
    pending = [job for job in job_ids if job not in settled]
    fresh: dict[str, Mapping[str, object]] = {}
    if pending:
        async with _turn(services):
            fresh = {str(row["job_id"]): row for row in await services.store.console_rows(pending)}
    return [row for job in job_ids if (row := settled.get(job) or fresh.get(job)) is not None]


def _moment(row: Mapping[str, object]) -> datetime:
    created = row["created_at"]
    assert isinstance(created, datetime)
    return created
