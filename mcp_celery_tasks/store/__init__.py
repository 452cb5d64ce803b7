"""The only door to Postgres: the API's async store and the workers' sync store."""

from mcp_celery_tasks.store.aio import ApiStore
from mcp_celery_tasks.store.records import (
    AnswerOutcome,
    CancelOutcome,
    ClaimedTask,
    InputRecord,
    LogRecord,
    NewTask,
    SessionRecord,
    TaskError,
    TaskRecord,
)
from mcp_celery_tasks.store.sync import WorkerStore

__all__ = [
    "AnswerOutcome",
    "ApiStore",
    "CancelOutcome",
    "ClaimedTask",
    "InputRecord",
    "LogRecord",
    "NewTask",
    "SessionRecord",
    "TaskError",
    "TaskRecord",
    "WorkerStore",
]
