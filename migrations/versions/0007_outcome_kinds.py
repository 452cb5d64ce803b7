"""How each task ended, for admins: an error kind and message on every failed, crashed or
stopped task (a tool error, an unexpected exception, a time or memory limit, a forced stop), and
the reason a job's process was stopped by force. The overview shows them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_OVERVIEW = """
CREATE OR REPLACE VIEW mcp_tasks_overview AS
SELECT
    t.task_id,
    t.job_id,
    CASE
        WHEN t.status = 'cancelled' AND t.started_at IS NOT NULL AND t.finished_at IS NULL
            THEN 'stopping'
        ELSE t.status
    END AS status,
    t.tool_name AS tool,
    t.owner,
    t.queue,
    t.status_message,
    t.created_at,
    now() - t.created_at AS age,
    COALESCE(t.finished_at, CASE WHEN t.status IN ('working', 'input_required') THEN now() END)
        - t.started_at AS runtime,
    t.started_at - t.created_at AS wait_before_start,
    t.attempts,
    t.max_attempts,
    t.worker,
    t.lease_until,
    (SELECT count(*) FROM mcp_task_inputs i
      WHERE i.task_id = t.task_id AND i.response IS NULL AND NOT i.superseded) AS outstanding_inputs,
    COALESCE(t.error_message, t.error ->> 'message') AS last_error,
    t.expires_at,
    t.error_kind,
    t.stop_reason
FROM mcp_tasks t
"""

_OVERVIEW_0001 = _OVERVIEW.replace("CREATE OR REPLACE VIEW", "CREATE VIEW").replace(
    "COALESCE(t.error_message, t.error ->> 'message') AS last_error", "t.error ->> 'message' AS last_error"
).replace(""",
    t.error_kind,
    t.stop_reason""", "")


def upgrade() -> None:
    op.add_column("mcp_tasks", sa.Column("error_kind", sa.Text(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("error_message", sa.Text(), nullable=True))
    op.add_column("mcp_tasks", sa.Column("stop_reason", sa.Text(), nullable=True))
    op.execute(_OVERVIEW)


def downgrade() -> None:
    op.execute("DROP VIEW mcp_tasks_overview")
    op.execute(_OVERVIEW_0001)
    op.drop_column("mcp_tasks", "stop_reason")
    op.drop_column("mcp_tasks", "error_message")
    op.drop_column("mcp_tasks", "error_kind")
