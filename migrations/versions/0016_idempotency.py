"""Idempotent calls: a ``tools/call``'s idempotency key and the digest of what it asked.

``idempotency_key`` is the client's key (``_meta`` ``io.github.mcp-celery-tasks/idempotencyKey``),
unique per owner while the row lives: the create inserts with ``ON CONFLICT (owner,
idempotency_key) DO NOTHING`` and reads the row that won, so concurrent retries make one task.
``request_digest`` (SHA-256 of the tool name and canonical arguments) tells a retry from a reuse
of the key for another call (-32602). The index is partial: calls without a key cost nothing.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("idempotency_key", sa.Text(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("request_digest", sa.Text(), nullable=True))
    op.create_index(
        "ix_mcp_tasks_idempotency",
        "mcp_tasks",
        ["owner", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_mcp_tasks_idempotency", table_name="mcp_tasks")
    op.drop_column("mcp_tasks", "request_digest")
    op.drop_column("mcp_tasks", "idempotency_key")
