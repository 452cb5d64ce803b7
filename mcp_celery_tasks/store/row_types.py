"""The rows the store's statements return, as TypedDicts, and ``typed_rows`` to fetch them.

``typed_rows(Shape)`` is psycopg's ``dict_row`` with its rows typed as ``Shape`` (the
statement's columns, named by its ``SELECT`` or ``RETURNING`` list): nothing is checked or
copied at run time. A row whose columns are read generically (the admin commands print them) is
a ``Mapping[str, object]`` (``OPEN_ROWS``). Hot reads map onto the records by position instead
(``args_row``, ``class_row``: ``records``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import NotRequired, TypedDict, TypeVar, cast

from psycopg.rows import BaseRowFactory, dict_row

from mcp_celery_tasks.json_types import JSONObject, JSONValue

__all__ = [
    "OPEN_ROWS",
    "AnswerRow",
    "CancelRow",
    "CheckpointFlip",
    "CheckpointGone",
    "ChunkRow",
    "Headroom",
    "Holder",
    "InputState",
    "JobId",
    "JobQueue",
    "JobState",
    "PrincipalLimits",
    "QueueCount",
    "QueuePosition",
    "QueueRow",
    "ReleaseRow",
    "Seconds",
    "StepEntry",
    "StepResultRow",
    "StepWriteRow",
    "SuspendNow",
    "WaitingQuota",
    "typed_rows",
]

T = TypeVar("T")

OPEN_ROWS: BaseRowFactory[Mapping[str, object]] = dict_row
"""Rows read by column name, each value narrowed where it is read (the admin commands')."""


def typed_rows(shape: type[T]) -> BaseRowFactory[T]:
    """``dict_row``, its rows typed as ``shape`` (a TypedDict of the statement's columns)."""
    return cast("BaseRowFactory[T]", dict_row)


class JobState(TypedDict):
    """``queries.JOB_STATE``: why a job could not be claimed."""

    task_id: str
    status: str
    attempts: int
    max_attempts: int
    redeliveries: int
    worker: str | None
    lease_left_s: float


class Holder(TypedDict):
    """``queries.CHECKPOINT``: whether the task is still this worker's to run."""

    status: str
    worker: str | None


class InputState(TypedDict):
    """``queries.INPUT_STATE``: the holder, and the answers recorded for the asked keys."""

    status: str
    worker: str | None
    answers: dict[str, JSONObject]


class WaitingQuota(TypedDict):
    """``backlog.WAITING_QUOTA``: the principal's room for another wait in the task's queue."""

    max_waiting: int
    waiting: int
    max_suspended: int
    suspended: int
    queue: str


class SuspendNow(TypedDict):
    """``queries.SUSPEND_NOW``."""

    now: bool | None


class CancelRow(TypedDict):
    """``queries.CANCEL``: one task cancelled just now."""

    task_id: str
    job_id: str
    inbox: str | None
    tool_name: str
    previous_status: str


class AnswerRow(TypedDict):
    """``queries.RECORD_ANSWERS``: what recording answers did (the task columns are null when
    nothing changed)."""

    answered: int
    inbox: str | None
    status: str | None
    job_id: str | None
    queue: str | None
    resumed: bool


class QueuePosition(TypedDict):
    """``backlog.QUEUE_POSITION``."""

    ahead: int
    capped: bool


class Seconds(TypedDict):
    """``queries.SECONDS_SINCE_RUN``."""

    seconds: float


class JobQueue(TypedDict):
    """A job and its queue: what the publisher, the sweeps and the recovery re-publish."""

    job_id: str
    queue: str


class JobId(TypedDict):
    job_id: str


class QueueRow(TypedDict):
    queue: str


class ReleaseRow(TypedDict):
    """``backlog.RELEASE``: a released job (null in the one row of a release of none), and the
    queue's room before it."""

    job_id: str | None
    queue: str | None
    room: int
    held: int
    limited: bool


class QueueCount(TypedDict):
    """``backlog.QUEUED_COUNTS``."""

    queue: str
    queued: int
    old: int


class StepEntry(TypedDict):
    """``step_queries.STEP_INDEX``."""

    seq: int
    name: str


class StepResultRow(TypedDict):
    """``step_queries.STEP_RESULT``: the result as ``json`` decodes it."""

    result: JSONValue


class StepWriteRow(TypedDict):
    """``step_queries.RECORD_STEP``: counts (0 or 1) of the fence and of the insert."""

    mine: int
    recorded: int


class ChunkRow(TypedDict):
    data: bytes


class CheckpointFlip(TypedDict):
    """``step_queries.RECORD_CHECKPOINT``: when it was saved, and the generation it replaced."""

    saved_at: datetime
    generation: str | None
    storage: str | None
    path: str | None


class CheckpointGone(TypedDict):
    """``step_queries.DELETE_CHECKPOINT``: the fence (0 or 1), and the deleted checkpoint."""

    mine: int
    generation: str | None
    storage: str | None
    path: str | None


class PrincipalLimits(TypedDict):
    """``admin_queries.PRINCIPAL_LIMITS``: a principal's overrides (None, or left out: the
    default). The statement selects every column; a quota reads only the limits."""

    principal: str
    max_active_tasks: NotRequired[int | None]
    creates_per_second: NotRequired[float | None]
    create_burst: NotRequired[int | None]
    max_concurrent_requests: NotRequired[int | None]
    max_waiting_inputs: NotRequired[int | None]
    note: NotRequired[str | None]
    updated_at: NotRequired[datetime]


class Headroom(TypedDict):
    used: int
    max: int
