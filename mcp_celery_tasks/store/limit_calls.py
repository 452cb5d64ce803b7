"""Admins' limits as store calls (``limit_queries`` holds the SQL): principal overrides, tool
concurrency overrides, the audit of their changes, and the concurrency groups in use.

``LimitCalls`` is mixed into ``WorkerStore`` (the admin commands); the API reads the principal
overrides through ``ApiStore.principal_limits``. Every write is audited in the same statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import LiteralString, TypeVar

from psycopg.rows import RowFactory

from mcp_celery_tasks.lifecycle import ALL_GROUPS
from mcp_celery_tasks.store import admin_queries, limit_queries
from mcp_celery_tasks.store.row_types import PrincipalLimits, typed_rows

__all__ = ["PRINCIPAL_FIELDS", "LimitCalls"]

R = TypeVar("R")

PRINCIPAL_FIELDS = ("max_active_tasks", "creates_per_second", "create_burst", "max_concurrent_requests",
                    "max_waiting_inputs", "note")  # fmt: skip


class LimitCalls:
    """The limit store calls; ``WorkerStore`` provides the connection."""

    def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # WorkerStore's

    def _rows(self, sql: LiteralString, params: Mapping[str, object], rows: RowFactory[R]) -> list[R]:
        raise NotImplementedError  # WorkerStore's

    def principal_limits(self) -> list[PrincipalLimits]:
        return self._rows(admin_queries.PRINCIPAL_LIMITS, {}, typed_rows(PrincipalLimits))

    def set_principal_limits(self, principal: str, *, actor: str = "?", **limits: object) -> None:
        """Override some of a principal's limits (None leaves one as it was); audited as ``actor``."""
        params = {"principal": principal, "actor": actor, **{n: limits.get(n) for n in PRINCIPAL_FIELDS}}
        self._fetch(limit_queries.SET_PRINCIPAL_LIMITS, params)

    def clear_principal_limits(self, principal: str, *, actor: str = "?") -> bool:
        params = {"principal": principal, "actor": actor}
        return bool(self._fetch(limit_queries.CLEAR_PRINCIPAL_LIMITS, params))

    def tool_limits(self) -> list[Mapping[str, object]]:
        """Admins' concurrency overrides (``group`` ``'*'``: every group of the tool)."""
        return self._fetch(limit_queries.TOOL_LIMITS, {})

    def set_tool_limit(
        self,
        tool: str,
        concurrency: int,
        *,
        group: str = ALL_GROUPS,
        note: str | None = None,
        actor: str = "?",
    ) -> None:
        """Replace the concurrency of one group of ``tool`` (or of all of them); 0 pauses it."""
        params = {"tool": tool, "group": group, "concurrency": concurrency, "note": note, "actor": actor}
        self._fetch(limit_queries.SET_TOOL_LIMIT, params)

    def clear_tool_limit(self, tool: str, *, group: str = ALL_GROUPS, actor: str = "?") -> bool:
        """Back to the declared limit; False if there was no such override."""
        return bool(
            self._fetch(limit_queries.CLEAR_TOOL_LIMIT, {"tool": tool, "group": group, "actor": actor})
        )

    def limit_changes(self, limit: int = 50) -> list[Mapping[str, object]]:
        """The audit of limit changes, newest first."""
        return self._fetch(limit_queries.LIMIT_CHANGES, {"limit": limit})

    def concurrency_groups(self, limit: int = 200) -> list[Mapping[str, object]]:
        """Concurrency groups with active jobs: in flight, waiting, declared and in-force limits."""
        return self._fetch(limit_queries.CONCURRENCY_GROUPS, {"limit": limit})
