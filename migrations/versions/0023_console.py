"""The admins' web console: the audit of its actions, and two indexes for its pages.

``mcp_console_actions`` records each console action (who, when, what, on which target, how many
rows it changed; ``detail`` holds what else the action was given, e.g. a cancel's reason). The
task list pages newest first with a keyset cursor on (created_at, job_id): without
``ix_mcp_tasks_created_at_job_id`` its first page sorts the whole table; with it, any page reads
its own rows. ``ix_mcp_tasks_failures`` holds only failed, errored and force-stopped rows, so the
overview's "failures of the last hour" reads those alone. Issue 35 (first slice).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

FAILURES = "status = 'failed' OR error_kind IS NOT NULL OR stop_reason IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        "mcp_console_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("acted_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("affected", sa.Integer(), nullable=False),
        sa.Column("detail", sa.dialects.postgresql.JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mcp_console_actions")),
    )
    op.create_index("ix_mcp_tasks_created_at_job_id", "mcp_tasks", ["created_at", "job_id"])
    op.create_index(
        "ix_mcp_tasks_failures", "mcp_tasks", ["finished_at"], postgresql_where=sa.text(FAILURES)
    )


def downgrade() -> None:
    op.drop_index("ix_mcp_tasks_failures", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_created_at_job_id", table_name="mcp_tasks")
    op.drop_table("mcp_console_actions")
