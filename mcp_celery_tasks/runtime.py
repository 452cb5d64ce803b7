"""What a running job's ``TaskContext`` stands on: one ``Runtime`` per job.

The runtime owns the job's link to its row: status reports (coalesced), the "lost" flag (the
task was cancelled or taken from this worker), ownership checks, and input waits (input rows
plus the process's inbox). It knows nothing of the context that uses it; the lease thread
(``leases``) tends runtimes, not contexts. No Celery, no SQL: the store and the inbox come in
as the two small protocols below.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcp_celery_tasks.errors import InfrastructureError, InputTimedOut, SoftTimeLimitExceeded, TaskCancelled
from mcp_celery_tasks.observe import SILENT, JobObserver
from mcp_celery_tasks.store.records import InputRecord

__all__ = ["InboxWaiter", "Runtime", "RuntimeStore"]

_AUTO_KEY = re.compile(r"\d+-[0-9a-f]{16}")
_REREAD_S = 3.0
"""While blocked for input, re-read the row at least this often: a lost wake-up costs latency only."""

Requests = dict[str, tuple[str, dict[str, Any] | None, str]]
"""``{key: (method, params, params hash)}``: the input requests of one ask."""


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
        self, task_id: str, worker: str, level: str, logger: str | None, data: Any, max_logs: int
    ) -> bool: ...

    def still_mine(self, task_id: str, worker: str) -> bool: ...

    def renew_lease(self, task_id: str, worker: str, lease_s: float) -> bool: ...

    def all_inputs(self, task_id: str) -> dict[str, InputRecord]: ...

    def open_inputs(
        self,
        task_id: str,
        worker: str,
        inbox: str,
        items: Sequence[dict[str, Any]],
        supersede: Sequence[str] = (),
    ) -> bool: ...

    def input_state(self, task_id: str, worker: str, keys: Sequence[str]) -> tuple[bool, dict[str, Any]]: ...

    def expire_inputs(self, task_id: str, worker: str, keys: Sequence[str]) -> None: ...


class InboxWaiter(Protocol):
    """The process's inbox as a waiting job sees it (``channel.Inbox`` in production)."""

    name: str

    def declare(self) -> None: ...

    def wait(self, task_id: str, timeout_s: float) -> bool: ...


