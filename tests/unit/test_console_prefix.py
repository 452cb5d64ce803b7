"""The console under any path prefix: what a prefix may be, where a sign-in may send the admin
back to under it (no open redirect, no host page beside it), and the routes, links and cookie
path built from it, answered by the real routes over ASGI (no server)."""

from __future__ import annotations

import hashlib
import re

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request

from mcp_celery_tasks.console import console_routes
from mcp_celery_tasks.console.http import next_path, prefix_of
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.settings import Settings

TOKEN = "the-admin-token-0123456789"


def test_a_prefix_is_plain_path_segments_or_the_root() -> None:
    assert prefix_of("/") == "" and prefix_of("") == ""
    assert prefix_of("/admin/tasks/") == "/admin/tasks" and prefix_of("/console") == "/console"
    for bad in ("admin", "//", "/a//b", "/a/../b", "/./a", "/a b", "/a?x", "/a#x", '/a"', "/<b>", "/a%2e"):
        with pytest.raises(ValueError, match="console path"):
            prefix_of(bad)


@pytest.mark.parametrize("prefix", ["", "/console", "/admin/tasks"])
def test_after_sign_in_only_a_path_of_this_console_is_followed(prefix: str) -> None:
    home = f"{prefix}/"
    assert next_path(f"{prefix}/tasks?status=failed&owner=token%3Aa", prefix) == (
        f"{prefix}/tasks?status=failed&owner=token%3Aa"
    )
    for elsewhere in (
        "https://evil.example/",
        "//evil.example/",
        f"{prefix}x",
        f"{prefix}/\\evil",
        f"{prefix}/\t/evil.example",  # a browser drops the tab: //evil.example
        f"{prefix}/\n/evil.example",
        f"{prefix}/ /x",
        f"{prefix}/../outside",
        f"{prefix}/%2e%2e/outside",
        f"{prefix}/%2E./outside",
        f"{prefix}/tasks/%2f%2fevil.example",
        f"{prefix}/tasks#frag",
        f"{prefix}/tasks?x=<script>",
        "/\\evil.example",
        "",
        None,
    ):
        assert next_path(elsewhere, prefix) == home, elsewhere


def _app(prefix: str) -> Starlette:
    settings = Settings(console_admin_tokens={"ops": hashlib.sha256(TOKEN.encode()).hexdigest()})

    def no_services(request: Request) -> Services:
        raise AssertionError("these requests read no task")

    return Starlette(routes=console_routes(settings, lambda token: False, no_services, prefix=prefix))


@pytest.mark.parametrize(
    ("prefix", "at"), [("/", ""), ("/admin/tasks/", "/admin/tasks"), ("/console", "/console")]
)
async def test_the_pages_links_redirects_and_cookies_follow_the_prefix(prefix: str, at: str) -> None:
    transport = httpx.ASGITransport(app=_app(prefix))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as http:
        anonymous = await http.get(f"{at}/tasks")
        assert anonymous.status_code == 303
        assert anonymous.headers["location"] == f"{at}/login?next={at}/tasks"
        form = await http.get(f"{at}/login")
        assert form.status_code == 200
        assert f'action="{at}/login"' in form.text and f'src="{at}/static/console.js"' in form.text
        assert f"path={at or '/'};" in form.headers["set-cookie"].lower() + ";"
        nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert nonce is not None
        signed = await http.post(
            f"{at}/login", data={"csrf": nonce.group(1), "token": TOKEN, "next": f"{at}/audit"}
        )
        assert signed.status_code == 303 and signed.headers["location"] == f"{at}/audit"
        session = next(c for c in signed.headers.get_list("set-cookie") if c.startswith("mcp_console="))
        assert f"path={at or '/'};" in session.lower() + ";"
        script = await http.get(f"{at}/static/console.js")
        assert script.status_code == 200 and "EventSource" in script.text
        if at:
            assert (await http.get(at)).headers["location"] == f"{at}/"
            assert (await http.get("/login")).status_code == 404  # nothing outside the prefix
