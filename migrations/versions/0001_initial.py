"""Task rows, input rows and the admin view.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

OVERVIEW_VIEW = """
CREATE VIEW mcp_tasks_overview AS
SELECT
    t.task_id,
    t.job_id,
    CASE
        WHEN t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL
            THEN 'stopping'
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
    t.error ->> 'message' AS last_error,
    t.expires_at
FROM mcp_tasks t
"""


def upgrade() -> None:
    op.create_table(
        "mcp_tasks",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("tool_name", sa.Text(), nullable=False),
        sa.Column("arguments", postgresql.JSONB(), nullable=False),
        sa.Column("preflight", postgresql.JSONB(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("result", postgresql.JSONB(), nullable=True),
        sa.Column("error", postgresql.JSONB(), nullable=True),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("last_updated_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("ttl_ms", sa.BigInteger(), nullable=True),
        sa.Column("retention_ms", sa.BigInteger(), nullable=False),
        sa.Column("poll_interval_ms", sa.Integer(), nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("cancel_requested_at", TS, nullable=True),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("dispatched_at", TS, nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("lease_until", TS, nullable=True),
        sa.Column("inbox", sa.Text(), nullable=True),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("protocol_version", sa.Text(), nullable=False),
        sa.Column("client_capabilities", postgresql.JSONB(), nullable=False),
        sa.Column("client_info", postgresql.JSONB(), nullable=True),
        sa.CheckConstraint(
            "status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')",
            name=op.f("ck_mcp_tasks_status"),
        ),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_mcp_tasks")),
        sa.UniqueConstraint("job_id", name=op.f("uq_mcp_tasks_job_id")),
    )
    op.create_index("ix_mcp_tasks_expires_at", "mcp_tasks", ["expires_at"])
    op.create_index("ix_mcp_tasks_owner_created_at", "mcp_tasks", ["owner", "created_at"])
    op.create_index(
        "ix_mcp_tasks_active",
        "mcp_tasks",
        ["status", "lease_until"],
        postgresql_where=sa.text("status IN ('working', 'input_required')"),
    )
    op.create_index(
        "ix_mcp_tasks_undispatched",
        "mcp_tasks",
        ["created_at"],
        postgresql_where=sa.text("dispatched_at IS NULL"),
    )
    op.create_table(
        "mcp_task_inputs",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("params", postgresql.JSONB(), nullable=True),
        sa.Column("params_hash", sa.Text(), nullable=False),
        sa.Column("response", postgresql.JSONB(), nullable=True),
        sa.Column("superseded", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("requested_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("answered_at", TS, nullable=True),
        sa.CheckConstraint(
            "method IN ('elicitation/create', 'sampling/createMessage', 'roots/list')",
            name=op.f("ck_mcp_task_inputs_method"),
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["mcp_tasks.task_id"],
            name=op.f("fk_mcp_task_inputs_task_id_mcp_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "key", name=op.f("pk_mcp_task_inputs")),
    )
    op.execute(OVERVIEW_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS mcp_tasks_overview")
    op.drop_table("mcp_task_inputs")
    op.drop_index("ix_mcp_tasks_undispatched", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_active", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_owner_created_at", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_expires_at", table_name="mcp_tasks")
    op.drop_table("mcp_tasks")
