"""The console's actions on many tasks, retry, and tool limits: retry one task as a new task
(``retry``), cancel or retry every task under the list's current filter, and set or clear a
tool's concurrency override (the audited statements of ``tasks limits tool set|clear``).

A bulk action takes two POSTs, each with the session's CSRF token: the first counts what the
filter matches (a dry run: nothing changes) and shows "N tasks match; cancel them?" with the
filter and the count; the second reads the filter's tasks again and acts on at most that count
and at most ``BULK_MAX`` (newest first, as the list shows them), then writes one audit row with
how many it changed. The page cursor is no part of a bulk filter: it acts on the filter, not
on the page shown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mcp_celery_tasks.console import listing
from mcp_celery_tasks.console.http import html
from mcp_celery_tasks.console.limits import parse_tool_limit
from mcp_celery_tasks.console.render import render
from mcp_celery_tasks.console.retry import RETRYABLE, retry
from mcp_celery_tasks.console.security import HEADERS, Admin, Refused
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.lifecycle import ALL_GROUPS
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.store.console_calls import TaskFilter
from mcp_celery_tasks.tools.registry import get_tool

__all__ = ["BULK_MAX", "Actions", "ServicesOf"]

logger = logging.getLogger("mcp_celery_tasks.console")

ServicesOf = Callable[[Request], Services]
BULK_MAX = 1000
"""Most tasks one bulk action changes (narrow the filter, or run it again, for more)."""
CANCELS_AT_ONCE = 4
"""A bulk cancel's cancels in flight at once: each is a statement and a broker revoke, so four
overlap their round trips (1,000 in about a third of the time of one by one) while leaving the
rest of the database pool (``db_pool_max``, 10) to other requests."""
VERBS = {"cancel": "cancel", "retry": "retry"}
MAX_REASONS = 5


def _bulk_filter(form: Mapping[str, str]) -> tuple[TaskFilter, dict[str, str]]:
    """The list filter a bulk form carries (never its cursor or page size), and its fields."""
    fields = listing.filter_fields(form)
    return listing.parse(fields), fields


def _action(form: Mapping[str, str]) -> str:
    action = form.get("action", "")
    if action not in VERBS:
        raise Refused(400, "action: cancel or retry")
    return action


class Actions:
    """Retry and the bulk actions, mixed into the console (``pages.Console``)."""

    services_of: ServicesOf
    prefix: str

    async def retry(self, request: Request, admin: Admin) -> Response:
        services = self.services_of(request)
        job_id = request.path_params["job_id"]
        detail = await services.store.console_task(job_id)
        if detail is None:
            raise Refused(404, "no such job (it may have expired)")
        if detail.task["display_status"] not in RETRYABLE:
            raise Refused(409, "only a task that failed, was cancelled or ended with an error is retried")
        done = await retry(services, detail.task, admin.actor)
        affected = 1 if done.outcome == "created" else 0
        audited: dict[str, JSONValue] = {"outcome": done.outcome, "new_job": done.job_id}
        if done.reason:
            audited["reason"] = done.reason
        await services.console_writes.record_console_action(admin.actor, "retry", job_id, affected, audited)
        logger.info("console: %s retried job %s: %s %s", admin.actor, job_id, done.outcome, done.job_id)
        if done.job_id is None:
            raise Refused(429 if done.outcome == "quota" else 409, f"not retried: {done.reason}")
        return RedirectResponse(f"{self.prefix}/tasks/{quote(done.job_id)}", 303, headers=HEADERS)

    async def bulk_confirm(self, request: Request, admin: Admin) -> Response:
        """The dry run: how many tasks the filter's action would change (counted up to one more
        than ``BULK_MAX``)."""
        form = request.state.form
        action = _action(form)
        where, fields = _bulk_filter(form)
        count = await self.services_of(request).store.console_bulk_count(where, action, BULK_MAX + 1)
        return html(
            render(
                "bulk.html",
                prefix=self.prefix,
                admin=admin,
                action=action,
                fields=fields,
                matched=count,
                acts_on=min(count, BULK_MAX),
                bulk_max=BULK_MAX,
                back=urlencode(fields),
                done=None,
            )
        )

    async def bulk(self, request: Request, admin: Admin) -> Response:
        form = request.state.form
        action = _action(form)
        where, fields = _bulk_filter(form)
        confirmed = form.get("count", "")
        if not confirmed.isdigit():
            raise Refused(400, "count: the number the confirmation showed")
        services = self.services_of(request)
        rows = await services.store.console_bulk_rows(where, action, min(int(confirmed), BULK_MAX))
        if action == "cancel":
            done = await _cancel_all(services, rows, admin, form.get("reason", ""))
        else:
            done = await _retry_all(services, rows, admin)
        target = "filter " + (urlencode(fields) or "(all tasks)")
        detail: dict[str, JSONValue] = {"confirmed": int(confirmed), "matched": len(rows), **done}
        await services.console_writes.record_console_action(
            admin.actor, f"bulk {action}", target, int(str(done["changed"])), detail
        )
        logger.info("console: %s bulk %s on %s: %s", admin.actor, action, target, done)
        return html(
            render(
                "bulk.html",
                prefix=self.prefix,
                admin=admin,
                action=action,
                fields=fields,
                matched=len(rows),
                acts_on=len(rows),
                bulk_max=BULK_MAX,
                back=urlencode(fields),
                done=done,
            )
        )

    async def set_tool_limit(self, request: Request, admin: Admin) -> Response:
        change = parse_tool_limit(request.state.form)
        spec = get_tool(change.tool)
        store = self.services_of(request).console_writes
        where = f"tool {change.tool}" + ("" if change.group == ALL_GROUPS else f" for {change.group}")
        if change.concurrency is None:  # an override of a tool no longer served may still be cleared
            cleared = await store.console_clear_tool_limit(change.tool, change.group, admin.actor)
            await store.record_console_action(admin.actor, "clear tool limit", where, int(cleared))
        else:
            if spec is None or spec.concurrency is None:
                raise Refused(
                    400, f"tool: {change.tool} is no tool declared with concurrency= (only those are limited)"
                )
            await store.console_set_tool_limit(
                change.tool, change.group, change.concurrency, change.note, admin.actor
            )
            detail: dict[str, JSONValue] = {"concurrency": change.concurrency, "note": change.note}
            await store.record_console_action(admin.actor, "set tool limit", where, 1, detail)
        logger.info("console: %s changed the concurrency of %s: %s", admin.actor, where, change.concurrency)
        return RedirectResponse(f"{self.prefix}/limits", 303, headers=HEADERS)


async def _cancel_all(
    services: Services, rows: list[Mapping[str, object]], admin: Admin, reason: str
) -> dict[str, JSONValue]:
    """Cancel each row through ``tasks/cancel``'s path (one already ended counts as unchanged)."""
    message = f"{reason.strip()[:500] or 'cancelled by an operator'} ({admin.actor})"
    rows = list(rows)

    async def lane(start: int) -> int:
        changed = 0
        for row in rows[start::CANCELS_AT_ONCE]:
            outcome = await services.tasks.cancel(str(row["task_id"]), str(row["owner"]), message)
            changed += 1 if outcome.cancelled_now else 0
        return changed

    changed = sum(await asyncio.gather(*(lane(start) for start in range(CANCELS_AT_ONCE))))
    return {"changed": changed, "unchanged": len(rows) - changed}


async def _retry_all(
    services: Services, rows: list[Mapping[str, object]], admin: Admin
) -> dict[str, JSONValue]:
    """Retry each row; once a principal's quota refuses one, its further rows are not tried (they
    are counted as refused: run the action again later, retried jobs are found, not rerun)."""
    counts = {"created": 0, "already": 0, "quota": 0, "refused": 0}
    over_quota: set[str] = set()
    reasons: list[JSONValue] = []
    for row in rows:
        owner = str(row["owner"])
        if owner in over_quota:
            counts["quota"] += 1
            continue
        retried = await retry(services, row, admin.actor)
        counts[retried.outcome] += 1
        if retried.outcome == "quota":
            over_quota.add(owner)
        if retried.reason and len(reasons) < MAX_REASONS:
            reasons.append(f"job {row['job_id']} ({owner}): {retried.reason}")
    return {
        "changed": counts["created"],
        "already_retried": counts["already"],
        "refused_by_quota": counts["quota"],
        "refused": counts["refused"],
        "reasons": reasons,
    }
