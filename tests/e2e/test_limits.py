"""Limits: oversized arguments, too many subscriptions, and a public bind with auth off."""

from __future__ import annotations

import os
import subprocess
import sys

from mcp_types import jsonrpc as codes

from tests.support import ROOT, Client, Stack


def test_arguments_over_the_limit_are_refused_before_any_row_is_written(client: Client, stack: Stack) -> None:
    with stack.db() as conn:
        before = conn.execute("SELECT count(*) FROM mcp_tasks").fetchone()
    reply = client.call_tool("slow_compute", {"seconds": 0, "label": "x" * 300_000})
    assert reply.error["code"] == codes.INVALID_PARAMS
    assert "larger than" in reply.error["message"]
    with stack.db() as conn:
        assert conn.execute("SELECT count(*) FROM mcp_tasks").fetchone() == before


def test_serve_refuses_a_public_bind_with_auth_off() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    refused = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "Refusing to bind 0.0.0.0 with auth off" in refused.stderr
