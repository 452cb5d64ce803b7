"""The worker side in memory: a store and an inbox, for tests that run jobs without services.

``MemoryStore`` implements exactly the ``WorkerStore`` methods the runner, the runtime and the
lease keeper call, with the guards of the SQL in ``store/queries.py``: terminal rows never
change, a worker's writes are fenced by ``worker = me``, the claim honours leases, cancels and
the attempt cap. The integration tests check the SQL itself; these check the code above it, in
milliseconds. Test helpers (``add``, ``cancel``, ``answer``, ``fail``) play the API's part.

Held to ``WorkerStore`` by one contract suite (``tests/integration/test_store_contract.py``): the
same tests pass against both.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from mcp_celery_tasks.errors import InfrastructureError, TaskError
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.store.records import ClaimedTask, InputItem, InputRecord
from mcp_celery_tasks.store.row_types import JobState
from mcp_celery_tasks.testing.memory_steps import MemorySteps, TaskDurables

__all__ = ["ACTIVE", "TERMINAL", "MemoryInbox", "MemoryStore", "Row", "answer_everything"]

ACTIVE = ("working", "input_required")
TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Row:
    """One ``mcp_tasks`` row (the columns the worker side reads or writes)."""

    task_id: str
    job_id: str
    tool_name: str
    arguments: JSONObject
    status: str = "working"
    status_message: str | None = None
    result: JSONObject | None = None
    error: TaskError | None = None
    error_kind: str | None = None
    error_message: str | None = None
    preflight: JSONObject | None = None
    client_capabilities: JSONObject = field(default_factory=dict)
    queue: str = "mcp.default"
    owner: str = "anon"
    attempts: int = 0
    max_attempts: int = 3
    redeliveries: int = 0
    worker: str | None = None
    lease_until: float | None = None
    inbox: str | None = None
    cancel_requested: bool = False
    started: bool = False
    finished: bool = False
    created_at: float = field(default_factory=time.monotonic)
    inputs: dict[str, InputRecord] = field(default_factory=dict)
    progress: float | None = None
    progress_total: float | None = None
    suspended_at: float | None = None
    device: str | None = None
    """When the job gave its slot back waiting for input (None: resident, or not waiting)."""
    resumed_at: float | None = None
    suspensions: int = 0
    retry_at: float | None = None
    """A scheduled retry's time (``schedule_retry``); the claim refuses the job until it passes."""
    logs: list[tuple[str, str | None, JSONValue]] = field(default_factory=list)
    log_level: str | None = None
    synchronous: bool = False
    reports: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    """Every status report written, in order (``status_message`` is the last one)."""


