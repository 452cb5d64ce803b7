"""Spent MRTR request states: a sealed ``requestState`` is usable once across API replicas.

The round that advances with a state inserts the digest of its sealed nonce; a replay sent to
any replica finds the row and is refused (-32602). The collector deletes rows whose state has
expired (issue 33).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_spent_request_states",
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("spent_by", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_mcp_spent_request_states")),
    )
    op.create_index("ix_mcp_spent_request_states_expires_at", "mcp_spent_request_states", ["expires_at"])


def downgrade() -> None:
    op.drop_table("mcp_spent_request_states")
