"""The console's server-side sign-outs as store calls (``revocation_queries`` holds the SQL):
revoke every session of an admin (or of all admins), revoke one session, read what is revoked;
and the collector's deletes of the audit past its retention and of revocations that no longer
matter.

``RevocationReads`` is mixed into ``ApiStore`` (the console), ``RevocationWrites`` into
``WorkerStore`` (``tasks console revoke`` and the maintenance worker). Both build their
parameters with the same helpers and differ only in how they run the statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import LiteralString

from psycopg.types.json import Jsonb

from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import revocation_queries as q

__all__ = ["ALL_ADMINS", "Revocation", "RevocationReads", "RevocationWrites", "admin_subject"]

ALL_ADMINS = q.ALL_ADMINS
Row = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Revocation:
    """``subject`` (``admin:<name>``, ``*`` or ``session:<digest>``) and ``not_before``: epoch
    seconds of the database's clock."""

    subject: str
    not_before: float


def admin_subject(name: str) -> str:
    return f"admin:{name}"


def _revoke_params(
    subject: str, actor: str, session_s: float, detail: JSONObject | None
) -> dict[str, object]:
    everyone = subject == ALL_ADMINS
    return {
        "subject": subject,
        "session_s": session_s,
        "actor": actor,
        "action": "revoke sessions",
        "target": "every admin" if everyone else subject,
        "detail": Jsonb(detail) if detail is not None else None,
    }


def _session_params(digest: str, expires: int, actor: str) -> dict[str, object]:
    return {
        "subject": f"session:{digest}",
        "expires": expires,
        "actor": actor,
        "action": "sign out",
        "target": f"session {digest[:12]}",  # enough to tell sessions apart, not to present one
        "detail": None,
    }


def _revocations(rows: list[Row]) -> list[Revocation]:
    return [Revocation(str(row["subject"]), float(str(row["not_before"]))) for row in rows]


class RevocationReads:
    """The console's revocation calls; ``ApiStore`` provides the connection."""

    async def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Row]:
        raise NotImplementedError  # ApiStore's

    async def console_revocations(self) -> list[Revocation]:
        """What is revoked now (rows past their expiry no longer matter)."""
        return _revocations(await self._fetch(q.LIVE_REVOCATIONS, {}))

    async def revoke_console_sessions(
        self, subject: str, actor: str, session_s: float, detail: JSONObject | None = None
    ) -> Revocation:
        """Refuse every session of ``subject`` issued before now; audited as ``actor``."""
        rows = await self._fetch(q.REVOKE_SESSIONS, _revoke_params(subject, actor, session_s, detail))
        return _revocations(rows)[0]

    async def revoke_console_session(self, digest: str, expires: int, actor: str) -> None:
        """Refuse one session (its nonce's ``digest``) until it expires at ``expires``."""
        await self._fetch(q.REVOKE_SESSION, _session_params(digest, expires, actor))


class RevocationWrites:
    """The admin command's and the collector's calls; ``WorkerStore`` provides the connection."""

    _settings: Settings

    def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Row]:
        raise NotImplementedError  # WorkerStore's

    def _execute(self, sql: LiteralString, params: Mapping[str, object]) -> int:
        raise NotImplementedError  # WorkerStore's

    def revoke_console_sessions(
        self, subject: str, actor: str, session_s: float, detail: JSONObject | None = None
    ) -> Revocation:
        rows = self._fetch(q.REVOKE_SESSIONS, _revoke_params(subject, actor, session_s, detail))
        return _revocations(rows)[0]

    def console_revocations(self) -> list[Revocation]:
        return _revocations(self._fetch(q.LIVE_REVOCATIONS, {}))

    def delete_expired_revocations(self, limit: int) -> int:
        """Forget up to ``limit`` revocations whose sessions have all expired anyway."""
        return self._execute(q.DELETE_EXPIRED_REVOCATIONS, {"limit": limit})

    def delete_old_console_actions(self, limit: int) -> int:
        """Delete up to ``limit`` audit rows older than ``console_audit_retention_seconds``,
        oldest first (none when it is 0: kept forever)."""
        retention_s = self._settings.console_audit_retention_seconds
        if retention_s <= 0:
            return 0
        return self._execute(q.DELETE_OLD_ACTIONS, {"retention_s": retention_s, "limit": limit})
