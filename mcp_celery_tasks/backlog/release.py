"""One fair dispatch pass, shared by the API's fair publisher (``outbox``) and the sweeper.

The rules live in the SQL (``store.backlog``); this is the loop around it: release per queue,
publish, put back what the broker refused.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore

__all__ = ["BrokerUnavailable", "DispatchWindow", "Publish", "release_and_publish"]

logger = logging.getLogger("mcp_celery_tasks.fair")

Publish = Callable[[str, str, "dict[str, str] | None"], None]
"""``publish(job_id, queue, trace_headers)``; raises when the broker refuses."""

Batch = Callable[[], AbstractContextManager[object]]
"""Opened around the publishes of one queue's release; its exit may publish what they buffered
(and raise when the broker refuses)."""


def release_and_publish(
    store: WorkerStore,
    settings: Settings,
    publish: Publish,
    *,
    trace_headers: dict[str, dict[str, str]] | None = None,
    queues: Collection[str] | None = None,
    backlogged: set[str] | None = None,
    window: DispatchWindow | None = None,
    batch: Batch = nullcontext,
    next_retry: Callable[[float | None], None] | None = None,
) -> tuple[int, bool]:
    """One fair pass over ``queues`` (those jobs were just created in or that had a backlog;
    default: every queue with a backlog): release, publish, put back what failed.

    ``publish(job_id, queue, headers)`` raises when the broker refuses. Returns (jobs published,
    whether a backlog may still wait). Store errors propagate (``InfrastructureError``).
    ``backlogged`` is kept up to date with the queues left with a backlog. ``window`` sizes each
    queue's room in the broker (default: ``dispatch_ahead``) and hears what was published.
    ``batch`` groups one queue's publishes (the API: one Redis pipeline per release); when it
    fails, every job of that release goes back to the backlog (some may have reached the broker:
    a duplicate is a no-op at the claim). ``next_retry`` hears, on a pass over every queue, in
    how many seconds the next waiting retry falls due (None: none waits)."""
    published = 0
    waiting = False
    if queues is None:
        # Retries whose time came join the backlog first (``store.retry_queries``): every API
        # process scans at least once a second (and when ``next_retry`` said the next is due),
        # the sweeper every ``sweep_interval_seconds``.
        _, due_in = store.release_due_retries()
        if next_retry is not None:
            next_retry(due_in)
    scanned = store.backlog_queues() if queues is None else sorted(queues)
    if backlogged is not None and queues is None:
        backlogged.clear()
    for queue in scanned:
        ahead = settings.dispatch_ahead if window is None else window.size(queue)
        released, room = store.release(queue, ahead, settings.max_waiting_inputs_per_principal)
        failed: list[str] = []
        sent = 0
        try:
            with batch() if released else nullcontext():
                for job_id, job_queue in released:
                    headers = trace_headers.pop(job_id, None) if trace_headers is not None else None
                    if failed:
                        failed.append(job_id)  # the broker just refused one: do not hammer it
                        continue
                    try:
                        publish(job_id, job_queue, headers)
                        sent += 1
                    except Exception:
                        logger.warning("could not publish job %s to %s", job_id, job_queue, exc_info=True)
                        failed.append(job_id)
        except Exception:
            logger.warning("could not publish %d jobs to %s", len(released), queue, exc_info=True)
            failed, sent = [job_id for job_id, _ in released], 0
        published += sent
        if window is not None:
            window.published(queue, sent)
        if failed:
            store.undispatch(failed)
            store.broker_down(True)
            raise BrokerUnavailable(f"{len(failed)} jobs of {queue} went back to the backlog")
        # A backlog may still wait when the release filled the queue's room (or there was none:
        # whatever waits, waits for a slot). Released fewer than the room: nothing eligible is
        # left (a principal over its waiting-inputs limit waits for a status change, which wakes
        # a pass, or for the next scan).
        more = room <= 0 or len(released) >= room
        waiting = waiting or more
        if backlogged is not None and more:
            backlogged.add(queue)  # only a scan (``queues`` None) forgets one
    return published, waiting


class BrokerUnavailable(Exception):
    """Publishing failed; the jobs are back in the backlog."""


class DispatchWindow:
    """How many jobs of a queue may wait in the broker: ``dispatch_ahead``, or about
    ``dispatch_ahead_seconds`` of the queue's work when its jobs are short.

    The queue's pace is what this publisher released in the last second. A window of a fixed
    four starved two workers of noop jobs between passes (each pass follows a finished job's
    NOTIFY); sized by pace, a flood of tiny jobs keeps the broker a tenth of a second ahead of
    the workers, while a queue of minute-long jobs keeps ``dispatch_ahead``. Only the fair
    publisher's thread uses it.
    """

    CAP = 64
    """At 0.1 s of work, enough for a pool running 640 jobs a second; it also bounds how many
    long jobs a queue that just ran a flood of tiny ones can hand out at once."""
    _PACE_S = 1.0

    def __init__(self, settings: Settings) -> None:
        self._floor = settings.dispatch_ahead
        self._seconds = settings.dispatch_ahead_seconds
        self._recent: dict[str, deque[tuple[float, int]]] = {}

    def size(self, queue: str) -> int:
        if self._seconds <= 0 or self._floor <= 0:
            return self._floor
        recent = self._recent.get(queue)
        if not recent:
            return self._floor
        self._forget(recent, time.monotonic())
        pace = sum(n for _, n in recent) / self._PACE_S
        return max(self._floor, min(self.CAP, math.ceil(pace * self._seconds)))

    def published(self, queue: str, count: int) -> None:
        if count <= 0 or self._seconds <= 0:
            return
        now = time.monotonic()
        recent = self._recent.setdefault(queue, deque())
        recent.append((now, count))
        self._forget(recent, now)

    def _forget(self, recent: deque[tuple[float, int]], now: float) -> None:
        while recent and recent[0][0] < now - self._PACE_S:
            recent.popleft()
