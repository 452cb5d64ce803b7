"""The SQL of the admins' web console (``mcp_celery_tasks.console``). The overview reuses the
``tasks top`` statements of ``admin_queries``; what is here is the console's own: the keyset
task list, one task by its job id, and the audit of console actions (migration 0023).

The list's WHERE clause is assembled from the fixed fragments below, one per filter in use, never
``%(x)s IS NULL OR …``: under a generic plan (psycopg prepares a statement after five runs) such a
disjunction hides every index. Job ids, never task ids, name tasks here: task ids are bearer-like
and stay out of pages and URLs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, LiteralString

from mcp_celery_tasks.store.queries import ACTIVE_SQL

__all__: list[str] = []

DISPLAY_STATUS: Final[LiteralString] = """
CASE WHEN t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL THEN 'stopping'
     WHEN t.status = 'input_required' AND t.suspended_at IS NOT NULL THEN 'suspended'
     WHEN t.status = 'completed' AND t.error_kind IS NOT NULL THEN 'errored'
     ELSE t.status END"""
"""``mcp_tasks_overview``'s statuses, plus ``errored`` (completed with a tool error, crash or limit)."""

STATUS_FILTERS: Final[dict[str, LiteralString]] = {
    "working": "t.status = 'working'",
    "input_required": "t.status = 'input_required'",  # resident or suspended
    "suspended": "t.status = 'input_required' AND t.suspended_at IS NOT NULL",
    "completed": "t.status = 'completed'",
    "errored": "t.status = 'completed' AND t.error_kind IS NOT NULL",
    "failed": "t.status = 'failed'",
    "cancelled": "t.status = 'cancelled'",
    # ix_mcp_tasks_stopping (0024) holds exactly these rows.
    "stopping": "t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL",
}

FIELD_FILTERS: Final[dict[str, LiteralString]] = {
    "tool": "t.tool_name = %(tool)s",
    "owner": "t.owner = %(owner)s",
    "queue": "t.queue = %(queue)s",
    "since": "t.created_at >= %(since)s",
    "until": "t.created_at < %(until)s",
    # A whole job id is one probe of its unique index; a shorter prefix reads a range of the same
    # index (``text_pattern_ops``, migration 0024) when the planner expects few rows under it.
    "job": "starts_with(t.job_id, %(job)s)",
    "job_exact": "t.job_id = %(job)s",
    # The keyset cursor: rows strictly after the last one shown (ix_mcp_tasks_created_at_job_id).
    "before": "(t.created_at, t.job_id) < (%(before_at)s, %(before_job)s)",
    # The live list's new rows: strictly newer than the newest one the page shows (the same index).
    "after": "(t.created_at, t.job_id) > (%(after_at)s, %(after_job)s)",
    # The list by finish time (ix_mcp_tasks_finished_at_job_id, 0024: finished rows only).
    "finished": "t.finished_at IS NOT NULL",
    "finished_before": "(t.finished_at, t.job_id) < (%(before_at)s, %(before_job)s)",
    "finished_after": "(t.finished_at, t.job_id) > (%(after_at)s, %(after_job)s)",
}

SORT_KEYS: Final[dict[str, LiteralString]] = {"created": "t.created_at", "finished": "t.finished_at"}
"""The list's sorts, each a keyset on (key, job_id) over an index of its own (0023, 0024). No sort
on a column that changes with the status (``last_updated_at``): its index would end HOT updates."""

_LIST_HEAD: Final[LiteralString] = f"""
SELECT t.job_id, {DISPLAY_STATUS} AS status, t.tool_name AS tool, t.owner, t.queue,
       t.status_message, t.created_at, t.started_at, t.finished_at, t.attempts, t.error_kind
FROM mcp_tasks t
WHERE """


def list_statement(
    conditions: Iterable[LiteralString], oldest: bool = False, sort: str = "created"
) -> LiteralString:
    """The task list by ``sort`` (a ``SORT_KEYS`` name), newest (or oldest) first, under
    ``conditions`` (fragments of this module)."""
    where = " AND ".join(["true", *conditions])
    order: LiteralString = "ASC" if oldest else "DESC"
    key = SORT_KEYS[sort]
    return _LIST_HEAD + where + f"\nORDER BY {key} {order}, t.job_id {order}\nLIMIT %(limit)s"


# What a bulk action may act on: cancel, the tasks still active; retry, the finished ones that
# failed, were cancelled (and have stopped) or completed with a tool error (``console.retry``).
ACTIONABLE: Final[dict[str, LiteralString]] = {
    "cancel": "t.status IN ('working', 'input_required')",
    "retry": """(t.status = 'failed'
        OR (t.status = 'cancelled' AND (t.finished_at IS NOT NULL OR t.started_at IS NULL))
        OR (t.status = 'completed' AND t.error_kind IS NOT NULL))""",
}

_BULK_HEAD: Final[LiteralString] = """
SELECT t.task_id, t.job_id, t.owner, t.tool_name, t.arguments, t.preflight, t.protocol_version,
       t.client_capabilities, t.status
FROM mcp_tasks t
WHERE """


def bulk_statement(conditions: Iterable[LiteralString]) -> LiteralString:
    """The rows a bulk action acts on, newest first, as the list orders them."""
    where = " AND ".join(["true", *conditions])
    return _BULK_HEAD + where + "\nORDER BY t.created_at DESC, t.job_id DESC\nLIMIT %(limit)s"


