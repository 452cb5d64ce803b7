"""Artifacts: files a job publishes with ``ctx.artifact``, read with ``resources/read``.

``mcp_task_artifacts`` holds one row per artifact (its task, the task's principal copied as
``owner``, name, mime type; size, sha256 and chunk count once ``complete``), and
``mcp_task_artifact_chunks`` its bytes, 1 MiB a row. Both go with their task (``ON DELETE
CASCADE``); the collector sweeps incomplete artifacts of terminal tasks. Issue 32, items 1-3.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_task_artifacts",
        sa.Column("artifact_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("mime_type", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("sha256", sa.Text(), nullable=True),
        sa.Column("chunks", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("complete", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["mcp_tasks.task_id"],
            name=op.f("fk_mcp_task_artifacts_task_id_mcp_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("artifact_id", name=op.f("pk_mcp_task_artifacts")),
    )
    op.create_index("ix_mcp_task_artifacts_owner_created_at", "mcp_task_artifacts", ["owner", "created_at"])
    op.create_index("ix_mcp_task_artifacts_task_id", "mcp_task_artifacts", ["task_id"])
    op.create_index(
        "ix_mcp_task_artifacts_incomplete",
        "mcp_task_artifacts",
        ["created_at"],
        postgresql_where=sa.text("NOT complete"),
    )
    op.create_table(
        "mcp_task_artifact_chunks",
        sa.Column("artifact_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["mcp_task_artifacts.artifact_id"],
            name=op.f("fk_mcp_task_artifact_chunks_artifact_id_mcp_task_artifacts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("artifact_id", "seq", name=op.f("pk_mcp_task_artifact_chunks")),
    )


def downgrade() -> None:
    op.drop_table("mcp_task_artifact_chunks")
    op.drop_index("ix_mcp_task_artifacts_incomplete", table_name="mcp_task_artifacts")
    op.drop_index("ix_mcp_task_artifacts_task_id", table_name="mcp_task_artifacts")
    op.drop_index("ix_mcp_task_artifacts_owner_created_at", table_name="mcp_task_artifacts")
    op.drop_table("mcp_task_artifacts")
