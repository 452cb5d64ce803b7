"""Frozen records the store hands out: never ORM rows, never open cursors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from mcp_celery_tasks.lifecycle import ACTIVE, INPUT_REQUIRED, Status

__all__ = [
    "AnswerOutcome",
    "CancelOutcome",
    "ClaimedTask",
    "InputRecord",
    "LogRecord",
    "NewTask",
    "SessionRecord",
    "TaskError",
    "TaskRecord",
]


class TaskError(TypedDict):
    """A failed task's stored JSON-RPC error object (SEP-2663 ``error``: code, message, data?)."""

    code: int
    message: str
    data: NotRequired[Any]


class SessionRecord(TypedDict):
    """A live 2025-11-25 session, as ``get_session`` reads it."""

    session_id: str
    owner: str
    protocol_version: str
    client_capabilities: dict[str, Any]
    client_info: dict[str, Any] | None
    log_level: str | None


@dataclass(frozen=True, slots=True)
class NewTask:
    """Everything the API knows when it creates a task."""

    task_id: str
    job_id: str
    owner: str
    tool_name: str
    arguments: dict[str, Any]
    queue: str
    ttl_ms: int | None
    retention_ms: int
    poll_interval_ms: int
    max_attempts: int
    protocol_version: str
    client_capabilities: dict[str, Any]
    client_info: dict[str, Any] | None
    preflight: dict[str, Any] | None = None
    status_message: str | None = None
    session_id: str | None = None
    """The 2025-11-25 session that created the task (SEP-1686 tasks/list lists per session)."""
    log_level: str | None = None
    """The lowest level of the job's log messages a synchronous caller asked for (None: none)."""


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as clients and the API see it (arguments are not loaded).

    Rows map onto it by position (psycopg ``args_row``): the queries select ``TASK_COLUMNS``
    (these fields in this order) and then ``db_now``, which is why ``db_now`` comes last.
    """

    task_id: str
    job_id: str
    owner: str
    tool_name: str
    status: Status
    status_message: str | None
    result: dict[str, Any] | None
    error: TaskError | None
    created_at: datetime
    last_updated_at: datetime
    retention_ms: int
    poll_interval_ms: int
    expires_at: datetime | None
    queue: str
    inbox: str | None
    dispatched_at: datetime | None
    """When the job left the fair backlog for the broker (None: still waiting its turn)."""
    progress: float | None
    progress_total: float | None
    """The job's last numeric progress report (``notifications/progress`` of a synchronous call)."""
    log_seq: int
    """How many log messages the job recorded for its synchronous caller."""
    db_now: datetime
    """The database clock when the row was read: TTLs are computed against it."""

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def reported_ttl_ms(self) -> int:
        """``ttlMs`` per DESIGN §3: a running task never expires; a finished one at ``expires_at``.

        While active: elapsed + retention (so ``createdAt + ttlMs`` is always at least
        ``retention`` in the future). Once terminal: ``expires_at - createdAt``, fixed.
        """
        if self.expires_at is not None:
            end = self.expires_at
            return max(1, int((end - self.created_at).total_seconds() * 1000))
        elapsed = max(0, int((self.db_now - self.created_at).total_seconds() * 1000))
        return elapsed + self.retention_ms


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """What a worker gets when it claims a job."""

    task_id: str
    job_id: str
    tool_name: str
    arguments: dict[str, Any]
    preflight: dict[str, Any] | None
    client_capabilities: dict[str, Any]
    attempts: int
    max_attempts: int
    queue: str = ""
    age_s: float = 0.0
    """Seconds since the task was created, by the database clock, at the claim."""
    log_level: str | None = None
    """The lowest log level the synchronous caller asked for; None: keep logs in the worker log."""
    suspensions: int = 0
    """How often the job gave its slot back waiting for input (this run resumes the last one)."""
    resumed_for_s: float | None = None
    """Seconds since the answer that resumed the job was recorded (None: not a resume)."""


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One input request of a task (an ``inputRequests`` entry)."""

    key: str
    method: str
    params: dict[str, Any] | None
    params_hash: str
    response: dict[str, Any] | None
    superseded: bool


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One log message a job recorded for its synchronous caller (``notifications/message``)."""

    seq: int
    level: str
    logger: str | None
    data: Any


@dataclass(frozen=True, slots=True)
class AnswerOutcome:
    """What recording answers did: how many, and where the waiting worker listens (or, for a
    suspended job whose last question was answered, that it went back to the backlog)."""

    answered: int
    inbox: str | None
    status: str | None
    resumed: bool = False
    job_id: str | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a cancel did. ``found`` is False for unknown (or, for a principal, foreign) tasks."""

    found: bool
    cancelled_now: bool = False
    task_id: str | None = None
    job_id: str | None = None
    inbox: str | None = None
    previous_status: str | None = None
    tool: str | None = None

    @property
    def wake_inbox(self) -> str | None:
        """The inbox to wake: a worker blocked on input notices a cancel only when woken."""
        return self.inbox if self.cancelled_now and self.previous_status == INPUT_REQUIRED else None
