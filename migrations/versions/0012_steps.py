"""Durable steps and checkpoints: a re-run resumes where the work stopped.

``mcp_task_steps`` holds each ``ctx.step`` result by its position in the run and its name, as
``json`` (the text as written, not ``jsonb``: a replay must decode to exactly what the first run
returned, ``1e+20`` a float and object keys in their order);
``mcp_task_checkpoints`` the latest checkpoint of each name (size, digest, where its bytes are),
and ``mcp_task_checkpoint_chunks`` the bytes of those kept in Postgres, in 1 MiB chunks of one
generation each (a save writes a new generation, then flips the checkpoint row to it, in one
transaction). Every row goes with its task (``ON DELETE CASCADE``). The chunks are stored
uncompressed (``STORAGE EXTERNAL``): checkpoints are mostly compressed or float data already.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _task_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["task_id"], ["mcp_tasks.task_id"], name=f"fk_{table}_task_id_mcp_tasks", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "mcp_task_steps",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("result", postgresql.JSON(astext_type=sa.Text()), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        _task_fk("mcp_task_steps"),
        sa.PrimaryKeyConstraint("task_id", "seq", name="pk_mcp_task_steps"),
        sa.UniqueConstraint("task_id", "name", name="uq_mcp_task_steps_task_id_name"),
    )
    op.create_table(
        "mcp_task_checkpoints",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("generation", sa.Text(), nullable=False),
        sa.Column("storage", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("saved_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("storage IN ('postgres', 'directory')", name="ck_mcp_task_checkpoints_storage"),
        _task_fk("mcp_task_checkpoints"),
        sa.PrimaryKeyConstraint("task_id", "name", name="pk_mcp_task_checkpoints"),
    )
    op.create_table(
        "mcp_task_checkpoint_chunks",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("generation", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        _task_fk("mcp_task_checkpoint_chunks"),
        sa.PrimaryKeyConstraint("task_id", "name", "generation", "seq", name="pk_mcp_task_checkpoint_chunks"),
    )
    op.execute("ALTER TABLE mcp_task_checkpoint_chunks ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("mcp_task_checkpoint_chunks")
    op.drop_table("mcp_task_checkpoints")
    op.drop_table("mcp_task_steps")
