"""The SQL of the console's server-side sign-outs (``mcp_console_revocations``, migration 0025)
and of the collection of the console's audit.

Each revocation is one statement: the revocation row, its audit row in ``mcp_console_actions``
and a ``NOTIFY`` on the task event channel with the payload ``REVOKED_SIGNAL`` (never a task id:
those are URL-safe tokens without a colon), which tells every API replica's event hub to drop
its cached revocations (``console.revocation``). ``not_before`` is the database's clock, so every
replica compares its sessions with one clock.
"""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.store.queries import NOTIFY_CHANNEL

__all__ = ["ALL_ADMINS", "REVOKED_SIGNAL"]

REVOKED_SIGNAL: Final = "console:revoked"
ALL_ADMINS: Final = "*"
"""The subject that revokes every admin's sessions."""

_AUDIT_AND_NOTIFY: Final[LiteralString] = f"""
), audit AS (
    INSERT INTO mcp_console_actions (actor, action, target, affected, detail)
    SELECT %(actor)s, %(action)s, %(target)s, 1, %(detail)s FROM rev
)
SELECT subject, extract(epoch FROM not_before)::float8 AS not_before,
       pg_notify('{NOTIFY_CHANNEL}', '{REVOKED_SIGNAL}') AS notified
FROM rev
"""

# Every session of ``subject`` (``admin:<name>`` or ``*``) issued before now is refused until the
# last of them would have expired anyway (``session_s`` from now).
REVOKE_SESSIONS: Final[LiteralString] = (
    """
WITH rev AS (
    INSERT INTO mcp_console_revocations AS r (subject, not_before, expires_at, revoked_by)
    VALUES (%(subject)s, clock_timestamp(), clock_timestamp() + %(session_s)s * interval '1 second',
            %(actor)s)
    ON CONFLICT (subject) DO UPDATE
        SET not_before = EXCLUDED.not_before, expires_at = EXCLUDED.expires_at,
            revoked_by = EXCLUDED.revoked_by, revoked_at = now()
    RETURNING subject, not_before"""
    + _AUDIT_AND_NOTIFY
)

# One session (a sign-out), until its own expiry (``expires``, epoch seconds).
REVOKE_SESSION: Final[LiteralString] = (
    """
WITH rev AS (
    INSERT INTO mcp_console_revocations AS r (subject, not_before, expires_at, revoked_by)
    VALUES (%(subject)s, clock_timestamp(), to_timestamp(%(expires)s), %(actor)s)
    ON CONFLICT (subject) DO UPDATE SET revoked_at = r.revoked_at
    RETURNING subject, not_before"""
    + _AUDIT_AND_NOTIFY
)

LIVE_REVOCATIONS: Final[LiteralString] = """
SELECT subject, extract(epoch FROM not_before)::float8 AS not_before
FROM mcp_console_revocations WHERE expires_at > now()
"""

DELETE_EXPIRED_REVOCATIONS: Final[LiteralString] = """
DELETE FROM mcp_console_revocations WHERE subject IN (
    SELECT subject FROM mcp_console_revocations WHERE expires_at < now()
    ORDER BY expires_at LIMIT %(limit)s
)
"""

# The audit older than the retention, oldest first (ix_mcp_console_actions_acted_at).
DELETE_OLD_ACTIONS: Final[LiteralString] = """
DELETE FROM mcp_console_actions WHERE id IN (
    SELECT id FROM mcp_console_actions
    WHERE acted_at < now() - %(retention_s)s * interval '1 second'
    ORDER BY acted_at LIMIT %(limit)s
)
"""
