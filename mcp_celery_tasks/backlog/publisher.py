"""The fair publisher: jobs leave the Postgres backlog round-robin by principal.

A created task's row is its job's place in the backlog (``dispatched_at IS NULL``). One thread
per API process releases jobs from it (``store.backlog.RELEASE``) while fewer than
``dispatch_ahead`` of a queue wait in the broker, and publishes them. So the broker holds a few
jobs per queue, never one principal's thousands: a principal with a backlog delays another's job
by about one job's run time per worker slot (plus ``dispatch_ahead`` jobs), whatever the size of
its backlog. Celery still routes and runs every job.

A pass runs when a task is created here, when any task changes status (the event hub's NOTIFY:
a job finished, failed, was cancelled or was answered, so a slot may be free), and on a short
timer while a backlog waits (a worker starting a queued job sends no NOTIFY), and when the next
retry waiting for its time falls due (``store.retry_queries``). Passes of every
API process and of the sweeper are serialized per queue by an advisory lock. A job released but
not published (broker down, a crash) is put back, or found by the sweeper's lost-message check.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from mcp_celery_tasks.backlog.release import BrokerUnavailable, DispatchWindow, release_and_publish
from mcp_celery_tasks.broker import channel
from mcp_celery_tasks.broker.channel import CircuitBreaker, Publisher
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore

__all__ = ["FairPublisher"]

logger = logging.getLogger("mcp_celery_tasks.outbox")

_IDLE_TICK_S = 1.0
"""Between passes when no backlog waits (a missed NOTIFY costs at most this)."""
_BUSY_TICK_S = 0.1
"""Between passes while a backlog waits for room in the broker."""
_COALESCE_S = 0.002
"""After a wake-up, so that a burst of creates or finished jobs makes one pass."""
_BURST_S = 0.005
"""A wake-up this soon after the last pass is part of a burst (and waits ``_COALESCE_S``)."""
_RETRY_MIN_TICK_S = 0.005
"""Waking for a due retry: a little after its time (Postgres's clock decides), never a spin."""
_MAX_HEADERS = 10_000
"""Trace headers kept for jobs still in the backlog (older ones publish without a trace)."""


class FairPublisher:
    """The API's ``Publisher`` for jobs: ``publish_job`` only wakes the fair pass (the row is
    already in the backlog); wake-ups, revokes and the broker probe go to the broker thread."""

    def __init__(self, app: Any, settings: Settings, broker_thread: Publisher) -> None:
        self._app = app
        self._settings = settings
        self._broker_thread = broker_thread
        self._store = WorkerStore(settings, application_name="mcp-celery-tasks-dispatch")
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_reset_seconds)
        self._poke = threading.Event()
        self._hinted: set[str] = set()
        self._backlog_seen = True
        """The last passes left a backlog somewhere (or could not tell): status changes then
        wake a pass, since a freed slot is the backlog's turn. Without a backlog they do not
        (one query per finished job saved); the timer still looks every second."""
        self._everything = True
        """The next pass looks at every queue with a backlog (the timer), not only the queues
        jobs were just created in or that had a backlog at the last look (a status change)."""
        self._rescan = True
        self._scanned_at = 0.0
        self._backlogged: set[str] = set()
        self._stopping = False
        self._headers: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._headers_lock = threading.Lock()
        """Guards the trace headers, the queue hints and ``_everything``."""
        self._broker_down: bool | None = None
        self._window = DispatchWindow(settings)
        self._backlog_gap_s = settings.dispatch_ahead_seconds / 4
        self._pass_started = self._pass_ended = 0.0
        self._retry_due_at: float | None = None
        """When (monotonic) the next retry waiting in the backlog falls due, as the last scan saw."""
        self._producer: Any = None
        """The producer of the release being published (fair thread only)."""
        self._thread = threading.Thread(target=self._loop, name="mcp-fair-dispatch", daemon=True)
        self.published = 0
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._poke.set()
        self._thread.join(timeout)
        self._store.close()

    # ---- the Publisher protocol (called from the event loop: never blocks) -----------------------

    def publish_job(self, job_id: str, queue_name: str, headers: dict[str, str] | None = None) -> None:
        with self._headers_lock:
            self._hinted.add(queue_name)
            if headers:
                self._headers[job_id] = headers
                while len(self._headers) > _MAX_HEADERS:
                    self._headers.popitem(last=False)
        self._poke.set()

    def wake(self, inbox: str, job_id: str) -> None:
        self._broker_thread.wake(inbox, job_id)

    def revoke(self, job_id: str) -> None:
        self._broker_thread.revoke(job_id)

    def check_broker(self) -> concurrent.futures.Future[bool]:
        return self._broker_thread.check_broker()

    def poke(self) -> None:
        """A task changed status somewhere: a slot may be free (thread-safe, never blocks)."""
        with self._headers_lock:
            if not self._backlog_seen:
                return
            self._everything = True
        self._poke.set()

    # ---- the thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        tick = _IDLE_TICK_S
        while not self._stopping:
            woken = self._poke.wait(tick)
            if not woken or time.monotonic() - self._scanned_at >= _IDLE_TICK_S:
                with self._headers_lock:
                    self._everything = self._rescan = True  # every queue, at least once a second
            if woken:
                now = time.monotonic()
                if tick == _BUSY_TICK_S:
                    # While a backlog waits, every finished job wakes the thread; the broker
                    # holds about ``dispatch_ahead_seconds`` of work, so passes a quarter of that
                    # apart keep it fed at a fraction of the database work (a pass per finished
                    # noop job cost the pool a third of its drain rate).
                    time.sleep(max(_COALESCE_S, self._pass_started + self._backlog_gap_s - now))
                elif now - self._pass_ended < _BURST_S:
                    time.sleep(_COALESCE_S)  # a burst of creates or finished jobs: one pass
                # else: the first create after a quiet spell goes out at once
            self._poke.clear()
            if self._stopping:
                return
            self._pass_started = time.monotonic()
            tick = self._pass()
            self._pass_ended = time.monotonic()

    def _pass(self) -> float:
        if not self.breaker.allow():
            return self._settings.breaker_reset_seconds / 4
        self.passes += 1
        try:
            with self._headers_lock:
                headers = dict(self._headers)
                hinted, self._hinted = self._hinted, set()
                queues: set[str] | None = hinted
                if self._rescan:
                    queues = None
                    self._scanned_at = time.monotonic()
                elif self._everything:  # the queues that had a backlog (until the next scan)
                    queues = hinted | self._backlogged
                self._everything = self._rescan = False
            offered = set(headers)
            try:
                published, waiting = release_and_publish(
                    self._store,
                    self._settings,
                    self._publish,
                    trace_headers=headers,
                    queues=queues,
                    backlogged=self._backlogged,
                    window=self._window,
                    batch=self._batch,
                    next_retry=self._heard_next_retry,
                )
            finally:
                self._forget_headers(offered - set(headers))
        except BrokerUnavailable as exc:
            self._backlog_seen = True
            self.breaker.failure()
            self._broker_down = True
            logger.warning("fair dispatch: %s (breaker %s)", exc, self.breaker.state)
            return _BUSY_TICK_S * 10
        except InfrastructureError:
            self._backlog_seen = True
            logger.warning("fair dispatch: the task database is unavailable", exc_info=True)
            return _IDLE_TICK_S
        with self._headers_lock:
            # An everything pass knows; a hinted one only adds what it left behind.
            self._backlog_seen = waiting if queues is None else self._backlog_seen or waiting
        self.published += published
        if published and self._broker_down is not False:
            self.breaker.success()
            self._mark_broker_up()
        return self._until_retry(_BUSY_TICK_S if waiting else _IDLE_TICK_S)

    def _heard_next_retry(self, due_in_s: float | None) -> None:
        self._retry_due_at = None if due_in_s is None else time.monotonic() + due_in_s

    def _until_retry(self, tick: float) -> float:
        """``tick``, or less when a retry falls due sooner: the timer's pass is a scan, and the
        scan releases it (a retry scheduled after the last scan waits for the next one, ≤ 1 s)."""
        if self._retry_due_at is None:
            return tick
        return min(tick, max(_RETRY_MIN_TICK_S, self._retry_due_at - time.monotonic() + _RETRY_MIN_TICK_S))

    def _publish(self, job_id: str, queue: str, headers: dict[str, str] | None) -> None:
        channel.publish_job(self._app, job_id, queue, headers, producer=self._producer)

    @contextlib.contextmanager
    def _batch(self) -> Iterator[None]:
        """One producer for a queue's release, its publishes in one kombu batch (Redis: one
        pipelined round trip for all the LPUSHes; RabbitMQ publishes each at once)."""
        with self._app.producer_or_acquire() as producer, channel.batched(producer):
            self._producer = producer
            try:
                yield
            finally:
                self._producer = None

    def _forget_headers(self, used: set[str]) -> None:
        """Drop the trace headers of jobs released in this pass."""
        with self._headers_lock:
            for job_id in used:
                self._headers.pop(job_id, None)

    def _mark_broker_up(self) -> None:
        try:
            self._store.broker_down(False)
            self._broker_down = False
        except InfrastructureError:
            logger.debug("could not record that the broker is back", exc_info=True)
