"""``mount`` and the host's principal, without services: what it refuses and what it adds
(tests/e2e/test_embedding.py serves a real host app)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from mcp_celery_tasks.api import mount
from mcp_celery_tasks.api.auth import Authenticator, Unauthorized
from mcp_celery_tasks.api.gate import MAX_PRINCIPAL_CHARS, Gate
from mcp_celery_tasks.settings import Settings


def _request() -> Request:
    return Request({"type": "http", "headers": [], "method": "POST", "path": "/mcp"})


@pytest.mark.parametrize("path", ["mcp", "/", "/mcp/", ""])
def test_a_mount_path_must_be_a_plain_absolute_path(path: str) -> None:
    with pytest.raises(ValueError, match="mount path"):
        mount(FastAPI(), path, settings=Settings())


def test_an_app_serves_the_endpoint_once() -> None:
    app = FastAPI()
    mount(app, settings=Settings())
    with pytest.raises(RuntimeError, match="already serves"):
        mount(app, "/other", settings=Settings())


def test_the_routes_come_first_and_metadata_only_without_the_hosts_auth() -> None:
    host = Starlette(routes=[Route("/{anything:path}", lambda request: None)])  # a catch-all
    mount(host, "/tools/mcp", settings=Settings())
    paths = [getattr(route, "path", None) for route in host.router.routes]
    assert paths[:3] == ["/tools/mcp"] * 3 and paths[-1] == "/{anything:path}"
    assert "/.well-known/oauth-protected-resource/tools/mcp" in paths  # RFC 9728 path-inserted form
    with_auth = FastAPI()
    mount(with_auth, settings=Settings(), principal=lambda request: "user:1")
    assert not [
        p for r in with_auth.router.routes if (p := getattr(r, "path", "")).startswith("/.well-known")
    ]


@pytest.mark.parametrize(
    "given", [None, "", 42, "x" * (MAX_PRINCIPAL_CHARS + 1), "user\x1b]0;pwned\x07", "a\nb"]
)
def test_a_hosts_principal_that_is_not_a_printable_bounded_string_is_refused(given: object) -> None:
    gate = Gate(Authenticator(Settings()), principal_of=lambda request: given)  # type: ignore[arg-type,return-value]
    with pytest.raises(Unauthorized):
        asyncio.run(gate.principal(_request(), None))


def test_a_hosts_principal_may_come_from_a_coroutine() -> None:
    async def principal_of(request: Request) -> str:
        return "user:42"

    gate = Gate(Authenticator(Settings()), principal_of=principal_of)
    assert asyncio.run(gate.principal(_request(), "Bearer ignored")) == "user:42"


@pytest.mark.parametrize("console", ["/", "", "/mcp", "/mcp/admin", "admin", "/a/../b", "/<x>"])
def test_a_mounted_console_needs_a_path_of_its_own(console: str) -> None:
    with pytest.raises(ValueError, match="console path"):
        mount(FastAPI(), "/mcp", settings=Settings(), console=console)


def test_a_mounted_console_comes_before_a_catch_all_of_the_host() -> None:
    host = Starlette(routes=[Route("/{anything:path}", lambda request: None)])
    mount(host, "/mcp", settings=Settings(), console="/admin/tasks/")
    paths = [getattr(route, "path", None) for route in host.router.routes]
    assert paths[0] == "/admin/tasks" and "/admin/tasks/tasks/{job_id}/cancel" in paths
    assert paths.index("/admin/tasks/login") < paths.index("/{anything:path}")
