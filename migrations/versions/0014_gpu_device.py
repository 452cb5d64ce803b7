"""GPU pools: the device a task's job runs on.

``device`` is set by each claim to the GPU the claiming pool child is pinned to (``worker
--gpus``: the id as the worker names it, e.g. ``2`` or ``GPU-8f3c…``), and to NULL when the job
runs on a worker without GPUs: it names the device of the latest run (issue 29).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("device", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("mcp_tasks", "device")
