"""The HTTP edge and the API process's composition: the server, request intake, authentication,
the uvicorn process, ``compose`` (settings in, running services out), and ``mount`` (the MCP
endpoint inside a team's own FastAPI or Starlette app, ``embed``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_celery_tasks.api.embed import mount

__all__ = ["mount"]


def __getattr__(name: str) -> Any:
    # Lazy: ``mcp_celery_tasks.api.*`` modules are imported by the CLI without FastAPI's cost.
    if name == "mount":
        from mcp_celery_tasks.api.embed import mount

        return mount
    raise AttributeError(name)
