"""What a running job's TaskContext stands on: status writes, ownership checks, input waits
(rows plus the process's inbox), and the thread that keeps the job's lease.

Worker side only; no Celery here (``worker`` wires it into ``run_tool``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp_celery_tasks import metrics, tracing
from mcp_celery_tasks.channel import Inbox
from mcp_celery_tasks.context import TaskContext
from mcp_celery_tasks.errors import InfrastructureError, InputTimedOut, TaskCancelled
from mcp_celery_tasks.store import WorkerStore

__all__ = ["LeaseKeeper", "Runtime"]

logger = logging.getLogger(__name__)

_AUTO_KEY = re.compile(r"\d+-[0-9a-f]{16}")


class Runtime:
    """The TaskContext's view of the worker: status writes, ownership checks, input waits."""

    def __init__(self, store: WorkerStore, task_id: str, worker: str, inbox: Callable[[], Inbox]) -> None:
        self._store = store
        self._task_id = task_id
        self._worker = worker
        self._inbox = inbox
        self.ctx: TaskContext | None = None

    def write_status(self, message: str) -> None:
        if not self._store.report(self._task_id, self._worker, message) and self.ctx is not None:
            self.ctx.mark_lost()

    def still_running(self) -> bool:
        try:
            return self._store.still_mine(self._task_id, self._worker)
        except InfrastructureError:
            return True  # an unreadable row is not a cancel; the lease decides

    def ask(
        self, requests: dict[str, tuple[str, dict[str, Any] | None, str]], timeout_s: float
    ) -> dict[str, Any]:
        recorded = self._store.all_inputs(self._task_id)
        stored_key: dict[str, str] = {}
        to_open: list[dict[str, Any]] = []
        supersede: list[str] = []
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
                stored_key[key] = match  # asked before (a re-run): replay the answer or wait on
                continue
            if _AUTO_KEY.fullmatch(key):
                # An automatic key is ``<ordinal>-<hash>``: the same ordinal with another hash
                # is the question this re-run no longer asks; it must not stay outstanding.
                ordinal = key.split("-", 1)[0] + "-"
                supersede += [
                    k
                    for k, row in recorded.items()
                    if k.startswith(ordinal) and k != key and row.response is None and not row.superseded
                ]
            new_key = key
            if key in recorded:
                # The key once named another request: never reuse it (S-26); ask anew.
                supersede += [k for k in aliases if k in recorded and recorded[k].response is None]
                suffix = 2
                while f"{key}~{suffix}" in recorded:
                    suffix += 1
                new_key = f"{key}~{suffix}"
            stored_key[key] = new_key
            to_open.append({"key": new_key, "method": method, "params": params, "params_hash": digest})
        answers = {
            key: recorded[stored].response
            for key, stored in stored_key.items()
            if stored in recorded and recorded[stored].response is not None
        }
        pending = {key: stored for key, stored in stored_key.items() if key not in answers}
        if not pending:
            return answers
        inbox = self._inbox()
        inbox.declare()  # the queue exists before any client can see the request
        if not self._store.open_inputs(self._task_id, self._worker, inbox.name, to_open, supersede):
            raise TaskCancelled("the task was cancelled")
        deadline = time.monotonic() + timeout_s
        keys = list(pending.values())
        tool = self.ctx.tool_name if self.ctx is not None else "unknown"
        waiting_since = time.monotonic()
        metrics.inputs_waiting.labels(tool).inc()
        try:
            with tracing.tracer.start_as_current_span("input wait") as span:
                span.set_attribute("mcp.inputs", len(keys))
                return self._wait_for_answers(inbox, pending, keys, answers, deadline, timeout_s)
        finally:
            metrics.inputs_waiting.labels(tool).dec()
            metrics.input_wait_seconds.labels(tool).observe(time.monotonic() - waiting_since)

    def _wait_for_answers(
        self,
        inbox: Inbox,
        pending: dict[str, str],
        keys: list[str],
        answers: dict[str, Any],
        deadline: float,
        timeout_s: float,
    ) -> dict[str, Any]:
        while True:
            mine, recorded_answers = self._store.input_state(self._task_id, self._worker, keys)
            if not mine:
                if self.ctx is not None:
                    self.ctx.mark_lost()
                raise TaskCancelled("the task was cancelled")
            if all(stored in recorded_answers for stored in keys):
                answers.update({key: recorded_answers[stored] for key, stored in pending.items()})
                return answers
            left = deadline - time.monotonic()
            if left <= 0:
                self._store.expire_inputs(self._task_id, self._worker, keys)
                raise InputTimedOut(f"Nobody answered the input request within {timeout_s:.0f} s")
            # Re-read on every wake-up and every few seconds: a lost wake-up costs latency only.
            inbox.wait(self._task_id, min(left, 3.0))


@dataclass(slots=True)
class _Lease:
    ctx: TaskContext
    worker: str
    renewed: float


class LeaseKeeper:
    """Renews the leases of the jobs running in this process (CPU-bound tools never touch ctx)
    and flushes their coalesced status messages.

    One thread, started with the first job in the process and kept for every later one: a thread
    per job cost a fifth of a noop job's time (py-spy). Idle, it sleeps until a job comes.
    """

    TICK_S = 0.25
    RELEASE_WAIT_S = 5.0

    def __init__(self, store: WorkerStore, lease_s: float) -> None:
        self._store = store
        self._lease_s = lease_s
        self._pid: int | None = None  # the process whose thread this is (a fork has none)

    def _start(self) -> None:
        self._pid = os.getpid()
        self._jobs: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self._has_jobs = threading.Condition(self._lock)
        threading.Thread(target=self._loop, name="mcp-leases", daemon=True).start()

    def watch(self, ctx: TaskContext, worker: str) -> None:
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            self._jobs[ctx.task_id] = _Lease(ctx, worker, time.monotonic())
            self._has_jobs.notify()

    def release(self, ctx: TaskContext) -> None:
        """From here on the keeper leaves ``ctx`` alone (a renewal under way ends first)."""
        locked = self._lock.acquire(timeout=self.RELEASE_WAIT_S)
        try:
            self._jobs.pop(ctx.task_id, None)
        finally:
            if locked:
                self._lock.release()

    def _loop(self) -> None:
        renew_every = self._lease_s / 3
        while True:
            with self._lock:
                while not self._jobs:
                    self._has_jobs.wait()
            time.sleep(self.TICK_S)
            with self._lock:
                for lease in list(self._jobs.values()):
                    self._tend(lease, renew_every)

    def _tend(self, lease: _Lease, renew_every: float) -> None:
        try:
            lease.ctx._flush_if_due()
            now = time.monotonic()
            if now - lease.renewed >= renew_every:
                lease.renewed = now
                if not self._store.renew_lease(lease.ctx.task_id, lease.worker, self._lease_s):
                    lease.ctx.mark_lost()
        except InfrastructureError:
            logger.warning("lease renewal failed for job %s", lease.ctx.job_id, exc_info=True)
        except Exception:
            # Never let one job's failure stop the thread that keeps every later job's lease.
            logger.exception("lease keeping failed for job %s", lease.ctx.job_id)
