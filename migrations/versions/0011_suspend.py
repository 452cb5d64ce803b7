"""Suspend: a job waiting for input gives its worker slot back.

``suspended_at`` is set while a task waits for input with no process behind it (the lease
released, the Celery message acknowledged); ``suspensions`` counts how often that happened and
``resumed_at`` is when the answer that woke it was recorded (the resume latency starts there).
Suspended rows leave the in-flight index: the fair publisher's pass never reads them, so a pool
with thousands of suspended tasks releases jobs as fast as an empty one.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('working', 'input_required')"

# The overview of 0007 with ``suspended`` as a status of its own (an input_required task with no
# process behind it) and the suspend columns appended (a view's columns can only grow at the end).
_OVERVIEW_0007 = """
CREATE OR REPLACE VIEW mcp_tasks_overview AS
SELECT
    t.task_id,
    t.job_id,
    CASE
        WHEN t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL
            THEN 'stopping'%s
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
    t.stop_reason%s
FROM mcp_tasks t
"""
_OVERVIEW = _OVERVIEW_0007 % (
    """
        WHEN t.status = 'input_required' AND t.suspended_at IS NOT NULL THEN 'suspended'""",
    """,
    t.suspended_at,
    t.suspensions""",
)


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("mcp_tasks", sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "mcp_tasks", sa.Column("suspensions", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.drop_index("ix_mcp_tasks_inflight", table_name="mcp_tasks")
    op.create_index(
        "ix_mcp_tasks_inflight",
        "mcp_tasks",
        ["queue", "owner"],
        postgresql_where=sa.text(f"dispatched_at IS NOT NULL AND suspended_at IS NULL AND {_ACTIVE}"),
    )
    op.create_index(
        "ix_mcp_tasks_suspended",
        "mcp_tasks",
        ["owner"],
        postgresql_where=sa.text(f"suspended_at IS NOT NULL AND {_ACTIVE}"),
    )
    op.execute(_OVERVIEW)


def downgrade() -> None:
    op.execute("DROP VIEW mcp_tasks_overview")
    op.execute((_OVERVIEW_0007 % ("", "")).replace("CREATE OR REPLACE VIEW", "CREATE VIEW"))
    op.drop_index("ix_mcp_tasks_suspended", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_inflight", table_name="mcp_tasks")
    op.create_index(
        "ix_mcp_tasks_inflight",
        "mcp_tasks",
        ["queue", "owner"],
        postgresql_where=sa.text(f"dispatched_at IS NOT NULL AND {_ACTIVE}"),
    )
    op.drop_column("mcp_tasks", "suspensions")
    op.drop_column("mcp_tasks", "resumed_at")
    op.drop_column("mcp_tasks", "suspended_at")
