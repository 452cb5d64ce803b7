"""The console over plain HTTP, for the tests that start it as a process (the ``console``
command) or inside a host app: an admin's token and settings, starting the command on a free
port, signing in, and a page's CSRF token."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterator

import httpx

from tests import support

ADMIN_TOKEN = "console-http-admin-" + "y" * 20
ADMINS = json.dumps({"ops": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()})
"""``MCP_TASKS_CONSOLE_ADMIN_TOKENS`` for ``ADMIN_TOKEN`` (admin ``ops``)."""


def start_console(name: str, env: dict[str, str], *args: str) -> tuple[support.Proc, str, int]:
    """``mcp-celery-tasks console`` on a free port (``args``: more flags); (process, base URL,
    port) once its sign-in form answers."""
    port = support.free_port()
    proc = support.spawn(name, ["console", "--port", str(port), "--log-level", "info", *args], env)
    base = f"http://127.0.0.1:{port}"
    path = next((args[i + 1] for i, arg in enumerate(args) if arg == "--path"), "").rstrip("/")

    def up() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{name} exited: {proc.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{base}{path}/login", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    support.wait_until(up, 30, 0.1, what=f"{name} to answer")
    return proc, base, port


@contextlib.contextmanager
def sign_in(base: str, prefix: str = "") -> Iterator[httpx.Client]:
    """An admin's session (the form's nonce cookie, then the session cookie) at ``prefix``."""
    with httpx.Client(base_url=base, timeout=30) as http:
        form = http.get(f"{prefix}/login")
        nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert nonce is not None, form.text
        signed = http.post(
            f"{prefix}/login", data={"csrf": nonce.group(1), "token": ADMIN_TOKEN, "next": f"{prefix}/tasks"}
        )
        assert signed.status_code == 303 and signed.headers["location"] == f"{prefix}/tasks", signed.text
        yield http


def csrf_of(http: httpx.Client, path: str) -> str:
    """The CSRF token of the forms on the page at ``path``."""
    found = re.search(r'name="csrf" value="([^"]+)"', http.get(path).text)
    assert found is not None
    return found.group(1)
