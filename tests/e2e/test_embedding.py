"""MCP inside a team's own FastAPI service (``mount``), served by uvicorn as a real process
beside the suite's shared worker: the host's lifespan, routes, middleware and API keys keep
working, and MCP clients (ours and the official Python SDK) complete tasks through it, each
user seeing only their own; the admins' console mounted beside them keeps its own sign-in, CSRF
tokens and headers inside the host app."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import mcp_types
import psycopg
import pytest
from mcp import Client as SdkClient
from mcp.client.streamable_http import streamable_http_client

from tests import console_http, support
from tests.e2e.test_peers import check_ext_tasks_client
from tests.e2e.test_sdk_client import PollingTasks
from tests.sample_host.app import API_KEYS

ALICE, BOB = (key for key, _ in sorted(API_KEYS.items(), key=lambda item: item[1]))


@pytest.fixture(scope="module")
def host(stack: support.Stack) -> Iterator[str]:
    """The sample service on its own port, on the shared stack's database, broker and queues."""
    port = support.free_port()
    name = "sample-host"
    log = support.log_path(name)
    env = {**stack.env, "MCP_TASKS_CONSOLE_ADMIN_TOKENS": console_http.ADMINS}
    popen = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.sample_host.app:app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        env=env, cwd=support.ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    proc = support.Proc(name, popen, log)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if popen.poll() is not None:
            raise AssertionError(f"the sample host exited: {log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{base}/items/1", timeout=1).status_code == 401
        except httpx.HTTPError:
            return False

    try:
        support.wait_until(up, 30, 0.1, what="the sample host to answer")
        yield base
    finally:
        proc.stop()


def _client(host: str, key: str | None) -> support.Client:
    return support.Client(f"{host}/mcp", token=key)


def test_the_hosts_own_routes_lifespan_and_middleware_still_work(host: str) -> None:
    got = httpx.get(f"{host}/items/7", headers={"Authorization": f"Bearer {ALICE}"})
    assert got.status_code == 200, got.text
    assert got.json() == {"number": 7, "user": "user:alice", "greeting": "hello from the host"}
    assert got.headers["x-served-by"] == "sample-host"
    assert httpx.get(f"{host}/items/7").status_code == 401  # the host's own 401, its own format


def test_a_task_runs_through_the_mounted_endpoint_as_the_hosts_user(host: str, stack: support.Stack) -> None:
    alice = _client(host, ALICE)
    try:
        task_id = alice.start("slow_compute", {"seconds": 0.2, "label": "embedded"})
        done = alice.wait_status(task_id)
        assert done["status"] == "completed", done
        assert done["result"]["content"][0]["text"] == "done after 0.2s (embedded)"
    finally:
        alice.close()
    with psycopg.connect(stack.database_url) as conn:
        owner = conn.execute("SELECT owner FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert owner == ("user:alice",)
    bob = _client(host, BOB)
    try:
        assert bob.get(task_id).error["code"] == -32602  # another user's task is an unknown one
    finally:
        bob.close()


def test_without_the_hosts_credentials_mcp_answers_401(host: str) -> None:
    for key in (None, "not-a-key"):
        anonymous = _client(host, key)
        try:
            reply = anonymous.call_tool("greet", {"name": "x"})
        finally:
            anonymous.close()
        assert reply.status == 401, reply.body
        assert reply.body["error"]["code"] == -32600
        assert reply.headers["x-served-by"] == "sample-host"  # through the host's middleware
    # The host authenticates: no OAuth metadata of ours is published on its domain.
    assert httpx.get(f"{host}/.well-known/oauth-protected-resource").status_code == 404


async def test_the_official_sdk_client_completes_a_task_through_the_host(host: str) -> None:
    tasks = PollingTasks()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=30)
    transport = streamable_http_client(f"{host}/mcp", http_client=http)
    async with http, SdkClient(transport, extensions=[tasks]) as client:
        result = await client.call_tool("slow_compute", {"seconds": 0.3, "label": "sdk"})
    assert isinstance(text := result.content[0], mcp_types.TextContent), text
    assert text.text == "done after 0.3s (sdk)"
    assert tasks.created and tasks.polls[-1] == "completed"


def test_the_typescript_sdk_with_the_tasks_extension_completes_tasks_through_the_mount(
    host: str, ext_tasks: Path
) -> None:
    """@modelcontextprotocol/client with ext-tasks, with the host's API key: tasks, elicitation,
    sampling, a synchronous call and cancel, all through the mounted endpoint."""
    check_ext_tasks_client(ext_tasks, f"{host}/mcp", ALICE)


# ---- the console mounted in the host (mount(..., console="/admin/tasks")) -------------------