def count_statement(conditions: Iterable[LiteralString]) -> LiteralString:
    """How many rows match, counted up to ``limit`` (a dry run stays bounded at 10 M rows)."""
    where = " AND ".join(["true", *conditions])
    return "SELECT count(*) AS n FROM (SELECT 1 FROM mcp_tasks t WHERE " + where + " LIMIT %(limit)s) AS m"


TASK_BY_JOB: Final[LiteralString] = f"""
SELECT t.task_id, t.job_id, {DISPLAY_STATUS} AS display_status, t.status, t.owner, t.tool_name,
       t.queue, t.arguments, t.preflight, t.status_message, t.result, t.error, t.error_kind,
       t.error_message, t.stop_reason, t.progress, t.progress_total, t.attempts, t.max_attempts,
       t.redeliveries, t.worker, t.lease_until, t.device, t.synchronous, t.suspensions,
       t.created_at, t.dispatched_at, t.started_at, t.suspended_at, t.resumed_at,
       t.cancel_requested_at, t.retry_at, t.finished_at, t.last_updated_at, t.expires_at,
       t.protocol_version, t.client_info, t.client_capabilities, now() AS db_now
FROM mcp_tasks t WHERE t.job_id = %(job_id)s
"""

# The live list: the rows of the jobs one page shows (their unique index), as that page shows them.
ROWS_BY_JOBS: Final[LiteralString] = f"""
SELECT t.task_id, t.job_id, {DISPLAY_STATUS} AS shown, t.status, t.status_message, t.attempts,
       t.started_at, t.finished_at, t.created_at
FROM mcp_tasks t WHERE t.job_id = ANY(%(jobs)s)
"""

ARTIFACTS_OF: Final[LiteralString] = """
SELECT name, mime_type, size, complete, created_at FROM mcp_task_artifacts
WHERE task_id = %(task_id)s ORDER BY created_at, name
"""

# Failures and forced stops per tool, of the last hour and of the last day, in one index-only read
# of the partial ix_mcp_tasks_failures (failed, errored and force-stopped rows only; 0024 added
# the columns counted here). Its cost grows with the day's failures, not with the table.
FAILURES_RECENT: Final[LiteralString] = """
SELECT tool_name AS tool,
       count(*) FILTER (WHERE status = 'failed'
                        AND finished_at >= now() - %(hour_s)s * interval '1 second') AS failed,
       count(*) FILTER (WHERE status = 'completed' AND error_kind IS NOT NULL
                        AND finished_at >= now() - %(hour_s)s * interval '1 second') AS errored,
       count(*) FILTER (WHERE stop_reason IS NOT NULL
                        AND finished_at >= now() - %(hour_s)s * interval '1 second') AS forced_stops,
       count(*) FILTER (WHERE status = 'failed') AS failed_day,
       count(*) FILTER (WHERE status = 'completed' AND error_kind IS NOT NULL) AS errored_day,
       count(*) FILTER (WHERE stop_reason IS NOT NULL) AS forced_stops_day
FROM mcp_tasks
WHERE finished_at >= now() - %(day_s)s * interval '1 second'
  AND (status = 'failed' OR error_kind IS NOT NULL OR stop_reason IS NOT NULL)
GROUP BY tool_name ORDER BY count(*) DESC, tool_name
"""

# Per queue (every tool): what waits, what runs, and how long the oldest job not yet started has
# waited since it was created (a retry waiting for its time is not counted). Active rows only,
# through ix_mcp_tasks_active.
QUEUE_TOTALS: Final[LiteralString] = f"""
SELECT queue,
       count(*) FILTER (WHERE dispatched_at IS NULL) AS backlog,
       count(*) FILTER (WHERE dispatched_at IS NOT NULL AND lease_until IS NULL
                        AND suspended_at IS NULL) AS queued,
       count(*) FILTER (WHERE lease_until IS NOT NULL AND status = 'working') AS running,
       count(*) FILTER (WHERE status = 'input_required' AND suspended_at IS NULL) AS waiting_for_input,
       count(*) FILTER (WHERE suspended_at IS NOT NULL) AS suspended,
       date_trunc('second', now() - min(created_at) FILTER (
           WHERE status = 'working' AND lease_until IS NULL AND retry_at IS NULL)) AS oldest_queued
FROM mcp_tasks
WHERE status IN {ACTIVE_SQL}
GROUP BY queue ORDER BY queue
"""

# Per principal (every queue): active tasks against the principal's limit (its override, else
# the default the caller passes), and the running ones (whose share of the live workers' slots
# ``console_calls`` works out).
PRINCIPAL_SHARES: Final[LiteralString] = f"""
SELECT t.owner, count(*) AS active,
       count(*) FILTER (WHERE t.lease_until IS NOT NULL AND t.status = 'working') AS running,
       COALESCE(l.max_active_tasks, %(default_limit)s) AS max_active,
       l.max_active_tasks IS NOT NULL AS overridden
FROM mcp_tasks t LEFT JOIN mcp_principal_limits l ON l.principal = t.owner
WHERE t.status IN {ACTIVE_SQL}
GROUP BY t.owner, l.max_active_tasks
ORDER BY running DESC, active DESC, t.owner
LIMIT %(limit)s
"""

RECORD_ACTION: Final[LiteralString] = """
INSERT INTO mcp_console_actions (actor, action, target, affected, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(affected)s, %(detail)s)
RETURNING id
"""

ACTIONS: Final[LiteralString] = """
SELECT id, acted_at, actor, action, target, affected, detail FROM mcp_console_actions
ORDER BY id DESC LIMIT %(limit)s
"""
