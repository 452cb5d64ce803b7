"""Concurrency limits per tool and per argument value, their admin overrides, an audit of every
limit change, and creates-per-second buckets shared across API replicas.

A task of a tool declared with ``@tool(concurrency=N)`` carries its group and the declared limit:
``concurrency_group`` is ``''`` for a tool-wide limit or the label of its key's value
(``model=moons``), ``concurrency_limit`` is N. The fair release pass (``store.backlog.RELEASE``)
publishes such a job only while fewer than the group's limit are in flight, so a job waiting
for its group holds no slot and no broker message. ``ix_mcp_tasks_concurrency`` counts a group's
jobs in flight; rows of tools without a limit stay out of it (they cost nothing).

``mcp_tool_limits`` holds admin overrides (``tasks limits tool``): one group's limit, or with
``concurrency_group = '*'`` every group of the tool. ``mcp_limit_changes`` records who changed
which limit when, old and new value (principal limits too). ``mcp_principal_buckets`` holds each
principal's creates-per-second token bucket shared by every API replica (taken in the create's
own statement, ``queries.CREATE_TASK``); ``mcp_api_load`` the requests each API replica has in
progress per principal, shared every second (``tasks.shared_load``). Issue 31, items 1 and 4.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('working', 'input_required')"


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("concurrency_group", sa.Text(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("concurrency_limit", sa.Integer(), nullable=True))
    op.create_index(
        "ix_mcp_tasks_concurrency",
        "mcp_tasks",
        ["tool_name", "concurrency_group"],
        postgresql_where=sa.text(
            f"concurrency_limit IS NOT NULL AND dispatched_at IS NOT NULL AND suspended_at IS NULL AND {_ACTIVE}"
        ),
    )
    # The backlog index carries the limit, so the plain release pass (``backlog.RELEASE``) leaves
    # limited jobs out without reading the table; a second index finds the queues that have them.
    op.drop_index("ix_mcp_tasks_backlog", table_name="mcp_tasks")
    op.create_index(
        "ix_mcp_tasks_backlog",
        "mcp_tasks",
        ["queue", "owner", "created_at", "task_id"],
        postgresql_include=["concurrency_limit"],
        postgresql_where=sa.text(f"dispatched_at IS NULL AND retry_at IS NULL AND {_ACTIVE}"),
    )
    op.create_index(
        "ix_mcp_tasks_limited_backlog",
        "mcp_tasks",
        ["queue"],
        postgresql_where=sa.text(
            f"concurrency_limit IS NOT NULL AND dispatched_at IS NULL AND retry_at IS NULL AND {_ACTIVE}"
        ),
    )
    op.create_table(
        "mcp_tool_limits",
        sa.Column("tool_name", sa.Text(), nullable=False),
        sa.Column("concurrency_group", sa.Text(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("updated_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("tool_name", "concurrency_group", name=op.f("pk_mcp_tool_limits")),
        sa.CheckConstraint("concurrency >= 0", name=op.f("ck_mcp_tool_limits_concurrency")),
    )
    op.create_table(
        "mcp_limit_changes",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("field", sa.Text(), nullable=False),
        sa.Column("old_value", sa.Text(), nullable=True),
        sa.Column("new_value", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mcp_limit_changes")),
    )
    op.create_index("ix_mcp_limit_changes_changed_at", "mcp_limit_changes", ["changed_at"])
    op.create_table(
        "mcp_principal_buckets",
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("stamp", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("principal", name=op.f("pk_mcp_principal_buckets")),
    )
    op.create_table(
        "mcp_api_load",
        sa.Column("replica", sa.Text(), nullable=False),
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("in_progress", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("replica", "principal", name=op.f("pk_mcp_api_load")),
    )


def downgrade() -> None:
    op.drop_table("mcp_api_load")
    op.drop_table("mcp_principal_buckets")
    op.drop_index("ix_mcp_limit_changes_changed_at", table_name="mcp_limit_changes")
    op.drop_table("mcp_limit_changes")
    op.drop_table("mcp_tool_limits")
    op.drop_index("ix_mcp_tasks_limited_backlog", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_backlog", table_name="mcp_tasks")
    op.create_index(
        "ix_mcp_tasks_backlog",
        "mcp_tasks",
        ["queue", "owner", "created_at", "task_id"],
        postgresql_where=sa.text(f"dispatched_at IS NULL AND retry_at IS NULL AND {_ACTIVE}"),
    )
    op.drop_index("ix_mcp_tasks_concurrency", table_name="mcp_tasks")
    op.drop_column("mcp_tasks", "concurrency_limit")
    op.drop_column("mcp_tasks", "concurrency_group")
