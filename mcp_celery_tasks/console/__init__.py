"""The admins' web console: an overview, the task list, each task's detail (live), actions,
limits and the audit of console actions. Server-rendered, no build step; admins sign in with a
console token (``security``).

Its routes (``console_routes``) sit under any path prefix (``http``): ``/console`` of the API
when ``console_enabled`` is set (``api.server``), the root of its own port under
``mcp-celery-tasks console`` (``api.consoleserver``), or a host app's path under
``mount(app, "/mcp", console="/admin/tasks")`` (``api.embed``). Its admin writes go through
``console_database_url`` when set (``Services.console_writes``)."""

from mcp_celery_tasks.console.pages import PREFIX, console_routes

__all__ = ["PREFIX", "console_routes"]
