"""Retry policies: a retry waits for its time outside the fair backlog.

``retry_at`` is a retry's "not before" time: a job whose tool raised a retryable error (or called
``ctx.retry_later``) goes back to the backlog's rows (``dispatched_at IS NULL``) with it set, and
the release pass clears it once due. The backlog index leaves such rows out, so a release pass
still costs the principals with a backlog, never the retries waiting; ``ix_mcp_tasks_retry_wait``
finds the due ones. ``mcp_queue_demand`` no longer counts a waiting retry as backlog (it wants
no slot before its time). Issue 31, item 2.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('working', 'input_required')"

# ``mcp_queue_demand`` as 0013 made it; the placeholders leave waiting retries out (0019).
_DEMAND = """
CREATE OR REPLACE VIEW mcp_queue_demand AS
WITH work AS (
    SELECT queue,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NULL%(ready)s) AS backlog,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NOT NULL
                              AND status = 'working' AND lease_until IS NULL) AS published,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NOT NULL
                              AND status = 'working' AND lease_until IS NOT NULL) AS running,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NOT NULL
                              AND status = 'input_required') AS waiting_resident,
           count(*) FILTER (WHERE suspended_at IS NOT NULL) AS waiting_suspended,
           min(COALESCE(resumed_at, created_at)) FILTER (
               WHERE suspended_at IS NULL
                 AND ((dispatched_at IS NULL%(ready)s) OR (status = 'working' AND lease_until IS NULL))
           ) AS oldest_queued_at
    FROM mcp_tasks
    WHERE status IN ('working', 'input_required')
    GROUP BY queue
), pool AS (
    SELECT q.queue, sum(w.slots) AS slots, count(*) AS workers
    FROM mcp_workers w CROSS JOIN LATERAL unnest(w.queues) AS q(queue)
    WHERE w.kind = 'worker' AND w.expires_at > now()
    GROUP BY q.queue
)
SELECT COALESCE(work.queue, pool.queue) AS queue,
       (COALESCE(work.backlog, 0) + COALESCE(work.published, 0) + COALESCE(work.running, 0)
        + COALESCE(work.waiting_resident, 0))::bigint AS demand_slots,
       COALESCE(work.backlog, 0)::bigint AS backlog,
       COALESCE(work.published, 0)::bigint AS published,
       COALESCE(work.running, 0)::bigint AS running,
       COALESCE(work.waiting_resident, 0)::bigint AS waiting_resident,
       COALESCE(work.waiting_suspended, 0)::bigint AS waiting_suspended,
       COALESCE(EXTRACT(EPOCH FROM now() - work.oldest_queued_at), 0)::float AS oldest_queued_s,
       COALESCE(pool.slots, 0)::bigint AS worker_slots,
       GREATEST(COALESCE(pool.slots, 0) - COALESCE(work.running, 0)
                - COALESCE(work.waiting_resident, 0), 0)::bigint AS slots_available,
       COALESCE(pool.workers, 0)::bigint AS workers
FROM work FULL JOIN pool ON pool.queue = work.queue
"""


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_index("ix_mcp_tasks_backlog", table_name="mcp_tasks")
    op.create_index(
        "ix_mcp_tasks_backlog",
        "mcp_tasks",
        ["queue", "owner", "created_at", "task_id"],
        postgresql_where=sa.text(f"dispatched_at IS NULL AND retry_at IS NULL AND {_ACTIVE}"),
    )
    op.create_index(
        "ix_mcp_tasks_retry_wait",
        "mcp_tasks",
        ["retry_at"],
        postgresql_where=sa.text(f"retry_at IS NOT NULL AND dispatched_at IS NULL AND {_ACTIVE}"),
    )
    op.execute(_DEMAND % {"ready": " AND retry_at IS NULL"})


def downgrade() -> None:
    op.execute(_DEMAND % {"ready": ""})
    op.drop_index("ix_mcp_tasks_retry_wait", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_backlog", table_name="mcp_tasks")
    op.create_index(
        "ix_mcp_tasks_backlog",
        "mcp_tasks",
        ["queue", "owner", "created_at", "task_id"],
        postgresql_where=sa.text(f"dispatched_at IS NULL AND {_ACTIVE}"),
    )
    op.drop_column("mcp_tasks", "retry_at")
