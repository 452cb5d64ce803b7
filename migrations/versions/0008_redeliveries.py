"""Redeliveries: how many times workers gave a job back (a deploy, a restart, an outage), counted
apart from ``attempts`` (the tool's own failures and crashes), so rolling restarts never use up a
task's attempts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "mcp_tasks", sa.Column("redeliveries", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )


def downgrade() -> None:
    op.drop_column("mcp_tasks", "redeliveries")
