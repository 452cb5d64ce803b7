"""2025-11-25 sessions expire: when last used (idle) and when created (absolute); the GC collects
them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "mcp_sessions",
        sa.Column("last_used_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )
    op.create_index("ix_mcp_sessions_owner", "mcp_sessions", ["owner"])
    op.create_index("ix_mcp_sessions_last_used_at", "mcp_sessions", ["last_used_at"])


def downgrade() -> None:
    op.drop_index("ix_mcp_sessions_last_used_at", table_name="mcp_sessions")
    op.drop_index("ix_mcp_sessions_owner", table_name="mcp_sessions")
    op.drop_column("mcp_sessions", "last_used_at")