class MemoryStore(MemorySteps):
    """An in-memory ``WorkerStore`` for the worker side (same guards as the SQL); the methods of
    durable steps and checkpoints come from ``MemorySteps``."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_redeliveries: int = 50, max_suspended: int = 0
    ) -> None:
        self.max_redeliveries = max_redeliveries
        self.max_suspended = max_suspended
        self.demand = False
        """What ``suspend_now`` answers: other jobs of the queue wait for a slot."""
        self.rows: dict[str, Row] = {}
        self.durables: dict[str, TaskDurables] = {}
        self.calls: list[str] = []
        self._failures: dict[str, int] = {}
        self._clock = clock
        self._lock = threading.Lock()

    # ---- helpers for tests -------------------------------------------------------------------

    def add(self, tool_name: str, arguments: Mapping[str, object] | None = None, **columns: Any) -> Row:
        """A new active row, as the API would create it."""
        task_id = columns.pop("task_id", uuid.uuid4().hex)
        job_id = columns.pop("job_id", uuid.uuid4().hex)
        row = Row(
            task_id=task_id,
            job_id=job_id,
            tool_name=tool_name,
            arguments=_as_json(arguments or {}),
            **columns,
        )
        self.rows[task_id] = row
        return row

    def fail(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` raise ``InfrastructureError`` (a database outage)."""
        self._failures[method] = times

    def cancel(self, task_id: str) -> None:
        """tasks/cancel: an active row becomes cancelled; its outstanding inputs vanish."""
        row = self.rows[task_id]
        if row.status in ACTIVE:
            row.status, row.cancel_requested = "cancelled", True
            if row.suspended_at is not None and row.worker is None:
                row.finished = True  # no process to stop
            for key, rec in row.inputs.items():
                if rec.response is None:
                    row.inputs[key] = replace(rec, superseded=True)

    def answer(self, task_id: str, key: str, response: Mapping[str, object]) -> None:
        """tasks/update: record an answer to an outstanding key; back to working when none remain."""
        row = self.rows[task_id]
        rec = row.inputs.get(key)
        if rec is None or rec.response is not None or rec.superseded:
            return
        row.inputs[key] = replace(rec, response=_as_json(response))
        if row.status == "input_required" and not self._outstanding(row):
            row.status = "working"
            if row.suspended_at is not None:  # back to the backlog: the next claim runs it again
                row.suspended_at, row.resumed_at = None, self._clock()

    def outstanding(self, task_id: str) -> list[str]:
        return sorted(self._outstanding(self.rows[task_id]))

    def by_job(self, job_id: str) -> Row | None:
        return next((row for row in self.rows.values() if row.job_id == job_id), None)

    # ---- claim and lease -----------------------------------------------------------------------

    def claim(
        self, job_id: str, worker: str, lease_s: float, device: str | None = None
    ) -> ClaimedTask | None:
        self._call("claim")
        row = self.by_job(job_id)
        now = self._clock()
        if row is None or row.status not in ACTIVE or row.cancel_requested or row.suspended_at is not None:
            return None
        if row.retry_at is not None and row.retry_at > now:
            return None
        taken = row.worker is not None and row.lease_until is not None and row.lease_until >= now
        if taken and row.worker != worker:
            return None
        if row.attempts >= row.max_attempts or row.redeliveries >= self.max_redeliveries:
            return None
        row.worker, row.lease_until, row.started, row.device = worker, now + lease_s, True, device
        row.attempts += 1
        return ClaimedTask(
            task_id=row.task_id,
            job_id=row.job_id,
            tool_name=row.tool_name,
            arguments=row.arguments,
            preflight=row.preflight,
            client_capabilities=row.client_capabilities,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            queue=row.queue,
            owner=row.owner,
            age_s=now - row.created_at,
            log_level=row.log_level,
            synchronous=row.synchronous,
            suspensions=row.suspensions,
            resumed_for_s=None if row.resumed_at is None else now - row.resumed_at,
        )

    def job_state(self, job_id: str) -> JobState | None:
        self._call("job_state")
        row = self.by_job(job_id)
        if row is None:
            return None
        left = max(0.0, row.lease_until - self._clock()) if row.lease_until is not None else 0.0
        return {
            "task_id": row.task_id,
            "status": row.status,
            "attempts": row.attempts,
            "max_attempts": row.max_attempts,
            "redeliveries": row.redeliveries,
            "worker": row.worker,
            "lease_left_s": left,
        }

    def fail_exhausted(
        self, job_id: str, error: TaskError, message: str, kind: str = "attempts_exhausted"
    ) -> bool:
        self._call("fail_exhausted")
        row = self.by_job(job_id)
        if row is None or row.status not in ACTIVE:
            return False
        if row.attempts < row.max_attempts and row.redeliveries < self.max_redeliveries:
            return False
        if row.worker is not None and row.lease_until is not None and row.lease_until >= self._clock():
            return False
        row.status, row.error, row.status_message = "failed", error, message
        row.error_kind, row.error_message = kind, message
        row.finished, row.lease_until = True, None
        return True

    def renew_lease(self, task_id: str, worker: str, lease_s: float) -> bool:
        self._call("renew_lease")
        row = self._mine(task_id, worker)
        if row is None:
            return False
        row.lease_until = self._clock() + lease_s
        return True

    def give_back(self, task_id: str, worker: str) -> bool:
        self._call("give_back")
        row = self._mine(task_id, worker)
        if row is None:
            return False
        row.worker, row.lease_until = None, self._clock()
        row.attempts, row.redeliveries = max(row.attempts - 1, 0), row.redeliveries + 1
        return True

    # ---- while running -------------------------------------------------------------------------

    def still_mine(self, task_id: str, worker: str) -> bool:
        self._call("still_mine")
        return self._mine(task_id, worker) is not None

    def report(
        self,
        task_id: str,
        worker: str,
        message: str,
        progress: float | None = None,
        total: float | None = None,
    ) -> bool:
        self._call("report")
        row = self._mine(task_id, worker)
        if row is None:
            return False
        row.status_message = message
        row.reports.append((message, progress, total))
        row.progress = progress if progress is not None else row.progress
        row.progress_total = total if total is not None else row.progress_total
        return True

    def log(
        self, task_id: str, worker: str, level: str, logger: str | None, data: JSONValue, max_logs: int
    ) -> bool:
        self._call("log")
        row = self._mine(task_id, worker)
        if row is None or len(row.logs) >= max_logs:
            return False
        row.logs.append((level, logger, data))
        return True

    # ---- input requests ------------------------------------------------------------------------

    def all_inputs(self, task_id: str) -> dict[str, InputRecord]:
        self._call("all_inputs")
        return dict(self.rows[task_id].inputs)

    def open_inputs(
        self,
        task_id: str,
        worker: str,
        inbox: str,
        items: Sequence[InputItem],
        supersede: Sequence[str] = (),
        may_suspend: bool = False,
    ) -> bool:
        self._call("open_inputs")
        row = self._mine(task_id, worker)
        if row is None:
            return False
        row.status, row.inbox = "input_required", inbox
        for key in supersede:
            rec = row.inputs.get(key)
            if rec is not None and rec.response is None:
                row.inputs[key] = replace(rec, superseded=True)
        for item in items:
            if item["key"] not in row.inputs:  # ON CONFLICT DO NOTHING
                params = None if item["params"] is None else _as_json(item["params"])
                row.inputs[item["key"]] = InputRecord(
                    item["key"], item["method"], params, item["params_hash"], None, False
                )
        return True

    def suspend_now(self, task_id: str) -> bool:
        self._call("suspend_now")
        return self.demand

    def suspend(self, task_id: str, worker: str) -> bool:
        self._call("suspend")
        row = self._mine(task_id, worker)
        if (
            row is None
            or row.status != "input_required"
            or row.cancel_requested
            or not self._outstanding(row)
        ):
            return False
        held = sum(1 for r in self.rows.values() if r.suspended_at is not None and r.status in ACTIVE)
        if 0 < self.max_suspended <= held:
            return False
        row.worker, row.lease_until, row.inbox = None, None, None
        row.suspended_at, row.suspensions = self._clock(), row.suspensions + 1
        row.attempts = max(row.attempts - 1, 0)
        return True

    def schedule_retry(
        self, task_id: str, worker: str, delay_s: float, message: str, kind: str, detail: str
    ) -> bool:
        self._call("schedule_retry")
        row = self._mine(task_id, worker)
        if row is None or row.status != "working" or row.cancel_requested or row.attempts >= row.max_attempts:
            return False
        row.worker, row.lease_until, row.inbox = None, None, None
        row.retry_at, row.status_message = self._clock() + delay_s, message
        row.error_kind, row.error_message = kind, detail
        return True

    def input_state(
        self, task_id: str, worker: str, keys: Sequence[str]
    ) -> tuple[bool, dict[str, JSONObject]]:
        self._call("input_state")
        row = self.rows.get(task_id)
        if row is None:
            return False, {}
        answers = {
            key: response
            for key, rec in row.inputs.items()
            if key in keys and (response := rec.response) is not None
        }
        return row.status in ACTIVE and row.worker == worker, answers

    def expire_inputs(self, task_id: str, worker: str, keys: Sequence[str]) -> None:
        self._call("expire_inputs")
        row = self.rows[task_id]
        for key in keys:
            rec = row.inputs.get(key)
            if rec is not None and rec.response is None:
                row.inputs[key] = replace(rec, superseded=True)
        if row.worker == worker and row.status == "input_required" and not self._outstanding(row):
            row.status = "working"

    # ---- outcome -----------------------------------------------------------------------------

    def finish(
        self,
        task_id: str,
        worker: str,
        status: str,
        *,
        result: JSONObject | None = None,
        error: TaskError | None = None,
        message: str | None = None,
        error_kind: str | None = None,
        error_message: str | None = None,
    ) -> bool:
        self._call("finish")
        row = self._mine(task_id, worker)
        if row is None:
            return False
        row.status, row.result, row.error = status, result, error
        row.error_kind, row.error_message = error_kind, error_message
        row.status_message = message  # a finished task says how it ended, never its last progress
        row.finished, row.lease_until = True, None
        return True

    def mark_stopped(self, task_id: str, worker: str) -> None:
        self._call("mark_stopped")
        row = self.rows[task_id]
        if row.worker == worker and not row.finished and row.status in TERMINAL:
            row.finished, row.lease_until = True, None

    # ---- guards ----------------------------------------------------------------------------------

    def _call(self, method: str) -> None:
        with self._lock:
            self.calls.append(method)
            left = self._failures.get(method, 0)
            if left:
                self._failures[method] = left - 1
                raise InfrastructureError("the task database is unavailable")

    @staticmethod
    def _outstanding(row: Row) -> set[str]:
        return {key for key, rec in row.inputs.items() if rec.response is None and not rec.superseded}

    def _mine(self, task_id: str, worker: str) -> Row | None:
        """The row, if active and held by ``worker`` (the fence of every worker write)."""
        row = self.rows.get(task_id)
        if row is None or row.status not in ACTIVE or row.worker != worker:
            return None
        return row


class MemoryInbox:
    """The process's inbox: ``on_wait(task_id)`` plays the client (answers, cancels) while a job
    waits."""

    def __init__(self, on_wait: Callable[[str], None] | None = None, name: str = "mcp.inbox.test") -> None:
        self.name = name
        self.declared = 0
        self.waits = 0
        self._on_wait = on_wait

    def declare(self) -> None:
        self.declared += 1

    def wait(self, job_id: str, timeout_s: float, task_id: str = "") -> bool:
        self.waits += 1
        if self._on_wait is None:
            time.sleep(min(timeout_s, 0.01))
            return False
        self._on_wait(task_id or job_id)
        return True


def answer_everything(store: MemoryStore, response: Mapping[str, object]) -> Callable[[str], None]:
    """An ``on_wait`` for ``MemoryInbox``: the client answers every outstanding request."""

    def on_wait(task_id: str) -> None:
        for key in store.outstanding(task_id):
            store.answer(task_id, key, response)

    return on_wait


def _as_json(value: Mapping[str, object]) -> JSONObject:
    """A JSON object kept as given: Postgres stores it as jsonb and reads JSON back; here it
    stays the caller's object (a tool's params, which the context hashed as JSON, or a test's
    answer)."""
    return cast("JSONObject", value)
