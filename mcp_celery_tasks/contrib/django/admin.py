"""The MCP tasks' changelist: read-only rows and two actions, cancel and retry now.

Nobody adds, changes or deletes a task here (a task is the API's, and MCP task states are
final). The actions, for users with ``mcp_tasks.operate_task`` (superusers have it), take the
store's paths, never the ORM's:

- **Cancel selected tasks**: what ``mcp-celery-tasks tasks cancel`` does, per task: the one
  cancel statement (``WorkerStore.admin_cancel``), then the broker wakes or revokes the job
  (``broker.operator.notify_cancelled``); the job stops at its next checkpoint. Finished tasks
  are counted and left alone.
- **Retry now**: a task waiting for a scheduled retry (``retry_at`` in the future) falls due at
  once (``WorkerStore.retry_now``, fenced to rows still waiting); the next release pass puts it
  back in line. Nothing else is touched: a failed task is never re-opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from mcp_celery_tasks.broker.operator import notify_cancelled
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore

from .models import Task

__all__ = ["TaskAdmin"]

logger = logging.getLogger("mcp_celery_tasks.contrib.django")

APPLICATION_NAME = "mcp-celery-tasks-django-admin"


class _Unusable(Exception):
    """The settings or the database failed; the admin shows ``str(self)``, the log the cause."""


@contextmanager
def _store() -> Iterator[tuple[Settings, WorkerStore]]:
    """The package's own store, from ``MCP_TASKS_*`` (the Django database may be read-only).

    Invalid settings and an unusable database become ``_Unusable``, with a message that names
    no URL or secret (the details go to the log)."""
    try:
        settings = Settings()
    except ValueError as exc:  # pydantic's ValidationError, or a *_FILE that cannot be read
        logger.warning("invalid MCP_TASKS_* settings: %s", exc)
        raise _Unusable("the MCP_TASKS_* settings are invalid (the server log says which)") from exc
    store = WorkerStore(settings, application_name=APPLICATION_NAME)
    try:
        yield settings, store
    except InfrastructureError as exc:
        logger.warning("the MCP tasks database cannot be used: %s", exc)
        raise _Unusable("the MCP tasks database cannot be used (the server log says why)") from exc
    finally:
        store.close()


_Action = Callable[[Any, HttpRequest, Any], None]


def _operator_action(description: str) -> Callable[[_Action], _Action]:
    """``admin.action`` for users with ``operate_task`` (typed: Django ships no hints)."""
    decorate: Callable[[_Action], _Action] = admin.action(description=description, permissions=("operate",))
    return decorate


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    """Read-only rows, newest first; the actions are the only way to change a task here."""

    list_display = ("task_id", "tool", "owner", "status", "status_message", "attempts", "retry_at",
                    "created_at", "last_updated_at")  # fmt: skip
    list_filter = ("status", "tool")
    search_fields = ("task_id", "owner", "tool", "job_id")
    ordering = ("-created_at",)
    list_per_page = 50
    actions = ("cancel_tasks", "retry_now")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in Task._meta.get_fields()]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Who may cancel and retry (the actions' ``allowed_permissions = ("operate",)``)."""
        return bool(request.user.has_perm("mcp_tasks.operate_task"))

    @_operator_action("Cancel selected tasks")
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Cancel the selected unfinished tasks, as ``mcp-celery-tasks tasks cancel`` does."""
        ids = list(queryset.values_list("task_id", flat=True))
        reason = f"cancelled by an operator ({request.user.get_username()}, Django admin)"
        cancelled, problems = 0, set[str]()
        try:
            with _store() as (settings, store):
                for task_id in ids:
                    outcome = store.admin_cancel(task_id, reason)
                    if not outcome.cancelled_now or outcome.job_id is None:
                        continue
                    cancelled += 1
                    # A broker that is down costs its timeout once, not once per selected task:
                    # the cancels are in Postgres, and the jobs see them at their next checkpoint.
                    if not problems:
                        problem = notify_cancelled(settings, outcome.job_id, outcome.wake_inbox)
                        if problem:
                            problems.add(problem)
        except _Unusable as exc:
            done = f" after cancelling {_plural(cancelled, 'task')}" if cancelled else ""
            self.message_user(request, f"Stopped{done}: {exc}.", messages.ERROR)
            return
        skipped = len(ids) - cancelled
        text = f"Cancelled {_plural(cancelled, 'task')}"
        if skipped:
            text += f"; {_plural(skipped, 'task')} already finished or cancelled, left as they were"
        self.message_user(request, text + ".", messages.SUCCESS if cancelled else messages.WARNING)
        if problems:
            self.message_user(
                request,
                f"The broker is unreachable ({'; '.join(sorted(problems))}): the tasks are cancelled "
                "and their jobs stop at their next checkpoint.",
                messages.WARNING,
            )

    @_operator_action("Retry now (tasks waiting for a scheduled retry)")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Make the selected tasks' waiting retries due now; every other task is left alone."""
        ids = list(queryset.values_list("task_id", flat=True))
        total = len(ids)
        try:
            with _store() as (_, store):
                done = store.retry_now(ids)  # fenced there: only retries still waiting
        except _Unusable as exc:
            self.message_user(request, f"Nothing was retried: {exc}.", messages.ERROR)
            return
        text = f"{_plural(len(done), 'task')} will retry now"
        if total - len(done):
            text += f"; {_plural(total - len(done), 'task')} not waiting for a retry, left as they were"
        self.message_user(request, text + ".", messages.SUCCESS if done else messages.WARNING)
