"""The admins' views name the GPU: a workers overview, and the device in the tasks overview.

``mcp_workers_overview`` is one row per live worker (and live beat) of the registry (0013): its
queues, slots, devices, pool and version, how long ago its last heartbeat came, and the jobs its
processes run now (each with its tool, status, queue, device and start), counted against its
slots. It answers "which device does each worker have, and what is on it" in SQL, for a
dashboard or ``psql`` (``tasks workers`` shows the same, dead rows too). Dead rows are left out:
a row is live while ``expires_at`` is ahead, the registry's own rule.

``mcp_tasks_overview`` gains ``device`` (0014's column: the GPU of a task's latest run), appended
at the end because a view's columns can only grow there.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# The jobs a worker runs now are the active rows whose ``worker`` identity (``host:pid:nonce``)
# is one of its processes on its host: one pass over the claimed active rows, hashed against the
# live workers' (host, pid) pairs (materialized, else the planner re-reads them once per worker).
_WORKERS = """
CREATE VIEW mcp_workers_overview AS
WITH live AS MATERIALIZED (
    SELECT * FROM mcp_workers WHERE expires_at > now()
), procs AS MATERIALIZED (
    SELECT w.node, w.hostname, p.pid::text AS pid
    FROM live w CROSS JOIN LATERAL unnest(w.pids || w.pid) AS p(pid)
    WHERE w.kind = 'worker'
), claimed AS MATERIALIZED (
    SELECT split_part(t.worker, ':', 1) AS hostname, split_part(t.worker, ':', 2) AS pid,
           jsonb_build_object('job_id', t.job_id, 'tool', t.tool_name, 'status', t.status,
                              'queue', t.queue, 'device', t.device, 'since', t.started_at) AS job,
           t.started_at
    FROM mcp_tasks t
    WHERE t.status IN ('working', 'input_required') AND t.worker IS NOT NULL
), jobs AS (
    SELECT procs.node, count(*) AS running,
           jsonb_agg(claimed.job ORDER BY claimed.started_at) AS jobs
    FROM claimed JOIN procs USING (hostname, pid)
    GROUP BY procs.node
)
SELECT w.node,
       w.kind,
       w.hostname,
       w.pid,
       w.queues,
       w.slots,
       w.devices,
       w.pool,
       w.version,
       w.started_at,
       w.heartbeat_at,
       now() - w.heartbeat_at AS heartbeat_age,
       w.expires_at,
       COALESCE(jobs.running, 0)::bigint AS running,
       GREATEST(w.slots - COALESCE(jobs.running, 0), 0)::bigint AS free_slots,
       COALESCE(jobs.jobs, '[]'::jsonb) AS jobs
FROM live w LEFT JOIN jobs ON jobs.node = w.node
"""

# 0011's overview, frozen here: the downgrade puts it back as it was.
_TASKS_0011 = """
CREATE VIEW mcp_tasks_overview AS
SELECT
    t.task_id,
    t.job_id,
    CASE
        WHEN t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL
            THEN 'stopping'
        WHEN t.status = 'input_required' AND t.suspended_at IS NOT NULL THEN 'suspended'
        ELSE t.status
    END AS status,
    t.tool_name AS tool,
    t.owner,
    t.queue,
    t.status_message,
    t.created_at,
    now() - t.created_at AS age,
    COALESCE(t.finished_at, CASE WHEN t.status IN ('working', 'input_required') THEN now() END)
        - t.started_at AS runtime,
    t.started_at - t.created_at AS wait_before_start,
    t.attempts,
    t.max_attempts,
    t.worker,
    t.lease_until,
    (SELECT count(*) FROM mcp_task_inputs i
      WHERE i.task_id = t.task_id AND i.response IS NULL AND NOT i.superseded) AS outstanding_inputs,
    COALESCE(t.error_message, t.error ->> 'message') AS last_error,
    t.expires_at,
    t.error_kind,
    t.stop_reason,
    t.suspended_at,
    t.suspensions%s
FROM mcp_tasks t
"""
_TASKS = (_TASKS_0011 % ",\n    t.device").replace("CREATE VIEW", "CREATE OR REPLACE VIEW")


def upgrade() -> None:
    op.execute(_TASKS)
    op.execute(_WORKERS)


def downgrade() -> None:
    op.execute("DROP VIEW mcp_workers_overview")
    op.execute("DROP VIEW mcp_tasks_overview")
    op.execute(_TASKS_0011 % "")
