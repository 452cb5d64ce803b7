"""A team's own FastAPI service with MCP added under ``/mcp`` (``mcp_celery_tasks.api.mount``).

It keeps what such a service already has: its own lifespan (and lifespan state), routes, HTTP
middleware and API keys. The MCP endpoint takes the caller's identity from the same API keys,
so a user's tasks are theirs in MCP too; the admins' console sits at ``/admin/tasks`` (admins
sign in with ``MCP_TASKS_CONSOLE_ADMIN_TOKENS``, not the API keys). Served by ``uvicorn
tests.sample_host.app:app`` with the ``MCP_TASKS_*`` settings in the environment; its tool jobs
run on the usual workers.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response

from mcp_celery_tasks.api import mount

API_KEYS = {"alice-key-0123456789": "user:alice", "bob-key-0123456789": "user:bob"}
"""The team's own API keys (a real service keeps them in its database)."""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    yield {"greeting": "hello from the host"}


app = FastAPI(lifespan=lifespan)


def user_of(request: Request) -> str | None:
    """The service's own authentication: ``Authorization: Bearer <API key>``."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return next((user for known, user in API_KEYS.items() if hmac.compare_digest(key, known)), None)


def require_user(request: Request) -> str:
    user = user_of(request)
    if user is None:
        raise HTTPException(401, "an API key is required")
    return user


@app.middleware("http")
async def tag_responses(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    response = await call_next(request)
    response.headers["x-served-by"] = "sample-host"
    return response


@app.get("/items/{number}")
async def item(number: int, request: Request, user: str = Depends(require_user)) -> dict[str, Any]:
    return {"number": number, "user": user, "greeting": request.state.greeting}


mount(app, "/mcp", principal=user_of, console="/admin/tasks")
