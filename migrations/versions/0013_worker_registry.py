"""Elastic pools: the workers the system knows, and the demand per queue an autoscaler reads.

``mcp_workers`` holds one row per running worker process (and per beat, recorded by the
maintenance worker from the jobs beat sends): its node name, host and pids, the queues it
consumes, its slots (pool concurrency), its devices (null until GPU assignment fills them), the
package version, when it started and when its last heartbeat came. A row is live while
``expires_at`` (the last heartbeat plus the worker's own timeout) is in the future, so readers need
no setting to tell the dead from the live; a clean shutdown deletes its row, the collector the
long-dead ones.

``mcp_queue_demand`` is one row per queue: the active tasks split into backlog (not yet
published), published but not started, running, waiting for input in a slot (resident) and
suspended (no slot), the oldest queued task's age, the live workers' slots, and
``demand_slots``: the work that wants a slot now (every active task but the suspended ones). It
reads the active rows only (the partial index), so it costs the same at 10 M finished rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_DEMAND = """
CREATE VIEW mcp_queue_demand AS
WITH work AS (
    SELECT queue,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NULL) AS backlog,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NOT NULL
                              AND status = 'working' AND lease_until IS NULL) AS published,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NOT NULL
                              AND status = 'working' AND lease_until IS NOT NULL) AS running,
           count(*) FILTER (WHERE suspended_at IS NULL AND dispatched_at IS NOT NULL
                              AND status = 'input_required') AS waiting_resident,
           count(*) FILTER (WHERE suspended_at IS NOT NULL) AS waiting_suspended,
           min(COALESCE(resumed_at, created_at)) FILTER (
               WHERE suspended_at IS NULL
                 AND (dispatched_at IS NULL OR (status = 'working' AND lease_until IS NULL))
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
    op.create_table(
        "mcp_workers",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), server_default=sa.text("'worker'"), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pids", postgresql.ARRAY(sa.Integer()), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("slots", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("devices", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("version", sa.Text(), nullable=True),
        sa.Column("pool", sa.Text(), nullable=True),
        sa.Column("instance", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('worker', 'beat')", name="ck_mcp_workers_kind"),
        sa.PrimaryKeyConstraint("node", name="pk_mcp_workers"),
    )
    op.execute(_DEMAND)


def downgrade() -> None:
    op.execute("DROP VIEW mcp_queue_demand")
    op.drop_table("mcp_workers")
