"""MCP Tasks (SEP-2663) on Celery and Postgres: the public API for tool authors.

A tool module imports only what is listed here::

    from mcp_celery_tasks import TaskContext, ToolError, tool

    @tool(queue="gpu")
    def train(ctx: TaskContext, epochs: int = 3) -> str:
        for epoch in range(epochs):
            ctx.raise_if_cancelled()
            ctx.report(f"epoch {epoch + 1}/{epochs}")
        return "done"
"""

from mcp_celery_tasks.context import TaskContext, current_context
from mcp_celery_tasks.errors import InputNotSupported, InputTimedOut, McpError, TaskCancelled, ToolError
from mcp_celery_tasks.files import FileRoot
from mcp_celery_tasks.inputs import Elicit
from mcp_celery_tasks.registry import Mode, tool

__all__ = [
    "Elicit",
    "FileRoot",
    "InputNotSupported",
    "InputTimedOut",
    "McpError",
    "Mode",
    "TaskCancelled",
    "TaskContext",
    "ToolError",
    "current_context",
    "tool",
]
