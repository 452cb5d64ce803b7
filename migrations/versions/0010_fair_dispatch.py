"""Fair dispatch: the indexes the fair publisher reads on every pass.

The backlog (active rows not yet published) is scanned per queue and per principal, oldest
first; the in-flight set (published, not finished) is counted per queue and principal.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_mcp_tasks_backlog",
        "mcp_tasks",
        ["queue", "owner", "created_at", "task_id"],
        postgresql_where=sa.text("dispatched_at IS NULL AND status IN ('working', 'input_required')"),
    )
    op.create_index(
        "ix_mcp_tasks_inflight",
        "mcp_tasks",
        ["queue", "owner"],
        postgresql_where=sa.text("dispatched_at IS NOT NULL AND status IN ('working', 'input_required')"),
    )


def downgrade() -> None:
    op.drop_index("ix_mcp_tasks_inflight", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_backlog", table_name="mcp_tasks")
