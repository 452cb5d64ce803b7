"""Parameter building shared by both executors (rows map onto records through psycopg's
``class_row`` or ``args_row``: the column lists in ``queries`` are the records' field names, in
order)."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from mcp_celery_tasks.store.records import CancelOutcome, NewTask
from mcp_celery_tasks.store.row_types import CancelRow

__all__ = ["cancel_outcome", "jsonb", "new_task_params"]


def jsonb(value: object) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def new_task_params(task: NewTask) -> dict[str, object]:
    return {
        "task_id": task.task_id,
        "job_id": task.job_id,
        "owner": task.owner,
        "tool_name": task.tool_name,
        "arguments": Jsonb(task.arguments),
        "preflight": jsonb(task.preflight),
        "status_message": task.status_message,
        "ttl_ms": task.ttl_ms,
        "retention_ms": task.retention_ms,
        "poll_interval_ms": task.poll_interval_ms,
        "queue": task.queue,
        "max_attempts": task.max_attempts,
        "protocol_version": task.protocol_version,
        "client_capabilities": Jsonb(task.client_capabilities),
        "client_info": jsonb(task.client_info),
        "session_id": task.session_id,
        "log_level": task.log_level,
        "idempotency_key": task.idempotency_key,
        "request_digest": task.request_digest,
        "synchronous": task.synchronous,
        "concurrency_group": task.concurrency_group,
        "concurrency_limit": task.concurrency_limit,
    }


def cancel_outcome(row: CancelRow) -> CancelOutcome:
    """A row of ``queries.CANCEL`` (one task cancelled just now)."""
    return CancelOutcome(
        found=True,
        cancelled_now=True,
        task_id=row["task_id"],
        job_id=row["job_id"],
        inbox=row["inbox"],
        previous_status=row["previous_status"],
        tool=row["tool_name"],
    )
