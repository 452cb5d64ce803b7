"""The ``mcp_tasks`` table as Django sees it: unmanaged, read-only, the columns admins look at.

The table belongs to the package's migrations (``mcp-celery-tasks migrate``): Django never creates
or alters it (``managed = False``) and never writes it: ``save`` and ``delete`` refuse, so the
Django database user may be a read-only one. Changes go through the store
(``admin.TaskAdmin``'s actions).
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import models

__all__ = ["Task"]


class ReadOnlyError(TypeError):
    """A ``Task`` row was about to be written through the ORM."""


class Task(models.Model):
    """One MCP task (a row of ``mcp_tasks``); its status is one of the spec's five."""

    task_id = models.TextField(primary_key=True)
    job_id = models.TextField(unique=True)
    tool = models.TextField(db_column="tool_name")
    owner = models.TextField(help_text="The principal that created the task, e.g. token:alice")
    status = models.TextField()
    status_message = models.TextField(null=True, blank=True)
    queue = models.TextField()
    attempts = models.IntegerField()
    max_attempts = models.IntegerField()
    retry_at = models.DateTimeField(
        null=True, blank=True, help_text="A retry waits in the backlog until this time"
    )
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    worker = models.TextField(null=True, blank=True)
    progress = models.FloatField(null=True, blank=True)
    progress_total = models.FloatField(null=True, blank=True)
    error_kind = models.TextField(null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField()
    last_updated_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        managed = False
        db_table = "mcp_tasks"
        ordering = ("-created_at",)
        verbose_name = "MCP task"
        verbose_name_plural = "MCP tasks"
        default_permissions = ("view",)
        permissions = (("operate_task", "Can cancel MCP tasks and retry them now"),)

    def __str__(self) -> str:
        return f"{self.tool} {self.task_id} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyError("mcp_tasks is read-only in Django: use the admin's actions (the store)")

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyError("mcp_tasks is read-only in Django: tasks expire by their retention")
