"""Sessions of 2025-11-25 clients (initialize handshake), shared by every API replica.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_sessions",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("protocol_version", sa.Text(), nullable=False),
        sa.Column("client_capabilities", postgresql.JSONB(), nullable=False),
        sa.Column("client_info", postgresql.JSONB(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_mcp_sessions")),
    )


def downgrade() -> None:
    op.drop_table("mcp_sessions")
