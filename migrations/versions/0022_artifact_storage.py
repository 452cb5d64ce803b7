"""Artifacts: where the bytes are (``storage``: postgres or directory) and an index to sum a
principal's stored bytes (the storage quota, ``artifact_quota_bytes``). Issue 32, items 1-3.

``size`` of an incomplete artifact now grows as its chunks are written, so an upload in progress
counts against its principal's quota while it streams.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "mcp_task_artifacts",
        sa.Column("storage", sa.Text(), nullable=False, server_default=sa.text("'postgres'")),
    )
    op.create_check_constraint(
        op.f("ck_mcp_task_artifacts_storage"), "mcp_task_artifacts", "storage IN ('postgres', 'directory')"
    )
    op.create_index(
        "ix_mcp_task_artifacts_owner_size", "mcp_task_artifacts", ["owner"], postgresql_include=["size"]
    )


def downgrade() -> None:
    op.drop_index("ix_mcp_task_artifacts_owner_size", table_name="mcp_task_artifacts")
    op.drop_constraint(op.f("ck_mcp_task_artifacts_storage"), "mcp_task_artifacts", type_="check")
    op.drop_column("mcp_task_artifacts", "storage")
