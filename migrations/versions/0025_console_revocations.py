"""The console's server-side sign-outs: ``mcp_console_revocations``.

A console session is a signed cookie (``console.security``), valid on every replica without a
lookup. To end sessions before their 8 hours are up, a row here names what is revoked:

- ``subject = 'admin:<name>'``: every session of that admin issued before ``not_before``
  ("sign out everywhere", ``tasks console revoke NAME``);
- ``subject = '*'``: every session of every admin issued before ``not_before``;
- ``subject = 'session:<sha256 of the session nonce>'``: that one session (a sign-out: its cookie,
  replayed, is refused).

``expires_at`` is when a row stops mattering: a session lives 8 hours, so one issued before
``not_before`` has expired by ``not_before`` + 8 h, a signed-out one by its own expiry. The
collector deletes rows past it. Every revocation is also audited in ``mcp_console_actions``.
Issue 35 (the console's sessions).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_console_revocations",
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_by", sa.Text(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("subject", name=op.f("pk_mcp_console_revocations")),
    )
    op.create_index("ix_mcp_console_revocations_expires_at", "mcp_console_revocations", ["expires_at"])
    # The audit's retention deletes the oldest rows first, in batches.
    op.create_index("ix_mcp_console_actions_acted_at", "mcp_console_actions", ["acted_at"])


def downgrade() -> None:
    op.drop_index("ix_mcp_console_actions_acted_at", table_name="mcp_console_actions")
    op.drop_index("ix_mcp_console_revocations_expires_at", table_name="mcp_console_revocations")
    op.drop_table("mcp_console_revocations")
