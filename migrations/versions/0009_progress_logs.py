"""Progress and logs of synchronous calls: a task's numeric progress (``notifications/progress``),
the log level its synchronous caller asked for, the log messages its job sent at that level or
above (``notifications/message``), and a 2025-11-25 session's ``logging/setLevel``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("progress", sa.Float(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("progress_total", sa.Float(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("log_level", sa.Text(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("log_seq", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("mcp_sessions", sa.Column("log_level", sa.Text(), nullable=True))
    op.create_table(
        "mcp_task_logs",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("level", sa.Text(), nullable=False),
        sa.Column("logger", sa.Text(), nullable=True),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["mcp_tasks.task_id"],
            name="fk_mcp_task_logs_task_id_mcp_tasks",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "seq", name="pk_mcp_task_logs"),
    )


def downgrade() -> None:
    op.drop_table("mcp_task_logs")
    op.drop_column("mcp_sessions", "log_level")
    op.drop_column("mcp_tasks", "log_seq")
    op.drop_column("mcp_tasks", "log_level")
    op.drop_column("mcp_tasks", "progress_total")
    op.drop_column("mcp_tasks", "progress")
