"""Row → record conversion and parameter building, shared by both executors."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from mcp_celery_tasks.store.records import ClaimedTask, InputRecord, NewTask, TaskRecord

__all__ = ["claimed", "input_record", "new_task_params", "task_record"]


def task_record(row: dict[str, Any]) -> TaskRecord:
    return TaskRecord(
        task_id=row["task_id"],
        job_id=row["job_id"],
        owner=row["owner"],
        tool_name=row["tool_name"],
        status=row["status"],
        status_message=row["status_message"],
        result=row["result"],
        error=row["error"],
        created_at=row["created_at"],
        last_updated_at=row["last_updated_at"],
        retention_ms=row["retention_ms"],
        poll_interval_ms=row["poll_interval_ms"],
        expires_at=row["expires_at"],
        queue=row["queue"],
        inbox=row["inbox"],
        db_now=row["db_now"],
    )


def claimed(row: dict[str, Any]) -> ClaimedTask:
    return ClaimedTask(
        task_id=row["task_id"],
        job_id=row["job_id"],
        tool_name=row["tool_name"],
        arguments=row["arguments"],
        preflight=row["preflight"],
        client_capabilities=row["client_capabilities"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        queue=row.get("queue", ""),
        age_s=row.get("age_s") or 0.0,
    )


def input_record(row: dict[str, Any]) -> InputRecord:
    return InputRecord(
        key=row["key"],
        method=row["method"],
        params=row["params"],
        params_hash=row["params_hash"],
        response=row["response"],
        superseded=row["superseded"],
    )


def jsonb(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def new_task_params(task: NewTask) -> dict[str, Any]:
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
    }
