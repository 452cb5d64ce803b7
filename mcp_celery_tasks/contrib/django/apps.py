"""The app's configuration (``INSTALLED_APPS``: ``"mcp_celery_tasks.contrib.django"``)."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["McpTasksConfig"]


class McpTasksConfig(AppConfig):
    """The MCP tasks app: its one model is the ``mcp_tasks`` table, read-only."""

    name = "mcp_celery_tasks.contrib.django"
    label = "mcp_tasks"
    verbose_name = "MCP tasks"
    default_auto_field = "django.db.models.BigAutoField"