CONSOLE = "/admin/tasks"


def _job_of(stack: support.Stack, task_id: str) -> str:
    with psycopg.connect(stack.database_url) as conn:
        row = conn.execute("SELECT job_id FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_the_mounted_console_keeps_its_own_sign_in_and_headers(host: str) -> None:
    anonymous = httpx.get(f"{host}{CONSOLE}/tasks", timeout=10)
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == f"{CONSOLE}/login?next={CONSOLE}/tasks"
    assert anonymous.headers["x-served-by"] == "sample-host"  # through the host's middleware
    # The host's API key is a user's, not an admin's: the console does not take it.
    keyed = httpx.get(f"{host}{CONSOLE}/tasks", headers={"Authorization": f"Bearer {ALICE}"}, timeout=10)
    assert keyed.status_code == 401
    form = httpx.get(f"{host}{CONSOLE}/login", timeout=10)
    assert "frame-ancestors 'none'" in form.headers["content-security-policy"]
    assert f"path={CONSOLE}" in form.headers["set-cookie"].lower()
    # Its headers are its own responses': the host's routes keep theirs.
    item = httpx.get(f"{host}/items/3", headers={"Authorization": f"Bearer {ALICE}"}, timeout=10)
    assert item.status_code == 200
    assert not {"content-security-policy", "x-frame-options"} & set(item.headers)
    with console_http.sign_in(host, CONSOLE) as http:
        refused = http.post(f"{CONSOLE}/limits", data={"principal": "user:alice", "max_active_tasks": "0"})
        assert refused.status_code == 403 and "CSRF" in refused.text  # no token: nothing done
        # A sign-in may send the admin back into the console only, never to the host's pages.
        nonce = console_http.csrf_of(http, f"{CONSOLE}/login")
        back = http.post(
            f"{CONSOLE}/login",
            data={"csrf": nonce, "token": console_http.ADMIN_TOKEN, "next": f"{CONSOLE}/../../items/1"},
        )
        assert back.status_code == 303 and back.headers["location"] == f"{CONSOLE}/"


def test_an_admin_signs_in_to_the_mounted_console_sees_a_users_task_and_cancels_it(
    host: str, stack: support.Stack
) -> None:
    alice = _client(host, ALICE)
    try:
        task_id = alice.start("slow_compute", {"seconds": 60, "label": "hosted"})
        job = _job_of(stack, task_id)
        with console_http.sign_in(host, CONSOLE) as http:
            listed = http.get(f"{CONSOLE}/tasks", params={"owner": "user:alice", "job": job})
            assert listed.status_code == 200 and f'href="{CONSOLE}/tasks/{job}"' in listed.text
            assert listed.headers["x-served-by"] == "sample-host"
            page = f"{CONSOLE}/tasks/{job}"
            cancelled = http.post(f"{page}/cancel", data={"csrf": console_http.csrf_of(http, page)})
            assert cancelled.status_code == 303 and cancelled.headers["location"] == page
        assert alice.wait_status(task_id, timeout=60)["status"] == "cancelled"
    finally:
        alice.close()


def test_the_mounted_console_works_in_a_browser_under_the_hosts_middleware(
    host: str, stack: support.Stack
) -> None:
    """Chromium: the pages' script and styles load under the console's CSP at the host's path,
    the live stream updates the page, and the cancel button cancels."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    alice = _client(host, ALICE)
    try:
        task_id = alice.start("slow_compute", {"seconds": 60, "label": "in-the-browser"})
        job = _job_of(stack, task_id)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            try:
                tab = browser.new_context(base_url=host).new_page()
                refusals: list[str] = []
                tab.on(
                    "console",
                    lambda message: refusals.append(message.text) if "Refused" in message.text else None,
                )
                tab.goto(f"{CONSOLE}/tasks/{job}")
                assert tab.url.endswith(f"{CONSOLE}/login?next={CONSOLE}/tasks/{job}")
                tab.fill("input[name=token]", console_http.ADMIN_TOKEN)
                tab.click("button[type=submit]")
                tab.wait_for_url(f"**{CONSOLE}/tasks/{job}")
                sync_api.expect(tab.locator("#message")).to_contain_text("in-the-browser")
                tab.fill("#cancel input[name=reason]", "hosted admin")
                tab.click("#cancel button[type=submit]")
                sync_api.expect(tab.locator("#status")).to_have_text(re.compile("cancel"), timeout=10_000)
                assert refusals == []  # no script, style or stream refused by the policy
            finally:
                browser.close()
        assert alice.wait_status(task_id, timeout=60)["status"] == "cancelled"
    finally:
        alice.close()
