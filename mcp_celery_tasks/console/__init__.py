"""The admins' web console, served by the API at ``/console`` when ``console_enabled`` is set:
an overview, the task list, each task's detail (live) and the audit of console actions.
Server-rendered, no build step; admins sign in with a console token (``security``)."""

from mcp_celery_tasks.console.pages import PREFIX, console_routes

__all__ = ["PREFIX", "console_routes"]
