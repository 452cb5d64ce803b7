"""The SQL of the admin commands (``tasks ls|show|purge|top|limits``) and of the per-principal
quota overrides; the statements the API and workers run are in ``queries``."""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.store.queries import ACTIVE_SQL, TERMINAL_SQL

__all__: list[str] = []

# A job still in the fair backlog says so (its place in line: ``tasks show``); a retry waiting for
# its time says when (its own status message).
ADMIN_LIST: Final[LiteralString] = """
SELECT o.task_id, o.job_id, o.status, o.tool, o.owner, o.queue,
       CASE WHEN o.status = 'working' AND t.retry_at IS NOT NULL THEN t.status_message
            WHEN o.status = 'working' AND t.dispatched_at IS NULL THEN 'queued (fair backlog)'
            ELSE o.status_message END AS status_message,
       o.created_at, o.age, o.runtime, o.attempts, o.outstanding_inputs, o.last_error, o.error_kind,
       o.device
FROM mcp_tasks_overview o JOIN mcp_tasks t USING (task_id)
-- 'errored' (admins only): completed with isError, a tool error, crash or limit (error_kind);
-- 'input_required' is every task waiting for input, resident or suspended.
WHERE (%(status)s::text IS NULL OR o.status = %(status)s
       OR (%(status)s = 'input_required' AND o.status = 'suspended')
       OR (%(status)s = 'errored' AND o.status = 'completed' AND o.error_kind IS NOT NULL))
  AND (%(tool)s::text IS NULL OR o.tool = %(tool)s)
  AND (%(owner)s::text IS NULL OR o.owner = %(owner)s)
  AND (%(older_than_s)s::float IS NULL OR o.created_at < now() - %(older_than_s)s * interval '1 second')
  AND (%(newer_than_s)s::float IS NULL OR o.created_at >= now() - %(newer_than_s)s * interval '1 second')
ORDER BY o.created_at DESC
LIMIT %(limit)s
"""


# A task id, a job id, or a unique prefix of either (6+ characters) for ``tasks show|cancel``:
# exact matches first (primary key and unique index); a prefix scans, which an admin can afford.
ADMIN_MATCH: Final[LiteralString] = """
SELECT task_id, job_id, tool_name AS tool, status, created_at,
       (task_id = %(ref)s OR job_id = %(ref)s) AS exact
FROM mcp_tasks
WHERE task_id = %(ref)s OR job_id = %(ref)s
   OR (length(%(ref)s) >= 6 AND (starts_with(task_id, %(ref)s) OR starts_with(job_id, %(ref)s)))
ORDER BY exact DESC, created_at DESC
LIMIT %(limit)s
"""


ADMIN_SHOW: Final[LiteralString] = """
SELECT t.*, o.status AS display_status, o.runtime, o.wait_before_start
FROM mcp_tasks t JOIN mcp_tasks_overview o USING (task_id)
WHERE t.task_id = %(ref)s OR t.job_id = %(ref)s
"""


ADMIN_INPUTS: Final[LiteralString] = """
SELECT key, method, params, response, superseded, requested_at, answered_at
FROM mcp_task_inputs WHERE task_id = %(task_id)s ORDER BY requested_at, key
"""


# Purge terminal rows now (ahead of their expiry); active rows are never purged.
ADMIN_PURGE: Final[LiteralString] = f"""
DELETE FROM mcp_tasks
WHERE status IN {TERMINAL_SQL}
  AND (lease_until IS NULL OR lease_until < now())
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(tool)s::text IS NULL OR tool_name = %(tool)s)
  AND (%(owner)s::text IS NULL OR owner = %(owner)s)
  AND created_at < now() - %(older_than_s)s * interval '1 second'
"""


# queued: handed to the broker, not started; backlog: waiting in Postgres for its fair turn.
ADMIN_SUMMARY: Final[LiteralString] = """
SELECT o.queue, o.tool,
       count(*) FILTER (WHERE o.status = 'working' AND o.runtime IS NOT NULL) AS running,
       count(*) FILTER (WHERE o.status = 'working' AND o.runtime IS NULL
                        AND t.dispatched_at IS NOT NULL) AS queued,
       count(*) FILTER (WHERE o.status = 'working' AND t.dispatched_at IS NULL) AS backlog,
       count(*) FILTER (WHERE o.status = 'input_required') AS waiting_for_input,
       count(*) FILTER (WHERE o.status = 'suspended') AS suspended,
       count(*) FILTER (WHERE o.status = 'stopping') AS stopping,
       max(o.runtime) FILTER (WHERE o.status IN ('working', 'input_required')) AS longest
FROM mcp_tasks_overview o JOIN mcp_tasks t USING (task_id)
WHERE o.status IN ('working', 'input_required', 'suspended', 'stopping')
  -- The same rows, said on the table so that its partial indexes find them (ix_mcp_tasks_active,
  -- ix_mcp_tasks_stopping): the view's status is an expression no index holds.
  AND (t.status IN ('working', 'input_required')
       OR (t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL))
GROUP BY o.queue, o.tool ORDER BY o.queue, o.tool
"""


# Fair dispatch per queue and principal: who waits, who holds the workers.
ADMIN_PRINCIPALS: Final[LiteralString] = f"""
SELECT queue, owner,
       count(*) FILTER (WHERE dispatched_at IS NULL) AS backlog,
       count(*) FILTER (WHERE dispatched_at IS NOT NULL AND lease_until IS NULL
                        AND suspended_at IS NULL) AS queued,
       count(*) FILTER (WHERE lease_until IS NOT NULL AND status = 'working') AS running,
       count(*) FILTER (WHERE status = 'input_required' AND suspended_at IS NULL) AS waiting_for_input,
       count(*) FILTER (WHERE suspended_at IS NOT NULL) AS suspended,
       date_trunc('second', now() - min(created_at) FILTER (WHERE dispatched_at IS NULL)) AS oldest_waiting
FROM mcp_tasks
WHERE status IN {ACTIVE_SQL}
GROUP BY queue, owner
ORDER BY queue, count(*) FILTER (WHERE dispatched_at IS NULL) DESC, owner
LIMIT %(limit)s
"""


ADMIN_RECENT_FAILURES: Final[LiteralString] = """
SELECT job_id, tool, created_at, last_error, error_kind FROM mcp_tasks_overview
WHERE status = 'failed' OR (status = 'completed' AND last_error IS NOT NULL)
ORDER BY created_at DESC LIMIT %(limit)s
"""


PRINCIPAL_LIMITS: Final[LiteralString] = """
SELECT principal, max_active_tasks, creates_per_second, create_burst, max_concurrent_requests,
       max_waiting_inputs, note, updated_at
FROM mcp_principal_limits ORDER BY principal
"""
