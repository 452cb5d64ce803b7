"""The console's job-id prefix search, its "finished" sort, its "stopping" filter and its
overview's failure counts, each index built without blocking writes.

``ix_mcp_tasks_job_id`` replaces the unique constraint ``uq_mcp_tasks_job_id``: the same
uniqueness and the same equality lookups, but with ``text_pattern_ops``, so the list's
``starts_with(job_id, …)`` reads a range of it instead of scanning the table (the database's
collation is not "C", and a default btree serves no prefix under any other). Swapping the index
rather than adding one keeps the number of indexes an insert or a non-HOT update writes on
``mcp_tasks`` unchanged.

``ix_mcp_tasks_finished_at_job_id`` pages the list by finish time (newest or oldest finished
first) with a keyset cursor on (finished_at, job_id). It holds finished rows only: a task's
updates before it finishes skip it, and ``finished_at`` is set once, by the update that ends
the task (a status change, never a HOT update anyway).

``ix_mcp_tasks_stopping`` holds the tasks cancelled while running whose worker has not stopped
yet (a handful at any time): the list's ``status=stopping`` and the overview's count find them
there instead of reading the table. ``ix_mcp_tasks_failures`` (0023) is rebuilt to carry the
columns the overview's failure counts read, so the last day's counts are an index-only scan of
the failures alone.

Every index is built ``CONCURRENTLY`` outside the migration's transaction (a plain CREATE INDEX holds
off every write to the table while it reads it: about a minute at 10 M rows). If a build fails
it leaves an INVALID index: drop it (``DROP INDEX CONCURRENTLY``) and upgrade again. Dropping the
old constraint takes the table's lock for an instant. Issue 35.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

FAILURES = "status = 'failed' OR error_kind IS NOT NULL OR stop_reason IS NOT NULL"
STOPPING = "status = 'cancelled' AND started_at IS NOT NULL AND finished_at IS NULL"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_mcp_tasks_job_id",
            "mcp_tasks",
            ["job_id"],
            unique=True,
            postgresql_ops={"job_id": "text_pattern_ops"},
            postgresql_concurrently=True,
        )
        op.create_index(
            "ix_mcp_tasks_finished_at_job_id",
            "mcp_tasks",
            ["finished_at", "job_id"],
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            postgresql_concurrently=True,
        )
        op.create_index(
            "ix_mcp_tasks_stopping",
            "mcp_tasks",
            ["created_at", "job_id"],
            postgresql_where=sa.text(STOPPING),
            postgresql_concurrently=True,
        )
        _failures("ix_mcp_tasks_failures_0024", ["tool_name", "status", "error_kind", "stop_reason"])
        op.drop_index("ix_mcp_tasks_failures", table_name="mcp_tasks", postgresql_concurrently=True)
    op.execute("ALTER INDEX ix_mcp_tasks_failures_0024 RENAME TO ix_mcp_tasks_failures")
    op.drop_constraint("uq_mcp_tasks_job_id", "mcp_tasks", type_="unique")


def _failures(name: str, carried: list[str]) -> None:
    op.create_index(
        name,
        "mcp_tasks",
        ["finished_at"],
        postgresql_include=carried,
        postgresql_where=sa.text(FAILURES),
        postgresql_concurrently=True,
    )


def downgrade() -> None:
    op.create_unique_constraint("uq_mcp_tasks_job_id", "mcp_tasks", ["job_id"])
    op.drop_index("ix_mcp_tasks_failures", table_name="mcp_tasks")
    op.create_index("ix_mcp_tasks_failures", "mcp_tasks", ["finished_at"], postgresql_where=sa.text(FAILURES))
    op.drop_index("ix_mcp_tasks_stopping", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_finished_at_job_id", table_name="mcp_tasks")
    op.drop_index("ix_mcp_tasks_job_id", table_name="mcp_tasks")
