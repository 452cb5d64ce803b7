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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mcp_celery_tasks import _moved

if TYPE_CHECKING:
    from mcp_celery_tasks.errors import (
        CheckpointTooLarge,
        InputNotSupported,
        InputTimedOut,
        McpError,
        SoftTimeLimitExceeded,
        StepOrderError,
        StepResultError,
        TaskCancelled,
        ToolError,
    )
    from mcp_celery_tasks.tools.context import TaskContext, current_context, get_current_context
    from mcp_celery_tasks.tools.files import FileRoot
    from mcp_celery_tasks.tools.inputs import Elicit
    from mcp_celery_tasks.tools.registry import Mode, tool
    from mcp_celery_tasks.tools.retries import exponential, fixed

__all__ = [
    "CheckpointTooLarge",
    "Elicit",
    "FileRoot",
    "InputNotSupported",
    "InputTimedOut",
    "McpError",
    "Mode",
    "SoftTimeLimitExceeded",
    "StepOrderError",
    "StepResultError",
    "TaskCancelled",
    "TaskContext",
    "ToolError",
    "current_context",
    "exponential",
    "fixed",
    "get_current_context",
    "tool",
]

# Each public name's module, imported on first use: every ``mcp_celery_tasks.*`` import runs this
# file first, and the terminal client (``mcp-celery-tasks call``, ``--help``) must start without
# pydantic and mcp-types. ``from mcp_celery_tasks import tool`` works as if imported here.
_HOMES = {
    "TaskContext": "tools.context",
    "current_context": "tools.context",
    "get_current_context": "tools.context",
    "InputNotSupported": "errors",
    "InputTimedOut": "errors",
    "McpError": "errors",
    "SoftTimeLimitExceeded": "errors",
    "StepOrderError": "errors",
    "StepResultError": "errors",
    "CheckpointTooLarge": "errors",
    "TaskCancelled": "errors",
    "ToolError": "errors",
    "Elicit": "tools.inputs",
    "FileRoot": "tools.files",
    "Mode": "tools.registry",
    "tool": "tools.registry",
    "exponential": "tools.retries",
    "fixed": "tools.retries",
}

_moved.install()  # the flat paths of 0.1 still import, with a warning (``_moved``)

if not TYPE_CHECKING:  # type checkers see the imports above; a typo stays a type error

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
