"""Retry a finished task as a new task: the same tool, arguments, answers given before it started
and principal, made by the service's create path (``TaskService.create``), so the principal's
quotas (active tasks, creates per second), the tool's concurrency limit and the fair release
apply to it as to any create.

Only a task that failed, was cancelled (and has stopped) or completed with a tool error may be
retried. The new task's id reaches no client: nobody holds it, so its result is read on the
console or with ``tasks show <job id>``. The new row says whose retry it is: its first status
message (``retry of job X by admin:Y``, until the tool reports its own) and, for good, its
``client_info`` (``{"name": "mcp-celery-tasks console", "retryOf": X, "by": "admin:Y"}``),
shown on its page. Each job is retried once: the create carries the idempotency key
``console-retry:<job id>`` in the principal's keys, so a second retry of the same job (a double
click, a bulk retry run again) finds the first retry instead of running the tool again; to go
again, retry the retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mcp_celery_tasks.errors import InvalidParams, QuotaExceeded
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.tasks.service import RequestContext
from mcp_celery_tasks.tools.registry import get_tool
from mcp_celery_tasks.wire import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    PROTOCOL_VERSION_META_KEY,
    RequestMeta,
)

__all__ = ["RETRYABLE", "Retried", "retry"]

RETRYABLE = frozenset({"failed", "cancelled", "errored"})
"""Display statuses a retry acts on (``stopping`` has not stopped yet)."""
CLIENT_NAME = "mcp-celery-tasks console"
KEY_PREFIX = "console-retry:"


@dataclass(frozen=True, slots=True)
class Retried:
    """What retrying one job did: ``created`` (``job_id`` is the new job), ``already`` (the job
    was retried before: ``job_id`` is that retry), ``quota`` (a quota of the principal refused
    the create) or ``refused`` (``reason`` says why)."""

    outcome: str
    job_id: str | None = None
    reason: str = ""


async def retry(services: Services, row: Mapping[str, object], actor: str) -> Retried:
    """Create the retry of ``row`` (a task's tool, owner, arguments, preflight, protocol version
    and client capabilities) for ``actor``."""
    job_id, tool = str(row["job_id"]), str(row["tool_name"])
    spec = get_tool(tool)
    if spec is None:
        return Retried("refused", reason=f"the tool {tool} is no longer served")
    meta = RequestMeta.model_validate(
        {
            PROTOCOL_VERSION_META_KEY: row["protocol_version"],
            CLIENT_CAPABILITIES_META_KEY: row.get("client_capabilities") or {},
            CLIENT_INFO_META_KEY: {"name": CLIENT_NAME, "retryOf": job_id, "by": actor},
        }
    )
    arguments = row["arguments"]
    preflight = row.get("preflight")
    assert isinstance(arguments, Mapping) and (preflight is None or isinstance(preflight, Mapping))
    try:
        record = await services.tasks.create(
            RequestContext(principal=str(row["owner"]), meta=meta),
            spec,
            arguments,
            as_task=True,
            preflight=preflight,
            idempotency_key=KEY_PREFIX + job_id,
            status_message=f"retry of job {job_id} by {actor}",
        )
    except QuotaExceeded as refused:
        return Retried("quota", reason=str(refused))
    except InvalidParams as refused:  # the key names a task of other arguments (never ours)
        return Retried("refused", reason=str(refused))
    # A new row's created_at is its transaction's now(), which is db_now; a task found by its key
    # was read later (statement_timestamp()).
    fresh = record.created_at == record.db_now
    return Retried("created" if fresh else "already", record.job_id)
