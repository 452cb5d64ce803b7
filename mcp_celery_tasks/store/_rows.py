"""Parameter building shared by both executors (rows map onto records through psycopg's
``class_row`` or ``args_row``: the column lists in ``queries`` are the records' field names, in
order)."""

from __future__ import annotations

import json
import re
from typing import Final

from psycopg.types.json import Jsonb

from mcp_celery_tasks.store.records import CancelOutcome, NewTask
from mcp_celery_tasks.store.row_types import CancelRow

__all__ = ["cancel_outcome", "jsonb", "new_task_params", "nul_free", "nul_free_jsonb"]

REPLACEMENT: Final = "\ufffd"
_ESCAPED_NUL: Final = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
"""``\\u0000`` in JSON text, not preceded by an odd number of backslashes (``\\\\u0000`` is a
backslash, then ``u0000``)."""


def jsonb(value: object) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def nul_free_jsonb(value: object) -> Jsonb | None:
    """``jsonb`` for what tool code wrote (a result, an error, log data, a question): Postgres
    can store no NUL character, in ``jsonb`` or ``text``, and a tool's output that holds one
    would fail the write on every attempt. It becomes U+FFFD (the replacement character)."""
    return None if value is None else Jsonb(value, dumps=_nul_free_dumps)


def nul_free(text: str | None) -> str | None:
    """A tool's text (a status message, an error) with each NUL as U+FFFD (``nul_free_jsonb``)."""
    return None if text is None else text.replace("\x00", REPLACEMENT)


def _nul_free_dumps(value: object) -> str:
    dumped = json.dumps(value)
    return _ESCAPED_NUL.sub(r"\1\\ufffd", dumped) if "u0000" in dumped else dumped


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
