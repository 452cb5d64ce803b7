"""Server-side sign-outs for stateless console sessions, without a query per page view.

A session cookie is signed and checked without Postgres (``security``); to end one before its 8
hours, ``mcp_console_revocations`` says what is revoked (``store.revocation_queries``): every
session of an admin, or of all admins, issued before a moment (``not_before``, the database's
clock), or one session by its nonce's digest (a sign-out). Why a per-admin moment and a set of
signed-out nonces, not a table of live sessions: a session is still made and checked with no
write, the "sign out everywhere" of a lost laptop is one row whatever the number of sessions,
and a signed-out nonce is kept only until its cookie would have expired anyway (8 h at most),
so the set stays as small as the sign-outs of a working day.

Each API process keeps a snapshot of the live rows (``Revocations``) and checks every console
request against it in memory. The snapshot is read again on the next console request after:

- a revocation anywhere: its statement sends ``NOTIFY`` with ``REVOKED_SIGNAL`` on the task
  event channel, and the process's event hub drops the snapshot (``TaskEvents.on_signal``);
- a reconnect of the hub's listener (a signal may have been missed);
- ``SAFETY_S`` while the hub listens, ``UNLISTENED_S`` while it does not (the listener is down:
  a revocation still takes effect within a second).

A revocation made by this process applies here at once (``note``). A snapshot that cannot be
read fails closed: the request is answered 503 (``InfrastructureError``), never let through.
A live page's open stream (SSE) is checked before each message it sends, its keep-alive
included: a revoked session's stream ends at its next change or within ``live.KEEPALIVE_S``, and
the browser's reconnect is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

from mcp_celery_tasks.console.security import Admin, Refused
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.store.revocation_calls import ALL_ADMINS, Revocation, admin_subject
from mcp_celery_tasks.store.revocation_queries import REVOKED_SIGNAL
from mcp_celery_tasks.tasks.events import TaskEvents

__all__ = ["SAFETY_S", "UNLISTENED_S", "Revocations", "session_subject"]

SAFETY_S = 30.0
"""Longest a snapshot is trusted while the event hub listens (a lost NOTIFY costs this much)."""
UNLISTENED_S = 1.0
"""Longest a snapshot is trusted while the event hub's listener is down."""

SIGNED_OUT = "your session was signed out; sign in again"


def session_subject(digest: str) -> str:
    return f"session:{digest}"


class Revocations:
    """The process's snapshot of live revocations, checked in memory on every console request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._not_before: dict[str, float] = {}
        """``admin:<name>`` or ``*`` -> epoch seconds before which its sessions are refused."""
        self._sessions: set[str] = set()
        self._generation = 0
        """Bumped by every signal: a snapshot read under an older generation is stale."""
        self._read: tuple[int, float] | None = None
        """(generation, clock) of the last read."""
        self._lock = asyncio.Lock()
        self._hub: TaskEvents | None = None
        self.reads = 0
        """Snapshots read so far (tests and benchmarks count them)."""

    # ---- freshness ---------------------------------------------------------------------------

    def invalidate(self) -> None:
        """Something may have been revoked (a NOTIFY, a reconnect): read again before trusting."""
        self._generation += 1

    def _bind(self, events: TaskEvents) -> None:
        if self._hub is not events:  # one hub per app lifespan: the first request registers
            events.on_signal(REVOKED_SIGNAL, self.invalidate)
            self._hub = events
            self.invalidate()

    def _fresh(self, events: TaskEvents) -> bool:
        if self._read is None or self._read[0] != self._generation:
            return False
        max_age = SAFETY_S if events.connected else UNLISTENED_S
        return self.clock() - self._read[1] < max_age

    async def _refresh(self, services: Services) -> None:
        async with self._lock:  # one read for a burst of requests
            if self._fresh(services.events):
                return
            generation, read_at = self._generation, self.clock()
            rows = await services.store.console_revocations()
            self._replace(rows)
            self._read = (generation, read_at)
            self.reads += 1

    def _replace(self, rows: Iterable[Revocation]) -> None:
        not_before: dict[str, float] = {}
        sessions: set[str] = set()
        for row in rows:
            if row.subject.startswith("session:"):
                sessions.add(row.subject)
            else:
                not_before[row.subject] = row.not_before
        self._not_before, self._sessions = not_before, sessions

    # ---- the check ---------------------------------------------------------------------------

    def note(self, revocation: Revocation) -> None:
        """A revocation this process just made: in force here before any NOTIFY comes back."""
        if revocation.subject.startswith("session:"):
            self._sessions.add(revocation.subject)
        else:
            known = self._not_before.get(revocation.subject, 0.0)
            self._not_before[revocation.subject] = max(known, revocation.not_before)

    def revoked(self, admin: Admin) -> bool:
        """Whether the snapshot refuses this session (a bearer request has none: never)."""
        if not admin.session:
            return False
        if session_subject(admin.session) in self._sessions:
            return True
        not_before = max(
            self._not_before.get(admin_subject(admin.name), 0.0), self._not_before.get(ALL_ADMINS, 0.0)
        )
        return admin.issued_ms < not_before * 1000.0

    async def check(self, admin: Admin, services: Services) -> None:
        """``Refused(401)`` for a revoked session. In memory unless the snapshot is due again."""
        if not admin.session:
            return
        self._bind(services.events)
        if not self._fresh(services.events):
            await self._refresh(services)
        if self.revoked(admin):
            raise Refused(401, SIGNED_OUT)

    async def guarded(
        self, stream: AsyncGenerator[str, None], admin: Admin, services: Services
    ) -> AsyncIterator[str]:
        """``stream``'s messages while ``admin``'s session stands; it ends at the first one after
        a revocation (the snapshot is checked in memory, read again only when due). ``stream`` is
        closed with this one (a page that went away leaves no watch behind in the hub)."""
        async with contextlib.aclosing(stream):
            async for message in stream:
                try:
                    await self.check(admin, services)
                except Refused:
                    return
                yield message
