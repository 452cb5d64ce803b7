"""The console's store calls (``console_queries`` and ``admin_queries`` hold the SQL): the task
list under filters with a keyset cursor, one task by job id with its inputs, steps and artifacts,
the overview, and the audit of console actions.

``ConsoleReads`` is mixed into ``ApiStore``, over its pool (``_fetch``). Rows are plain mappings
for the pages; a task's ``task_id`` is read for the calls that need it (cancel, the event hub)
and never handed to a template (``console.pages``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import LiteralString

import psycopg
from psycopg.types.json import Jsonb

from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.store import admin_queries, console_queries, fleet_queries, limit_queries, step_queries
from mcp_celery_tasks.store.limit_calls import PRINCIPAL_FIELDS

__all__ = ["ConsoleReads", "NotPermitted", "TaskDetail", "TaskFilter", "TaskPage"]

Row = Mapping[str, object]


class NotPermitted(Exception):
    """The API's database role may not make this change (``roles``: only the admin role writes
    limits). The message is for the admin."""


WHOLE_JOB_ID = 36
"""A job id is a UUID's 36 characters: a filter that long looks it up instead of scanning."""


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """What the console's task list shows: every field optional; ``before`` is the keyset cursor
    (sort key, job_id) of the last row of the previous page, the sort key being ``created_at``
    or, under ``sort="finished"``, ``finished_at`` (which then shows finished tasks only)."""

    status: str | None = None
    tool: str | None = None
    owner: str | None = None
    queue: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    job: str | None = None
    before: tuple[datetime, str] | None = None
    after: tuple[datetime, str] | None = None
    """Only rows after this (sort key, job_id): the next page oldest first, or the live list's
    new rows."""
    sort: str = "created"

    def statement(self, limit: int, oldest: bool = False) -> tuple[LiteralString, dict[str, object]]:
        conditions, params = self.conditions(limit)
        finished = self.sort == "finished"
        if finished:
            conditions.append(console_queries.FIELD_FILTERS["finished"])
        if self.before is not None:
            conditions.append(console_queries.FIELD_FILTERS["finished_before" if finished else "before"])
            params["before_at"], params["before_job"] = self.before
        if self.after is not None:
            conditions.append(console_queries.FIELD_FILTERS["finished_after" if finished else "after"])
            params["after_at"], params["after_job"] = self.after
        return console_queries.list_statement(
            conditions, oldest, "finished" if finished else "created"
        ), params

    def conditions(self, limit: int) -> tuple[list[LiteralString], dict[str, object]]:
        """The filter's WHERE fragments and parameters, without the page cursor."""
        conditions: list[LiteralString] = []
        params: dict[str, object] = {"limit": limit}
        if self.status is not None:
            conditions.append(console_queries.STATUS_FILTERS[self.status])
        for name in ("tool", "owner", "queue", "since", "until", "job"):
            value = getattr(self, name)
            if value is not None:
                whole = name == "job" and len(value) >= WHOLE_JOB_ID
                conditions.append(console_queries.FIELD_FILTERS["job_exact" if whole else name])
                params[name] = value
        return conditions, params


@dataclass(frozen=True, slots=True)
class TaskPage:
    rows: list[Row]
    more: bool
    """Another page follows (its cursor is the last row's created_at and job_id)."""


@dataclass(frozen=True, slots=True)
class TaskDetail:
    task: Row
    inputs: list[Row] = field(default_factory=list)
    steps: list[Row] = field(default_factory=list)
    artifacts: list[Row] = field(default_factory=list)


