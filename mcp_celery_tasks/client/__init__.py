"""The terminal client: a small SEP-2663 client (``protocol``) and ``mcp-celery-tasks call``/``tools``
with its answer forms and views."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_celery_tasks.client.protocol import (
        ClientError,
        InvalidUrl,
        RpcError,
        ServerUnavailable,
        TasksClient,
        TaskStore,
        Unauthorized,
        parse_reply,
    )

__all__ = [
    "ClientError",
    "InvalidUrl",
    "RpcError",
    "ServerUnavailable",
    "TaskStore",
    "TasksClient",
    "Unauthorized",
    "parse_reply",
]

if not TYPE_CHECKING:  # ``from mcp_celery_tasks.client import TasksClient``, as before the tree

    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.protocol"), name)
        globals()[name] = value
        return value
