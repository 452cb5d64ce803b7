"""Which rows back a synchronous call: ``ctx.is_task`` tells a tool whether a client holds a
task handle for its run (False: a plain ``tools/call`` waits for the result).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: Postgres adds the column without rewriting the table.
    op.add_column(
        "mcp_tasks", sa.Column("synchronous", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )


def downgrade() -> None:
    op.drop_column("mcp_tasks", "synchronous")