class ConsoleReads:
    """The console's calls; ``ApiStore`` provides the connection."""

    async def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # ApiStore's

    async def console_tasks(self, where: TaskFilter, limit: int = 50, *, oldest: bool = False) -> TaskPage:
        """One page of tasks, newest (or oldest) first (one row more is read to know whether more
        follow)."""
        sql, params = where.statement(limit + 1, oldest)
        rows = await self._fetch(sql, params)
        return TaskPage(rows[:limit], len(rows) > limit)

    async def console_task(self, job_id: str) -> TaskDetail | None:
        """A task by its job id, with its input requests, recorded steps and artifacts."""
        rows = await self._fetch(console_queries.TASK_BY_JOB, {"job_id": job_id})
        if not rows:
            return None
        task = rows[0]
        params = {"task_id": task["task_id"]}
        return TaskDetail(
            task,
            await self._fetch(admin_queries.ADMIN_INPUTS, params),
            await self._fetch(step_queries.ADMIN_STEPS, params),
            await self._fetch(console_queries.ARTIFACTS_OF, params),
        )

    async def console_rows(self, job_ids: list[str]) -> list[Row]:
        """The list's columns of these jobs (those that still exist), for the live list."""
        return await self._fetch(console_queries.ROWS_BY_JOBS, {"jobs": job_ids})

    async def console_bulk_count(self, where: TaskFilter, action: str, cap: int) -> int:
        """How many tasks under the filter (its cursor ignored) ``action`` would act on, counted
        up to ``cap``."""
        conditions, params = where.conditions(cap)
        conditions.append(console_queries.ACTIONABLE[action])
        rows = await self._fetch(console_queries.count_statement(conditions), params)
        return int(str(rows[0]["n"]))

    async def console_bulk_rows(self, where: TaskFilter, action: str, limit: int) -> list[Row]:
        """At most ``limit`` tasks under the filter that ``action`` acts on, newest first."""
        conditions, params = where.conditions(limit)
        conditions.append(console_queries.ACTIONABLE[action])
        return await self._fetch(console_queries.bulk_statement(conditions), params)

    async def console_overview(
        self, window_s: float = 3600.0, *, day_s: float = 86400.0, default_limit: int | None = None
    ) -> dict[str, list[Row]]:
        """Active tasks per queue and tool, per queue (with the oldest job waiting to start), per
        queue and principal, per principal (active against its limit, its share of the live
        workers' slots), the failures and forced stops per tool of the last ``window_s`` and the
        last ``day_s`` (with the latest failed jobs), and the live workers of the registry with the
        jobs on them (``tasks workers``' statement)."""
        workers = await self._fetch(fleet_queries.WORKERS, {"all": False})
        slots = sum(int(str(row["slots"] or 0)) for row in workers if row["kind"] == "worker")
        shares = await self._fetch(
            console_queries.PRINCIPAL_SHARES, {"default_limit": default_limit, "limit": 50}
        )
        return {
            "queues": await self._fetch(admin_queries.ADMIN_SUMMARY, {}),
            "queue_totals": await self._fetch(console_queries.QUEUE_TOTALS, {}),
            "principals": await self._fetch(admin_queries.ADMIN_PRINCIPALS, {"limit": 50}),
            "shares": [{**row, "share": _share(row["running"], slots)} for row in shares],
            "failures": await self._fetch(
                console_queries.FAILURES_RECENT, {"hour_s": window_s, "day_s": day_s}
            ),
            "recent": await self._fetch(admin_queries.ADMIN_RECENT_FAILURES, {"limit": 10}),
            "workers": workers,
        }

    async def record_console_action(
        self, actor: str, action: str, target: str, affected: int, detail: JSONObject | None = None
    ) -> None:
        """Audit one console action: who, what, on which target, how many rows it changed."""
        params = {
            "actor": actor,
            "action": action,
            "target": target,
            "affected": affected,
            "detail": Jsonb(detail) if detail is not None else None,
        }
        await self._fetch(console_queries.RECORD_ACTION, params)

    async def console_set_limits(self, principal: str, actor: str, limits: Mapping[str, object]) -> None:
        """Override some of a principal's limits (None leaves one as it was), each changed field
        audited in ``mcp_limit_changes`` by the same statement (``limit_queries``, as ``tasks limits
        set`` does)."""
        params = {
            "principal": principal,
            "actor": actor,
            **{name: limits.get(name) for name in PRINCIPAL_FIELDS},
        }
        await self._limit_change(limit_queries.SET_PRINCIPAL_LIMITS, params, "tasks limits set")

    async def console_tool_limits(self) -> tuple[list[Row], list[Row]]:
        """The tool concurrency overrides, and the concurrency groups with active jobs (in flight,
        waiting, declared, in force), as ``tasks limits tool ls`` shows them."""
        return (
            await self._fetch(limit_queries.TOOL_LIMITS, {}),
            await self._fetch(limit_queries.CONCURRENCY_GROUPS, {"limit": 200}),
        )

    async def console_set_tool_limit(
        self, tool: str, group: str, concurrency: int, note: str | None, actor: str
    ) -> None:
        """Replace a tool's concurrency (``group`` ``'*'``: every group), by the audited statement
        of ``tasks limits tool set``."""
        params = {"tool": tool, "group": group, "concurrency": concurrency, "note": note, "actor": actor}
        await self._limit_change(limit_queries.SET_TOOL_LIMIT, params, "tasks limits tool set")

    async def console_clear_tool_limit(self, tool: str, group: str, actor: str) -> bool:
        """Back to the declared concurrency (``tasks limits tool clear``); False: no such override."""
        params = {"tool": tool, "group": group, "actor": actor}
        return bool(
            await self._limit_change(limit_queries.CLEAR_TOOL_LIMIT, params, "tasks limits tool clear")
        )

    async def _limit_change(
        self, sql: LiteralString, params: Mapping[str, object], command: str
    ) -> list[Row]:
        try:
            return await self._fetch(sql, params)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise NotPermitted(
                "the API's database role may not change limits (mcp_tasks_api reads them only); "
                f"an admin changes them with `mcp-celery-tasks {command}`"
            ) from exc

    async def console_audit(self, limit: int = 100) -> tuple[list[Row], list[Row]]:
        """The latest console actions and limit changes (``tasks limits``), newest first."""
        return (
            await self._fetch(console_queries.ACTIONS, {"limit": limit}),
            await self._fetch(limit_queries.LIMIT_CHANGES, {"limit": limit}),
        )


def _share(running: object, slots: int) -> float | None:
    """Running jobs as a fraction of the live workers' slots (None: no live worker)."""
    return int(str(running)) / slots if slots else None
