"""A task remembers the 2025-11-25 session that created it: SEP-1686 tasks/list shows a session
its own tasks only (with auth off every client is ``anon``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("session_id", sa.Text(), nullable=True))
    op.create_index(
        "ix_mcp_tasks_session_created_at",
        "mcp_tasks",
        ["session_id", "created_at"],
        postgresql_where=sa.text("session_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_mcp_tasks_session_created_at", table_name="mcp_tasks")
    op.drop_column("mcp_tasks", "session_id")
