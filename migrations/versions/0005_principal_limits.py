"""Per-principal quota overrides, and an index that makes the active-tasks quota cheap to check.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_principal_limits",
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("max_active_tasks", sa.Integer(), nullable=True),
        sa.Column("creates_per_second", sa.Float(), nullable=True),
        sa.Column("create_burst", sa.Integer(), nullable=True),
        sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
        sa.Column("max_waiting_inputs", sa.Integer(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("principal", name=op.f("pk_mcp_principal_limits")),
    )
    op.create_index(
        "ix_mcp_tasks_owner_active",
        "mcp_tasks",
        ["owner"],
        postgresql_where=sa.text("status IN ('working', 'input_required')"),
    )


def downgrade() -> None:
    op.drop_index("ix_mcp_tasks_owner_active", table_name="mcp_tasks")
    op.drop_table("mcp_principal_limits")
