"""The API's quota calls across replicas, as store calls (``queries``, ``session_queries`` and
``limit_queries`` hold the SQL): the shared creates-per-second bucket after a refusal, requests in
progress shared between replicas (``tasks.shared_load``), and what a backlog task of a limited
tool waits for (``tools.concurrency``).

``QuotaReads`` is mixed into ``ApiStore``, over its pool (``_fetch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import LiteralString

from mcp_celery_tasks.store import limit_queries, session_queries

__all__ = ["QuotaReads"]


class QuotaReads:
    """The API's quota calls; ``ApiStore`` provides the connection."""

    async def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # ApiStore's

    async def share_load(self, replica: str, counts: Mapping[str, int], fresh_s: float) -> dict[str, int]:
        """Record this replica's requests in progress per principal; the other live replicas'."""
        params = {
            "replica": replica,
            "principals": list(counts),
            "counts": list(counts.values()),
            "fresh_s": fresh_s,
        }
        rows = await self._fetch(session_queries.SHARE_LOAD, params)
        return {str(row["principal"]): int(str(row["in_progress"])) for row in rows}

    async def forget_load(self, replica: str) -> None:
        """Delete this replica's rows (a clean shutdown: the others stop counting them at once)."""
        await self._fetch(session_queries.FORGET_LOAD, {"replica": replica})

    async def bucket_wait(self, owner: str, rate: float, burst: int) -> float | None:
        """After a refused create: seconds until the owner's shared creates-per-second bucket
        holds a token (0: it holds one now); None when there is no bucket."""
        params = {"owner": owner, "rate": rate, "burst": max(1, burst)}
        rows = await self._fetch(limit_queries.BUCKET_WAIT, params)
        return float(str(rows[0]["wait_s"])) if rows else None

    async def group_wait(self, task_id: str) -> tuple[str, str, int, int] | None:
        """(tool, group, limit in force, runs in flight) of a backlog task of a tool with a
        concurrency limit; None for any other task (``limit_queries.GROUP_WAIT``)."""
        rows = await self._fetch(limit_queries.GROUP_WAIT, {"task_id": task_id})
        if not rows:
            return None
        row = rows[0]
        tool, group = str(row["tool_name"]), str(row["concurrency_group"])
        return tool, group, int(str(row["in_force"])), int(str(row["running"]))
