"""What a running job's ``TaskContext`` stands on: one ``Runtime`` per job.

The runtime owns the job's link to its row: status reports (coalesced), the "lost" flag (the
task was cancelled or taken from this worker), ownership checks, and input waits (input rows
plus the process's inbox). It knows nothing of the context that uses it; the lease thread
(``leases``) tends runtimes, not contexts. No Celery, no SQL: the store and the inbox come in
as the two small protocols below.

Infrastructure blips are the runtime's to absorb (``blips``): every store call of the job's
thread is retried with backoff for up to the outage budget, and an unreachable broker only
turns an input wait into polling of the row; tool code never sees either error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

from mcp_celery_tasks.errors import (
    InfrastructureError,
    InputTimedOut,
    JobSuspended,
    SoftTimeLimitExceeded,
    TaskCancelled,
    WorkerStopping,
)
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.store.records import InputItem, InputRecord
from mcp_celery_tasks.transient import OUTAGE, Backoff, OutageTooLong, ride_out
from mcp_celery_tasks.worker.limits import JobLimits
from mcp_celery_tasks.worker.observe import SILENT, JobObserver
from mcp_celery_tasks.worker.replay import Requests, plan_ask

__all__ = ["InboxWaiter", "Runtime", "RuntimeStore"]

logger = logging.getLogger("mcp_celery_tasks.runtime")

T = TypeVar("T")

_REREAD_S = 3.0
"""While blocked for input, re-read the row at least this often: a lost wake-up costs latency only."""
_POLL_S = 1.0
"""With the broker unreachable, a waiting job reads its row this often instead."""


class RuntimeStore(Protocol):
    """The store calls a running job makes (``WorkerStore`` in production)."""

    def report(
        self,
        task_id: str,
        worker: str,
        message: str,
        progress: float | None = None,
        total: float | None = None,
    ) -> bool: ...

    def log(
        self, task_id: str, worker: str, level: str, logger: str | None, data: JSONValue, max_logs: int
    ) -> bool: ...

    def still_mine(self, task_id: str, worker: str) -> bool: ...

    def renew_lease(self, task_id: str, worker: str, lease_s: float) -> bool: ...

    def all_inputs(self, task_id: str) -> dict[str, InputRecord]: ...

    def open_inputs(
        self,
        task_id: str,
        worker: str,
        inbox: str,
        items: Sequence[InputItem],
        supersede: Sequence[str] = (),
        may_suspend: bool = False,
    ) -> bool: ...

    def suspend_now(self, task_id: str) -> bool: ...

    def suspend(self, task_id: str, worker: str) -> bool: ...

    def input_state(
        self, task_id: str, worker: str, keys: Sequence[str]
    ) -> tuple[bool, dict[str, JSONObject]]: ...

    def expire_inputs(self, task_id: str, worker: str, keys: Sequence[str]) -> None: ...


class InboxWaiter(Protocol):
    """The process's inbox as a waiting job sees it (``channel.Inbox`` in production). A broker
    failure comes out of ``declare`` and ``wait`` as an ``InfrastructureError``."""

    name: str

    def declare(self) -> None: ...

    def wait(self, job_id: str, timeout_s: float, task_id: str = "") -> bool:
        """Block for a wake-up naming ``job_id`` (wake-ups never carry the bearer-like task id;
        ``task_id`` is for in-process inboxes that play the client)."""


class Runtime:
    """One job's link to its row: reports, the lost flag, ownership checks, input waits.

    Thread-safe where it must be: the job's thread reports and asks, the lease thread flushes
    and renews.
    """

    def __init__(
        self,
        store: RuntimeStore,
        *,
        task_id: str,
        job_id: str,
        tool_name: str,
        worker: str,
        inbox: Callable[[], InboxWaiter],
        report_interval_s: float = 0.25,
        check_interval_s: float = 0.2,
        max_status_chars: int = 1024,
        observer: JobObserver = SILENT,
        limits: JobLimits | None = None,
        outage_budget_s: float = 120.0,
        outage_backoff: Backoff = OUTAGE,
        inbox_down_poll_s: float = _POLL_S,
        rerun_since_s: float | None = None,
    ) -> None:
        self.task_id = task_id
        self.job_id = job_id
        self.tool_name = tool_name
        self.worker = worker
        self._store = store
        self._inbox = inbox
        self._report_interval = report_interval_s
        self._check_interval = check_interval_s
        self._max_status_chars = max_status_chars
        self._observer = observer
        self._lock = threading.Lock()
        self._pending: tuple[str, float | None, float | None] | None = None
        self._last_write = 0.0
        self._last_check = 0.0
        self._lost = False
        self._soft_limit_s = limits.soft_time_limit_s if limits else None  # None: no limits at all
        self._started = time.monotonic()
        self._waited = 0.0
        self._soft_raised = False
        self._main_busy = 0  # our own store calls (or an input wait) under way in the job's thread
        self._store_calls = 0  # our own store calls under way in the job's thread (never interrupted)
        self._outage_budget_s = outage_budget_s
        self._outage_backoff = outage_backoff
        self._inbox_down_poll_s = inbox_down_poll_s
        self._stopping = False
        self._tool_done = False  # past the tool: the outcome is recorded whatever the signal
        self._inbox_down = False
        self._suspend_after_s = limits.suspend_after_s if limits else None
        # A re-run (a resume, a redelivery): ``rerun_since_s`` is how long ago the answer that
        # resumed it was recorded (0 for a redelivery). Until the run reaches new work, each
        # replayed answer moves ``_replayed_at``; the first new work observes the redo.
        self._rerun_since = None if rerun_since_s is None else self._started - rerun_since_s
        self._replayed_at: float | None = None
        self.suspended = False
        """The job gave its slot back (whatever the tool raised after that, the run is over)."""

    # ---- the soft time limit ------------------------------------------------------------------

    def check_soft_limit(self) -> None:
        """Raise ``SoftTimeLimitExceeded`` once the job has run (input waits not counted) past its
        soft limit; once only, so a tool that catches it can clean up in peace."""
        if self._soft_limit_s and not self._soft_raised:
            ran = time.monotonic() - self._started - self._waited
            if ran > self._soft_limit_s:
                self._raise_soft_limit()

    def soft_limit_signalled(self) -> None:
        """The main process says the soft limit passed (SIGUSR2, in the job's thread): raise now,
        unless our own store call is under way (then at the next checkpoint)."""
        if self._soft_raised or self._main_busy:
            self._soft_limit_s = self._soft_limit_s or 1e-9  # the next checkpoint raises
            return
        self._raise_soft_limit()

    def _raise_soft_limit(self) -> None:
        self._soft_raised = True
        limit = f" of {self._soft_limit_s:g} s" if self._soft_limit_s and self._soft_limit_s > 1e-6 else ""
        raise SoftTimeLimitExceeded(f"The tool {self.tool_name!r} ran past its soft time limit{limit}")

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        main = threading.current_thread() is threading.main_thread()
        if main:
            self._main_busy += 1
        try:
            yield
        finally:
            if main:
                self._main_busy -= 1

    # ---- the worker stopping ------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether the worker process was told to stop while this job ran."""
        return self._stopping

    def stop_signalled(self) -> None:
        """The process is being stopped (SIGTERM, in the job's thread): raise ``WorkerStopping``
        now, unless one of our own store calls is under way (then as soon as it returns, or at
        the next checkpoint)."""
        self._stopping = True
        if not self._store_calls:
            raise WorkerStopping("the worker is stopping")

    def check_stopping(self) -> None:
        if self._stopping and not self._tool_done:
            raise WorkerStopping("the worker is stopping")

    def tool_done(self) -> None:
        """The tool returned (or raised): from here on a stop never interrupts the runtime (the
        runner records the outcome; the process ends after that)."""
        self._tool_done = True

    @contextlib.contextmanager
    def _uninterrupted(self) -> Iterator[None]:
        """Our own store call in the job's thread: a stop signalled meanwhile waits until it is
        over (a statement cut in half would leave the connection unusable for the give-back)."""
        main = threading.current_thread() is threading.main_thread()
        if main:
            self._store_calls += 1
        try:
            with self._busy():
                yield
        finally:
            if main:
                self._store_calls -= 1
                if not self._store_calls:
                    self.check_stopping()

    def _store_call(self, call: Callable[[], T], what: str) -> T:
        """A store call of the job's thread, riding out an outage for up to the budget."""
        try:
            with self._uninterrupted():
                return ride_out(
                    call,
                    budget_s=self._outage_budget_s,
                    what=what,
                    backoff=self._outage_backoff,
                    stop=self._interrupted,
                )
        except OutageTooLong:
            if self._interrupted():
                raise WorkerStopping("the worker is stopping") from None
            raise

    def _interrupted(self) -> bool:
        return self._stopping and not self._tool_done

    # ---- the lost flag -----------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether the worker already learned the task is no longer its to run."""
        return self._lost

    def mark_lost(self) -> None:
        """The task is no longer ours (cancelled, or the lease taken): every later check says so."""
        self._lost = True

    @property
    def cancelled(self) -> bool:
        """True once the task was cancelled or taken from this worker. A fresh row read at most
        every ``check_interval``; an unreadable row is not a cancel (the lease decides)."""
        self.check_stopping()
        if self._lost:
            return True
        now = time.monotonic()
        if now - self._last_check >= self._check_interval:
            self._last_check = now
            try:
                with self._uninterrupted():
                    mine = self._store.still_mine(self.task_id, self.worker)
            except InfrastructureError:
                pass  # an unreadable row is not a cancel
            else:
                self._lost = self._lost or not mine
        return self._lost

    def renew_lease(self, lease_s: float) -> None:
        """Extend the lease; a refusal means the row is no longer ours."""
        if not self._store.renew_lease(self.task_id, self.worker, lease_s):
            self.mark_lost()

    # ---- status reports ------------------------------------------------------------------

    def report(self, message: str, progress: float | None = None, total: float | None = None) -> None:
        """Set the status message (and numeric progress), at most one write per
        ``report_interval``; the latest always lands (the lease thread flushes it, and the runner
        before the outcome). Coalesced reports keep the highest progress seen."""
        with self._lock:
            if progress is not None and self._pending is not None and self._pending[1] is not None:
                progress = max(progress, self._pending[1])
            self._pending = (message[: self._max_status_chars], progress, total)
            due = time.monotonic() - self._last_write >= self._report_interval
        if due:
            self.flush()

    def flush(self) -> None:
        """Write a pending status message now, riding out an outage (the job's thread)."""
        self._flush(ride=True)

    def _flush(self, *, ride: bool) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            self._last_write = time.monotonic()
        message, progress, total = pending

        def write() -> bool:
            if progress is None and total is None:
                return self._store.report(self.task_id, self.worker, message)
            return self._store.report(self.task_id, self.worker, message, progress, total)

        try:
            mine = self._store_call(write, "a status report") if ride else write()
        except InfrastructureError:
            with self._lock:  # not lost: the next flush writes it, unless a newer one came
                if self._pending is None:
                    self._pending = pending
            raise
        if not mine:
            self.mark_lost()

    def log(self, level: str, logger: str | None, data: JSONValue, max_logs: int = 1000) -> None:
        """Record a log message for the task's synchronous caller (the context decided that the
        caller asked for this level). Not recorded past ``max_logs`` or once the task is not ours."""
        try:
            with self._busy():
                self._store.log(self.task_id, self.worker, level, logger, data, max_logs)
        except InfrastructureError:  # best effort: an outage drops the line (the worker log has it)
            pass

    def flush_if_due(self) -> None:
        """Write a pending message whose interval has passed (the lease thread calls this: one
        try, never a wait; a message it could not write stays pending)."""
        with self._lock:
            due = self._pending is not None and time.monotonic() - self._last_write >= self._report_interval
        if due:
            self._flush(ride=False)

    # ---- input requests --------------------------------------------------------------------

    def ask(self, requests: Requests, timeout_s: float) -> dict[str, JSONObject]:
        """Make ``{key: (method, params, hash)}`` outstanding and block until all are answered.

        Answers recorded by an earlier run of the same job are returned at once; raises
        ``TaskCancelled`` if the task stops being ours, ``InputTimedOut`` after ``timeout_s``,
        and ``JobSuspended`` when the job gives its slot back instead of waiting on
        (``suspend_after``, or other jobs of its queue waiting for a slot).
        """
        recorded = self._store_call(lambda: self._store.all_inputs(self.task_id), "reading input requests")
        plan = plan_ask(requests, recorded)
        pending = plan.pending
        if not pending:
            self.replayed()
            return plan.answers
        self.reached_new_work()
        inbox = self._inbox()
        self._declare(inbox)
        may_suspend = self._suspend_after_s is not None

        def open_rows() -> bool:
            return self._store.open_inputs(
                self.task_id, self.worker, inbox.name, plan.to_open, plan.supersede, may_suspend
            )

        if not self._store_call(open_rows, "opening input requests"):
            self.mark_lost()
            raise TaskCancelled("the task was cancelled")
        waiting_since = time.monotonic()
        try:
            with self._observer.waiting_for_input(self.tool_name, len(pending)), self._busy():
                answers = self._wait(inbox, list(pending.values()), time.monotonic() + timeout_s, timeout_s)
        finally:
            self._waited += time.monotonic() - waiting_since  # not counted against time limits
        return {**plan.answers, **{key: answers[stored] for key, stored in pending.items()}}

    def _declare(self, inbox: InboxWaiter) -> None:
        """Declare the inbox before any client can see the request. With the broker down this is
        skipped: a wake-up declares the queue on its way (``channel.send_wake``), the wait's
        consumer declares it again, and the waiter re-reads its row every few seconds anyway."""
        try:
            inbox.declare()
        except InfrastructureError as exc:
            self._note_inbox_down(exc)

    def _note_inbox_down(self, exc: BaseException) -> None:
        if not self._inbox_down:
            logger.warning(
                "job %s: the broker is unreachable (%s); waiting for input by reading the row",
                self.job_id,
                type(exc.__cause__ or exc).__name__,  # the transport's own error
            )
        self._inbox_down = True

    def replayed(self) -> None:
        """A re-run passed work an earlier run recorded (an answer, a step)."""
        if self._rerun_since is not None:
            self._replayed_at = time.monotonic()

    def reached_new_work(self) -> None:
        """The run is past what earlier runs did (a new question, the tool's end): a re-run
        observes how long it took to get here (the work redone) and, for a resume, how long after
        the answer it ran past the question."""
        since, self._rerun_since = self._rerun_since, None
        if since is None or self._replayed_at is None:
            return
        self._observer.on_replayed(
            self.tool_name, redone_s=self._replayed_at - self._started, resumed_s=self._replayed_at - since
        )

    def _wait(
        self, inbox: InboxWaiter, keys: list[str], deadline: float, timeout_s: float
    ) -> dict[str, JSONObject]:
        """Block until every one of ``keys`` (row keys) has an answer; the answers by row key."""

        def state() -> tuple[bool, dict[str, JSONObject]]:
            return self._store.input_state(self.task_id, self.worker, keys)

        since = time.monotonic()
        suspend_at = None if self._suspend_after_s is None else since + self._suspend_after_s
        next_look = since  # when to ask whether the queue needs the slot (at once, then every re-read)
        while True:
            self.check_stopping()
            mine, answers = self._store_call(state, "reading input answers")
            if not mine:
                self.mark_lost()
                raise TaskCancelled("the task was cancelled")
            if all(key in answers for key in keys):
                return answers
            now = time.monotonic()
            if suspend_at is not None and now >= min(suspend_at, next_look):
                due = now >= suspend_at or self._needed()
                next_look = now + _REREAD_S
                if due:
                    self._suspend()  # raises JobSuspended, unless an answer or a cap came first
                    suspend_at = next_look  # refused: try again at the next re-read
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                self._store_call(
                    lambda: self._store.expire_inputs(self.task_id, self.worker, keys),
                    "expiring input requests",
                )
                raise InputTimedOut(f"Nobody answered the input request within {timeout_s:.0f} s")
            slice_s = min(left, _REREAD_S)
            if suspend_at is not None:
                slice_s = max(0.0, min(slice_s, min(suspend_at, next_look) - time.monotonic()))
            started = time.monotonic()
            try:
                inbox.wait(self.job_id, slice_s, self.task_id)
                self._inbox_down = False
            except InfrastructureError as exc:
                # A lost wake-up costs latency only: poll the row until the broker is back.
                self._note_inbox_down(exc)
                time.sleep(max(0.0, min(self._inbox_down_poll_s, slice_s - (time.monotonic() - started))))

    # ---- suspend --------------------------------------------------------------------------------

    def _needed(self) -> bool:
        """Other jobs of the queue wait for a slot (or the principal holds its most resident
        waits): give this one back at once. An unreadable answer is a no."""
        try:
            with self._uninterrupted():
                return self._store.suspend_now(self.task_id)
        except InfrastructureError:
            return False

    def _suspend(self) -> None:
        """Give the slot back: the last status message lands first (the suspend releases the
        row, so later writes of this run are refused), then one guarded write; if it took,
        ``JobSuspended`` goes up through the tool to the runner. Refused (an answer landed, the
        task was cancelled, or the principal has its most suspended tasks), the wait goes on."""
        with contextlib.suppress(InfrastructureError):
            self.flush()
        try:
            with self._uninterrupted():
                suspended = self._store.suspend(self.task_id, self.worker)
        except InfrastructureError:
            return  # stay resident: the wait goes on, reading the row
        if suspended:
            self.suspended = True
            self.mark_lost()  # nothing of this run may write any more
            raise JobSuspended(f"job {self.job_id} gave its slot back waiting for input")
