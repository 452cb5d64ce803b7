"""In-memory doubles of the API side's store and publisher, for unit tests that run in milliseconds.

``MemoryApiStore`` keeps rows in dicts and follows the same rules as the SQL in
``mcp_celery_tasks.store.queries``: guarded transitions from ``lifecycle``, owners checked on
every read, terminal rows never change, a transition notifies the event hub. Its ``as_worker``
methods play the worker's part (ask for input, finish). The integration tests hold the real
store to these rules against Postgres; these doubles only make the layers above it fast to test.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from mcp_celery_tasks.lifecycle import ACTIVE, Status, allowed_from
from mcp_celery_tasks.store import AnswerOutcome, CancelOutcome, InputRecord, NewTask, TaskError, TaskRecord
from mcp_celery_tasks.tools.inputs import params_hash

__all__ = ["MemoryApiStore", "RecordingPublisher"]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Row:
    task: NewTask
    status: Status = "working"
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: datetime = field(default_factory=_now)
    last_updated_at: datetime = field(default_factory=_now)
    expires_at: datetime | None = None
    inbox: str | None = None
    cancel_requested_at: datetime | None = None
    inputs: dict[str, InputRecord] = field(default_factory=dict)


class MemoryApiStore:
    """The ``ApiStore`` methods the service, the protocol modules and the hub use."""

    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.spent_states: dict[str, float] = {}
        self.limits: dict[str, dict[str, Any]] = {}
        """Per-principal quota overrides (rows of mcp_principal_limits)."""
        self._listeners: list[asyncio.Queue[str | None]] = []
        self.state_reads = 0
        """Batched re-reads of task states (the event hub's polls and sweeps)."""
        self._state_read = asyncio.Condition()

    # ---- reads -------------------------------------------------------------------------------

    def _record(self, row: _Row) -> TaskRecord:
        task = row.task
        return TaskRecord(
            task_id=task.task_id,
            job_id=task.job_id,
            owner=task.owner,
            tool_name=task.tool_name,
            status=row.status,
            status_message=row.status_message,
            result=row.result,
            error=cast(TaskError | None, row.error),
            created_at=row.created_at,
            last_updated_at=row.last_updated_at,
            retention_ms=task.retention_ms,
            poll_interval_ms=task.poll_interval_ms,
            expires_at=row.expires_at,
            queue=task.queue,
            inbox=row.inbox,
            dispatched_at=row.created_at,  # no fair backlog here: handed to the broker at once
            progress=None,
            progress_total=None,
            log_seq=0,
            request_digest=task.request_digest,
            db_now=_now(),
        )

    async def create_task(
        self, task: NewTask, max_active: int | None = None, rate: float = 0.0, burst: int = 1
    ) -> TaskRecord | None:
        """As ``ApiStore.create_task``; one process, so no bucket is shared (``rate`` is the
        per-process bucket's business)."""
        active = sum(1 for r in self.rows.values() if r.task.owner == task.owner and r.status in ACTIVE)
        if max_active is not None and active >= max_active:
            return None
        if task.idempotency_key is not None and (
            found := await self.task_by_key(task.owner, task.idempotency_key)
        ):
            return found
        self.rows[task.task_id] = _Row(task, status_message=task.status_message)
        return self._record(self.rows[task.task_id])

    async def bucket_wait(self, owner: str, rate: float, burst: int) -> float | None:
        return None

    async def task_by_key(self, owner: str, key: str) -> TaskRecord | None:
        for row in self.rows.values():
            if row.task.owner == owner and row.task.idempotency_key == key:
                return self._record(row)
        return None

    async def principal_limits(self) -> list[dict[str, Any]]:
        return list(self.limits.values())

    async def get_task(self, task_id: str, owner: str) -> TaskRecord | None:
        row = self.rows.get(task_id)
        return self._record(row) if row is not None and row.task.owner == owner else None

    async def get_tasks(self, task_ids: Sequence[str]) -> list[TaskRecord]:
        return [self._record(self.rows[t]) for t in task_ids if t in self.rows]

    async def task_states(self, task_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        self.state_reads += 1
        async with self._state_read:
            self._state_read.notify_all()  # the waiter runs once the caller has used the rows
        return [
            (t, row.status, row.status_message, row.last_updated_at, 0, None)
            for t in task_ids
            if (row := self.rows.get(t)) is not None
        ]

    async def state_reads_reach(self, count: int, timeout_s: float = 5.0) -> None:
        """Wait until ``state_reads`` is at least ``count``."""
        async with asyncio.timeout(timeout_s), self._state_read:
            await self._state_read.wait_for(lambda: self.state_reads >= count)

    async def task_exists(self, task_id: str, owner: str) -> bool:
        return await self.get_task(task_id, owner) is not None

    async def outstanding_inputs(self, task_id: str) -> list[InputRecord]:
        row = self.rows.get(task_id)
        if row is None:
            return []
        return [i for i in row.inputs.values() if i.response is None and not i.superseded]

    async def list_tasks(
        self, owner: str, session_id: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[TaskRecord]:
        mine = sorted(
            (r for r in self.rows.values() if r.task.owner == owner and r.task.session_id == session_id),
            key=lambda r: (r.created_at, r.task.task_id),
            reverse=True,
        )
        if after is not None:
            mine = [r for r in mine if (r.created_at, r.task.task_id) < after]
        return [self._record(r) for r in mine[:limit]]

    # ---- writes (the guarded transitions) -------------------------------------------------------

    def _move(self, row: _Row, target: Status) -> bool:
        if row.status not in allowed_from(target) and not (target == row.status and row.status in ACTIVE):
            return False
        row.status = target
        row.last_updated_at = _now()
        if target not in ACTIVE:
            row.expires_at = _now() + timedelta(milliseconds=row.task.retention_ms)
        self._notify(row.task.task_id)
        return True

    async def record_answers(self, task_id: str, answers: dict[str, Any]) -> AnswerOutcome:
        row = self.rows[task_id]
        answered = 0
        if row.status == "input_required":
            for key, response in answers.items():
                item = row.inputs.get(key)
                if item is not None and item.response is None and not item.superseded:
                    row.inputs[key] = replace(item, response=response)
                    answered += 1
        if not answered:
            return AnswerOutcome(0, None, None)
        if await self.outstanding_inputs(task_id):
            row.last_updated_at = _now()
        else:
            self._move(row, "working")
        return AnswerOutcome(answered, row.inbox, row.status, job_id=row.task.job_id)

    async def request_cancel(self, task_id: str, owner: str, message: str | None = None) -> CancelOutcome:
        row = self.rows.get(task_id)
        if row is None or row.task.owner != owner:
            return CancelOutcome(found=False)
        previous = row.status
        if not self._move(row, "cancelled"):
            return CancelOutcome(found=True)
        row.cancel_requested_at = _now()
        row.status_message = message or row.status_message
        for key, item in row.inputs.items():
            if item.response is None:
                row.inputs[key] = replace(item, superseded=True)
        return CancelOutcome(True, True, task_id, row.task.job_id, row.inbox, previous, row.task.tool_name)

    # ---- sessions ----------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        owner: str,
        protocol_version: str,
        capabilities: dict[str, Any],
        client_info: dict[str, Any] | None,
    ) -> bool:
        self.sessions[session_id] = {
            "session_id": session_id,
            "owner": owner,
            "protocol_version": protocol_version,
            "client_capabilities": capabilities,
            "client_info": client_info,
        }
        return True

    async def get_session(self, session_id: str, owner: str) -> dict[str, Any] | None:
        session = self.sessions.get(session_id)
        return session if session is not None and session["owner"] == owner else None

    async def delete_session(self, session_id: str, owner: str) -> bool:
        return self.sessions.pop(session_id, None) is not None

    async def spend_request_state(self, digest: str, expires: float) -> bool:
        if digest in self.spent_states:
            return False
        self.spent_states[digest] = expires
        return True

    # ---- the event hub's feed ----------------------------------------------------------------

    def _notify(self, task_id: str) -> None:
        for listener in self._listeners:
            listener.put_nowait(task_id)

    async def notifications(self) -> AsyncIterator[str | None]:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._listeners.append(queue)
        try:
            yield None
            while True:
                yield await queue.get()
        finally:
            self._listeners.remove(queue)

    # ---- the worker's part -------------------------------------------------------------------

    def as_worker_ask(self, task_id: str, requests: dict[str, tuple[str, dict[str, Any] | None]]) -> bool:
        """A worker makes ``{key: (method, params)}`` outstanding (input_required)."""
        row = self.rows[task_id]
        if row.status not in ACTIVE:
            return False
        for key, (method, params) in requests.items():
            row.inputs[key] = InputRecord(key, method, params, params_hash(method, params), None, False)
        row.inbox = "mcp.inbox.test"
        return self._move(row, "input_required")

    def as_worker_finish(
        self,
        task_id: str,
        status: Status,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> bool:
        row = self.rows[task_id]
        if not self._move(row, status):
            return False
        row.result, row.error = result, error
        row.status_message = message or row.status_message
        return True

    def as_worker_report(self, task_id: str, message: str) -> None:
        row = self.rows[task_id]
        if row.status in ACTIVE:
            row.status_message = message
            row.last_updated_at = _now()


class RecordingPublisher:
    """The publisher thread's interface, recording what it was asked to send."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []
        self.wakes: list[tuple[str, str]] = []
        self.revokes: list[str] = []
        self.headers: list[dict[str, str] | None] = []

    def publish_job(self, job_id: str, queue_name: str, headers: dict[str, str] | None = None) -> None:
        self.jobs.append((job_id, queue_name))
        self.headers.append(headers)

    def wake(self, inbox: str, job_id: str) -> None:
        self.wakes.append((inbox, job_id))

    def revoke(self, job_id: str) -> None:
        self.revokes.append(job_id)

    def check_broker(self) -> concurrent.futures.Future[bool]:
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        done.set_result(True)
        return done