@dataclass(slots=True)
class _Plan:
    """One ask against what earlier runs recorded: answers to replay, rows to open."""

    stored_key: dict[str, str] = field(default_factory=dict)  # the author's key -> the row's key
    to_open: list[dict[str, Any]] = field(default_factory=list)
    supersede: list[str] = field(default_factory=list)
    answers: dict[str, Any] = field(default_factory=dict)

    @property
    def pending(self) -> dict[str, str]:
        return {key: stored for key, stored in self.stored_key.items() if key not in self.answers}


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
        soft_limit_s: float | None = None,
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
        self._soft_limit_s = soft_limit_s
        self._started = time.monotonic()
        self._waited = 0.0
        self._soft_raised = False
        self._main_busy = 0  # our own store calls under way in the job's thread

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
        if self._lost:
            return True
        now = time.monotonic()
        if now - self._last_check >= self._check_interval:
            self._last_check = now
            with contextlib.suppress(InfrastructureError), self._busy():
                if not self._store.still_mine(self.task_id, self.worker):
                    self._lost = True
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
        """Write a pending status message now."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            self._last_write = time.monotonic()
        message, progress, total = pending
        with self._busy():
            if progress is None and total is None:
                mine = self._store.report(self.task_id, self.worker, message)
            else:
                mine = self._store.report(self.task_id, self.worker, message, progress, total)
        if not mine:
            self.mark_lost()

    def log(self, level: str, logger: str | None, data: Any, max_logs: int = 1000) -> None:
        """Record a log message for the task's synchronous caller (the context decided that the
        caller asked for this level). Not recorded past ``max_logs`` or once the task is not ours."""
        with contextlib.suppress(InfrastructureError), self._busy():
            self._store.log(self.task_id, self.worker, level, logger, data, max_logs)  # best effort

    def flush_if_due(self) -> None:
        """Write a pending message whose interval has passed (the lease thread calls this)."""
        with self._lock:
            due = self._pending is not None and time.monotonic() - self._last_write >= self._report_interval
        if due:
            self.flush()

    # ---- input requests --------------------------------------------------------------------

    def ask(self, requests: Requests, timeout_s: float) -> dict[str, Any]:
        """Make ``{key: (method, params, hash)}`` outstanding and block until all are answered.

        Answers recorded by an earlier run of the same job are returned at once; raises
        ``TaskCancelled`` if the task stops being ours, ``InputTimedOut`` after ``timeout_s``.
        """
        plan = self._plan(requests, self._store.all_inputs(self.task_id))
        pending = plan.pending
        if not pending:
            return plan.answers
        inbox = self._inbox()
        inbox.declare()  # the queue exists before any client can see the request
        if not self._store.open_inputs(self.task_id, self.worker, inbox.name, plan.to_open, plan.supersede):
            self.mark_lost()
            raise TaskCancelled("the task was cancelled")
        waiting_since = time.monotonic()
        try:
            with self._observer.waiting_for_input(self.tool_name, len(pending)), self._busy():
                answers = self._wait(inbox, list(pending.values()), time.monotonic() + timeout_s, timeout_s)
        finally:
            self._waited += time.monotonic() - waiting_since  # not counted against time limits
        return {**plan.answers, **{key: answers[stored] for key, stored in pending.items()}}

    @staticmethod
    def _plan(requests: Requests, recorded: dict[str, InputRecord]) -> _Plan:
        plan = _Plan()
        for key, (method, params, digest) in requests.items():
            aliases = [key, *sorted(k for k in recorded if k.startswith(key + "~"))]
            match = next(
                (
                    k
                    for k in aliases
                    if k in recorded and recorded[k].params_hash == digest and not recorded[k].superseded
                ),
                None,
            )
            if match is not None:
                plan.stored_key[key] = match  # asked before (a re-run): replay the answer or wait on
                continue
            if _AUTO_KEY.fullmatch(key):
                # An automatic key is ``<ordinal>-<hash>``: the same ordinal with another hash
                # is the question this re-run no longer asks; it must not stay outstanding.
                ordinal = key.split("-", 1)[0] + "-"
                plan.supersede += [
                    k
                    for k, row in recorded.items()
                    if k.startswith(ordinal) and k != key and row.response is None and not row.superseded
                ]
            new_key = key
            if key in recorded:
                # The key once named another request: never reuse it (S-26); ask anew.
                plan.supersede += [k for k in aliases if k in recorded and recorded[k].response is None]
                suffix = 2
                while f"{key}~{suffix}" in recorded:
                    suffix += 1
                new_key = f"{key}~{suffix}"
            plan.stored_key[key] = new_key
            plan.to_open.append({"key": new_key, "method": method, "params": params, "params_hash": digest})
        plan.answers = {
            key: recorded[stored].response
            for key, stored in plan.stored_key.items()
            if stored in recorded and recorded[stored].response is not None
        }
        return plan

    def _wait(self, inbox: InboxWaiter, keys: list[str], deadline: float, timeout_s: float) -> dict[str, Any]:
        """Block until every one of ``keys`` (row keys) has an answer; the answers by row key."""
        while True:
            mine, answers = self._store.input_state(self.task_id, self.worker, keys)
            if not mine:
                self.mark_lost()
                raise TaskCancelled("the task was cancelled")
            if all(key in answers for key in keys):
                return answers
            left = deadline - time.monotonic()
            if left <= 0:
                self._store.expire_inputs(self.task_id, self.worker, keys)
                raise InputTimedOut(f"Nobody answered the input request within {timeout_s:.0f} s")
            inbox.wait(self.task_id, min(left, _REREAD_S))
