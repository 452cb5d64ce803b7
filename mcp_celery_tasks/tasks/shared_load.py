"""Requests in progress per principal, shared by the API replicas once a second.

Each replica writes its own counts to ``mcp_api_load`` and reads the other live replicas' in the
same statement; ``Quotas.request`` then counts a principal's requests here plus there against
``max_concurrent_requests``. One round trip per replica per second, whatever the traffic: a
shared counter per request would cost two writes on every request. The price is a second of lag:
a principal may briefly hold its limit on each replica before the others hear of it. A replica
that cannot reach Postgres keeps the last counts it heard (the per-process bound holds anyway);
a crashed one's rows stop counting after ``FRESH_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import Final, Protocol

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.tasks.quotas import Quotas

__all__ = ["FRESH_S", "INTERVAL_S", "LoadStore", "share_load"]

logger = logging.getLogger("mcp_celery_tasks.quotas")

INTERVAL_S: Final = 1.0
FRESH_S: Final = 5.0
"""Another replica's counts older than this no longer count (it crashed, or cannot write)."""


class LoadStore(Protocol):
    async def share_load(self, replica: str, counts: dict[str, int], fresh_s: float) -> dict[str, int]: ...

    async def forget_load(self, replica: str) -> None: ...


def replica_id() -> str:
    """This process, unique across restarts and hosts."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


async def share_load(store: LoadStore, quotas: Quotas, replica: str, interval_s: float = INTERVAL_S) -> None:
    """Run until cancelled; on the way out, delete this replica's rows."""
    failing = False
    try:
        while True:
            try:
                quotas.elsewhere = await store.share_load(replica, quotas.in_progress(), FRESH_S)
                failing = False
            except InfrastructureError:
                if not failing:
                    logger.warning("could not share requests in progress with the other API replicas")
                failing = True
            except Exception:  # a schema behind the code (not migrated yet): keep serving, say so once
                if not failing:
                    logger.exception("could not share requests in progress with the other API replicas")
                failing = True
            await asyncio.sleep(interval_s)
    finally:
        with contextlib.suppress(InfrastructureError, asyncio.CancelledError):
            await asyncio.wait_for(store.forget_load(replica), 2.0)
