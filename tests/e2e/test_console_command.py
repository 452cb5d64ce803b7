"""``mcp-celery-tasks console``: the admins' console alone on its own port, as a real process
beside the shared stack (its API creates the tasks, its worker runs them): an admin signs in
over HTTP, sees a task the API made, follows it live and cancels it; no MCP endpoint is served
there; it listens on loopback unless told otherwise, and refuses to start with no admin."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from mcp_celery_tasks.console.throttle import LIMIT
from tests import support
from tests.console_http import ADMIN_TOKEN, ADMINS, csrf_of, sign_in, start_console

pytestmark = pytest.mark.timeout(180)


def _env(stack: support.Stack, **extra: str) -> dict[str, str]:
    return {**stack.env, "MCP_TASKS_CONSOLE_ADMIN_TOKENS": ADMINS, **extra}


@pytest.fixture(scope="module")
def console(stack: support.Stack) -> Iterator[tuple[str, int, Path]]:
    proc, base, port = start_console("console-command", _env(stack))
    try:
        yield base, port, proc.log
    finally:
        proc.stop()


def job_of(database_url: str, task_id: str) -> str:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT job_id FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _listening_addresses(port: int) -> set[str]:
    """The local addresses with a socket listening on ``port`` (Linux: /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_the_console_command_listens_on_loopback_by_default(console: tuple[str, int, Path]) -> None:
    _, port, log = console
    assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, and nothing else
    assert "beyond this machine" not in log.read_text()


def test_an_admin_sees_and_cancels_a_task_the_api_made(
    console: tuple[str, int, Path], stack: support.Stack
) -> None:
    base, _, _ = console
    client = stack.client()
    task_id = client.start("slow_compute", {"seconds": 60, "label": "seen-by-the-console"})
    job = job_of(stack.database_url, task_id)
    with sign_in(base) as http:
        listed = http.get("/tasks", params={"job": job})
        assert listed.status_code == 200 and f'href="/tasks/{job}"' in listed.text, listed.text
        assert listed.headers["content-security-policy"].startswith("default-src 'self'")
        detail = http.get(f"/tasks/{job}")
        assert detail.status_code == 200 and "seen-by-the-console" in detail.text
        assert task_id not in detail.text  # the bearer-like task id stays in the server
        with http.stream("GET", f"/tasks/{job}/live") as live:  # the event hub runs here too
            assert live.headers["content-type"].startswith("text/event-stream")
            first = next(live.iter_lines())
        assert first == "event: state"
        cancelled = http.post(
            f"/tasks/{job}/cancel",
            data={"csrf": csrf_of(http, f"/tasks/{job}"), "reason": "from the console"},
        )
        assert cancelled.status_code == 303 and cancelled.headers["location"] == f"/tasks/{job}"
        done = client.wait_status(task_id, timeout=60)
        assert done["status"] == "cancelled", done
        audit = http.get("/audit")
        assert "admin:ops" in audit.text and f'href="/tasks/{job}"' in audit.text
    client.close()


def test_no_mcp_endpoint_is_served_by_the_console(console: tuple[str, int, Path]) -> None:
    base, _, _ = console
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    assert httpx.post(base + "/mcp", json=call, timeout=10).status_code == 404
    assert httpx.get(base + "/healthz", timeout=10).status_code == 404
    assert httpx.get(base + "/metrics", timeout=10).status_code == 404
    assert httpx.get(base + "/.well-known/oauth-protected-resource", timeout=10).status_code == 404


def test_the_console_command_sits_under_a_path_behind_a_proxy(stack: support.Stack) -> None:
    proc, base, _ = start_console("console-command-path", _env(stack), "--path", "/ops/console/")
    try:
        with sign_in(base, "/ops/console") as http:
            page = http.get("/ops/console/tasks")
            assert page.status_code == 200 and 'src="/ops/console/static/console.js"' in page.text
        assert httpx.get(base + "/tasks", timeout=10).status_code == 404
    finally:
        proc.stop()


def test_behind_a_trusted_proxy_failed_sign_ins_count_per_forwarded_client(stack: support.Stack) -> None:
    """As ``serve``: the forwarded address is believed from ``MCP_TASKS_TRUSTED_PROXIES`` only, so
    one client's failures lock out that client, not everyone behind the proxy."""
    env = _env(stack, MCP_TASKS_TRUSTED_PROXIES='["127.0.0.1/32"]')
    proc, base, _ = start_console("console-command-proxy", env)
    try:

        def attempt(client: str, token: str = "wrong-token") -> int:
            headers = {"Authorization": f"Bearer {token}", "X-Forwarded-For": client}
            return httpx.get(f"{base}/tasks", headers=headers, timeout=10).status_code

        assert [attempt("203.0.113.7") for _ in range(LIMIT)] == [401] * LIMIT
        assert attempt("203.0.113.7") == 429
        assert attempt("203.0.113.7", ADMIN_TOKEN) == 429  # the right token too, while held back
        assert attempt("203.0.113.8", ADMIN_TOKEN) == 200  # another client behind the same proxy
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"MCP_TASKS_CONSOLE_ADMIN_TOKENS": "{}"},
            "MCP_TASKS_CONSOLE_ADMIN_TOKENS is empty: nobody could sign in",
        ),
        ({"MCP_TASKS_CONSOLE_ADMIN_TOKENS": '{"ops": "plain-token"}'}, "SHA-256 hex digest"),
    ],
)
def test_the_console_command_refuses_to_start_without_a_usable_admin(
    stack: support.Stack, extra: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "console", "--port", str(support.free_port())],
        env=_env(stack, **extra), cwd=support.ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("console: ") and message in line, line
    assert "plain-token" not in done.stderr


def test_a_bad_path_is_refused_in_one_line(stack: support.Stack) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "console", "--path", "/a/../b"],
        env=_env(stack), cwd=support.ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("console: console path must be"), done.stderr
