"""Frozen records the store hands out: never ORM rows, never open cursors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from mcp_celery_tasks.errors import TaskError
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.lifecycle import ACTIVE, INPUT_REQUIRED, Status

__all__ = [
    "AnswerOutcome",
    "CancelOutcome",
    "ClaimedTask",
    "InputItem",
    "InputRecord",
    "LogRecord",
    "NewTask",
    "SessionRecord",
    "TaskError",
    "TaskRecord",
]


class SessionRecord(TypedDict):
    """A live 2025-11-25 session, as ``get_session`` reads it."""

    session_id: str
    owner: str
    protocol_version: str
    client_capabilities: JSONObject
    client_info: JSONObject | None
    log_level: str | None


@dataclass(frozen=True, slots=True)
class NewTask:
    """Everything the API knows when it creates a task."""

    task_id: str
    job_id: str
    owner: str
    tool_name: str
    arguments: Mapping[str, object]
    queue: str
    ttl_ms: int | None
    retention_ms: int
    poll_interval_ms: int
    max_attempts: int
    protocol_version: str
    client_capabilities: Mapping[str, object]
    client_info: Mapping[str, object] | None
    preflight: Mapping[str, object] | None = None
    status_message: str | None = None
    session_id: str | None = None
    """The 2025-11-25 session that created the task (SEP-1686 tasks/list lists per session)."""
    log_level: str | None = None
    """The lowest level of the job's log messages a synchronous caller asked for (None: none)."""
    idempotency_key: str | None = None
    """The client's idempotency key: one live task per owner and key (``tasks.idempotency``)."""
    request_digest: str | None = None
    """What a keyed call asked for (tool and arguments), to tell a retry from a reused key."""
    synchronous: bool = False
    """A plain ``tools/call`` waits for this run (no task handle was given)."""
    concurrency_group: str | None = None
    concurrency_limit: int | None = None
    """The tool's concurrency group of this call and its declared limit (``tools.concurrency``)."""


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
    result: JSONObject | None
    """The ``CallToolResult`` the job stored (``tools.results``), sent as it is."""
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
    request_digest: str | None
    """The digest of a keyed call's tool and arguments (None: created without a key)."""
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
    arguments: JSONObject
    preflight: JSONObject | None
    client_capabilities: JSONObject
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
    owner: str = ""
    """The principal that created the task (a tool keeps one principal's files apart from another's)."""
    synchronous: bool = False
    """The run backs a synchronous call (``ctx.is_task`` is False)."""


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One input request of a task (an ``inputRequests`` entry)."""

    key: str
    method: str
    params: JSONObject | None
    params_hash: str
    response: JSONObject | None
    superseded: bool


class InputItem(TypedDict):
    """One input request a job opens (``WorkerStore.open_inputs``): a row of ``mcp_task_inputs``."""

    key: str
    method: str
    params: Mapping[str, object] | None
    """JSON (a tool's request params)."""
    params_hash: str


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One log message a job recorded for its synchronous caller (``notifications/message``)."""

    seq: int
    level: str
    logger: str | None
    data: JSONValue


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
