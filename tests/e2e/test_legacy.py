"""2025-11-25 clients on the same endpoint: a real Python SDK 1.30 client, and one test per
row of SPEC-CHECKLIST §4 (SEP-1686 vs SEP-2663) over plain HTTP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_types import jsonrpc as codes

from tests.support import ROOT, Client, Stack, parse_body, wait_until

PEER = ROOT / ".cache" / "peers-mcp1"
LEGACY = "2025-11-25"


@pytest.fixture(scope="session")
def mcp1_python() -> str:
    python = PEER / "bin" / "python"
    if not python.exists():
        made = (
            subprocess.run(
                [sys.executable, "-m", "venv", str(PEER)], capture_output=True, text=True, timeout=120
            ).returncode
            == 0
            and subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "mcp==1.30.0"],
                capture_output=True,
                text=True,
                timeout=600,
            ).returncode
            == 0
        )
        if not made:
            if os.environ.get("CI") == "true":
                pytest.fail("could not install the mcp 1.30 client")
            pytest.skip("could not install the mcp 1.30 client")
    return str(python)


def test_python_sdk_1_30_client_calls_tools_sync_with_elicitation_and_as_sep_1686_tasks(
    stack: Stack, mcp1_python: str
) -> None:
    run = subprocess.run(
        [mcp1_python, str(ROOT / "tests" / "e2e" / "legacy" / "mcp1_client.py"), stack.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    steps = {
        s["step"]: s for s in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    }
    assert "cancel-terminal" in steps, run.stderr[-3000:]
    assert steps["initialized"] == {"step": "initialized", "version": LEGACY, "tasks": True}
    assert (
        steps["tools"]["modes"]["greet"] == "forbidden"
        and steps["tools"]["modes"]["failing_job"] == "required"
    )
    assert steps["sync"]["text"] == "Hello, legacy!"
    assert steps["elicited"]["message"] == "Delete old.txt?"
    assert steps["sync-with-elicitation"]["text"] == "Deleted old.txt"
    assert steps["sync-with-progress"]["steps"] == [[0, 100], [50, 100], [100, 100]]
    assert steps["sync-with-logs"]["logs"] == [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ]
    assert steps["created"] == {"step": "created", "status": "working", "ttl": 60000, "poll": 200}
    assert steps["polled"]["statuses"][-1] == "completed"
    assert steps["result"]["text"] == "done after 0.5s"
    assert steps["listed"]["contains"] is True
    assert steps["cancelled"]["status"] == "cancelled"
    assert steps["cancel-terminal"]["error"] == codes.INVALID_PARAMS


class Legacy:
    """A plain 2025-11-25 client: initialize, then requests with the session header."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=60)
        self.ids = 0
        hello = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        init = self.post({"method": "initialize", "params": hello})
        self.session = init.headers["mcp-session-id"]
        self.init = parse_body(init)["result"]

    def post(self, message: dict[str, Any], session: bool = False) -> httpx.Response:
        self.ids += 1
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": LEGACY}
        if session:
            headers["Mcp-Session-Id"] = self.session
        return self.http.post(self.url, json={"jsonrpc": "2.0", "id": self.ids, **message}, headers=headers)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return parse_body(self.post({"method": method, "params": params or {}}, session=True))


@pytest.fixture
def legacy(stack: Stack) -> Iterator[Legacy]:
    client = Legacy(stack.url)
    yield client
    client.http.close()


def test_row_handshake_initialize_vs_discover(legacy: Legacy, client: Client) -> None:
    assert legacy.init["protocolVersion"] == LEGACY
    assert "supportedVersions" in client.request("server/discover").result


def test_row_server_capability_tasks_slot_only_in_the_legacy_era(legacy: Legacy, client: Client) -> None:
    assert legacy.init["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    modern = client.request("server/discover").result["capabilities"]
    assert "tasks" not in modern and "io.modelcontextprotocol/tasks" in modern["extensions"]


def test_row_tool_level_flag_execution_task_support(legacy: Legacy, client: Client) -> None:
    legacy_tools = {t["name"]: t for t in legacy.call("tools/list")["result"]["tools"]}
    assert legacy_tools["slow_compute"]["execution"] == {"taskSupport": "optional"}
    modern_tools = {t["name"]: t for t in client.request("tools/list").result["tools"]}
    assert "execution" not in modern_tools["slow_compute"]


def test_row_who_decides_and_the_creation_shape(legacy: Legacy, client: Client) -> None:
    sync = legacy.call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}})
    assert "task" not in sync["result"] and sync["result"]["content"]  # no params.task: synchronous
    nested = legacy.call(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}, "task": {"ttl": 5000}}
    )
    task = nested["result"]["task"]
    assert {"ttl", "pollInterval"} <= set(task) and task["ttl"] == 5000 and "ttlMs" not in task
    flat = client.call_tool("slow_compute", {"seconds": 0}).result
    assert flat["resultType"] == "task" and "task" not in flat and "ttlMs" in flat


def test_row_result_retrieval_tasks_result_vs_inlined(legacy: Legacy, client: Client) -> None:
    created = legacy.call("tools/call", {"name": "noop", "arguments": {}, "task": {}})["result"]["task"]
    result = legacy.call("tasks/result", {"taskId": created["taskId"]})["result"]
    assert result["content"][0]["text"] == "ok"
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": created["taskId"]}
    assert client.request("tasks/result", {"taskId": "x"}).error["code"] == codes.METHOD_NOT_FOUND
    modern = client.wait_status(client.start("noop"))
    assert "io.modelcontextprotocol/related-task" not in (modern["result"].get("_meta") or {})


def test_row_tasks_list_scoped_and_paginated_vs_removed(legacy: Legacy, client: Client) -> None:
    created = legacy.call("tools/call", {"name": "noop", "arguments": {}, "task": {}})["result"]["task"]
    listed = legacy.call("tasks/list")["result"]
    assert created["taskId"] in [t["taskId"] for t in listed["tasks"]]
    if "nextCursor" in listed:
        assert "tasks" in legacy.call("tasks/list", {"cursor": listed["nextCursor"]})["result"]
    assert client.request("tasks/list").error["code"] == codes.METHOD_NOT_FOUND


def test_tasks_list_never_shows_another_clients_tasks(legacy: Legacy, stack: Stack, client: Client) -> None:
    # Auth is off on this stack: every client is "anon". Another session's task and a task made
    # on the 2026-07-28 endpoint stay out of this session's list.
    other = Legacy(stack.url)
    theirs = other.call("tools/call", {"name": "noop", "arguments": {}, "task": {}})["result"]["task"]
    modern = client.start("noop")
    mine = legacy.call("tools/call", {"name": "noop", "arguments": {}, "task": {}})["result"]["task"]
    listed = [t["taskId"] for t in legacy.call("tasks/list")["result"]["tasks"]]
    assert mine["taskId"] in listed
    assert theirs["taskId"] not in listed and modern not in listed
    assert [t["taskId"] for t in other.call("tasks/list")["result"]["tasks"]] == [theirs["taskId"]]
    other.http.close()


def test_tasks_list_leaves_out_plain_synchronous_calls(legacy: Legacy) -> None:
    # A plain tools/call runs as a row too; the TypeScript SDK listed 8 "tasks" where it made 4.
    synchronous = legacy.call("tools/call", {"name": "noop", "arguments": {}})["result"]
    assert synchronous["content"][0]["text"] == "ok"
    created = legacy.call("tools/call", {"name": "noop", "arguments": {}, "task": {}})["result"]["task"]
    again = legacy.call("tools/call", {"name": "noop", "arguments": {}})["result"]
    assert again["content"][0]["text"] == "ok"
    # A fresh session: exactly the one task it asked for, not the three rows it caused.
    assert [t["taskId"] for t in legacy.call("tasks/list")["result"]["tasks"]] == [created["taskId"]]


def test_a_request_without_its_session_is_told_to_initialize(legacy: Legacy) -> None:
    # Not the 2026-07-28 "-32020 Missing Mcp-Method": a header this revision does not know.
    for message in (
        {"method": "tools/list", "params": {}},
        {"method": "tools/call", "params": {"name": "noop"}},
    ):
        reply = legacy.post(message)  # MCP-Protocol-Version 2025-11-25, no Mcp-Session-Id
        body = parse_body(reply)
        assert reply.status_code == 400 and body["error"]["code"] == codes.INVALID_REQUEST, body
        assert "Mcp-Session-Id" in body["error"]["message"] and "initialize" in body["error"]["message"]
    # With its session the same request is served.
    assert "tools" in legacy.call("tools/list")["result"]


def test_a_progress_token_in_meta_is_accepted(legacy: Legacy) -> None:
    reply = legacy.call("tools/call", {"name": "noop", "arguments": {}, "_meta": {"progressToken": "p-1"}})
    assert reply["result"]["content"][0]["text"] == "ok"


def test_row_cancel_returns_the_task_and_refuses_terminal_vs_ack(legacy: Legacy, client: Client) -> None:
    spun = legacy.call("tools/call", {"name": "spin", "arguments": {"seconds": 30}, "task": {}})["result"][
        "task"
    ]
    cancelled = legacy.call("tasks/cancel", {"taskId": spun["taskId"]})["result"]
    assert cancelled["status"] == "cancelled" and cancelled["taskId"] == spun["taskId"]
    again = legacy.call("tasks/cancel", {"taskId": spun["taskId"]})
    assert again["error"]["code"] == codes.INVALID_PARAMS
    done = client.wait_status(client.start("noop"))
    assert client.cancel(done["taskId"]).result["resultType"] == "complete"


def test_row_tool_error_fails_the_task_vs_completed_is_error(legacy: Legacy, client: Client) -> None:
    created = legacy.call("tools/call", {"name": "failing_job", "arguments": {}, "task": {}})["result"][
        "task"
    ]
    task_id = created["taskId"]
    wait_until(lambda: legacy.call("tasks/get", {"taskId": task_id})["result"]["status"] != "working", 20)
    failed = legacy.call("tasks/get", {"taskId": task_id})["result"]
    assert failed["status"] == "failed"
    assert "on purpose" in failed["statusMessage"]  # SEP-1686: a failed task SHOULD say why
    assert client.wait_status(client.start("failing_job"))["status"] == "completed"


def test_row_required_tool_without_a_task(legacy: Legacy, client: Client) -> None:
    assert (
        legacy.call("tools/call", {"name": "failing_job", "arguments": {}})["error"]["code"]
        == codes.METHOD_NOT_FOUND
    )
    assert (
        client.call_tool("failing_job", extension=False).error["code"]
        == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    )


def test_row_unknown_task_is_minus_32602_in_both_eras(legacy: Legacy, client: Client) -> None:
    assert legacy.call("tasks/get", {"taskId": "nope"})["error"]["code"] == codes.INVALID_PARAMS
    assert client.get("nope").error["code"] == codes.INVALID_PARAMS


def test_modern_tasks_get_on_a_legacy_task_keeps_sep_2663_shapes(legacy: Legacy, client: Client) -> None:
    created = legacy.call("tools/call", {"name": "noop", "arguments": {}, "task": {}})["result"]["task"]
    modern = client.wait_status(created["taskId"])
    assert modern["resultType"] == "complete" and "ttlMs" in modern and "ttl" not in modern


def test_deleting_the_session_ends_it(legacy: Legacy) -> None:
    deleted = legacy.http.delete(legacy.url, headers={"Mcp-Session-Id": legacy.session})
    assert deleted.status_code == 200
    assert legacy.post({"method": "tools/list"}, session=True).status_code == 404


@pytest.fixture(scope="session")
def ts_sdk1() -> Path:
    """The TypeScript SDK 1.32.2 (SEP-1686 client) from npm, with our driver script beside it."""
    folder = ROOT / ".cache" / "ts-sdk1"
    if not (folder / "node_modules" / "@modelcontextprotocol" / "sdk").exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_text('{"name": "ts-sdk1", "version": "1.0.0", "type": "module"}')
        installed = (
            shutil.which("npm") is not None
            and subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "@modelcontextprotocol/sdk@1.32.2"],
                cwd=folder,
                capture_output=True,
                timeout=600,
            ).returncode
            == 0
        )
        if not installed:
            if os.environ.get("CI") == "true":
                pytest.fail("could not install @modelcontextprotocol/sdk@1.32.2")
            pytest.skip("npm could not install @modelcontextprotocol/sdk@1.32.2")
    shutil.copy(ROOT / "tests" / "e2e" / "legacy" / "ts_sdk1_client.mjs", folder / "client.mjs")
    return folder


def test_typescript_sdk_1_32_client_streams_a_sep_1686_task_and_hears_progress_and_logs(
    stack: Stack, ts_sdk1: Path
) -> None:
    run = subprocess.run(
        ["node", "client.mjs", stack.url, "slow_compute", '{"seconds": 0.5}'],
        cwd=ts_sdk1,
        capture_output=True,
        text=True,
        timeout=120,
    )
    steps = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert steps and steps[0]["step"] == "connected", run.stderr[-2000:]
    assert steps[0]["tasks"]["requests"] == {"tools": {"call": {}}}
    kinds = [s["step"] for s in steps]
    assert kinds[1] == "taskCreated" and "taskStatus" in kinds
    assert {"step": "result", "text": "done after 0.5s"} in steps
    by_step = {s["step"]: s for s in steps}
    assert by_step["progress"]["steps"] == [[0, 100], [50, 100], [100, 100]]
    assert by_step["logs"]["logs"] == [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ]
    # The message-only reports of slow_compute reach onprogress, with a rising counter.
    reported = by_step["message-progress"]
    assert reported["text"] == "done after 0.6s" and reported["messages"], reported
    assert [m for _, m in reported["messages"]] == ["computing"] * len(reported["messages"])
    counters = [n for n, _ in reported["messages"]]
    assert counters == sorted(set(counters))
    # One task and three synchronous calls on this session: tasks/list shows the one task.
    assert by_step["list"] == {"step": "list", "tasks": 1}


def test_sessions_expire_are_capped_and_bound_what_a_client_declares(stack: Stack) -> None:
    import json as _json

    from tests.support import Proc, start_api

    env = dict(
        stack.env,
        MCP_TASKS_SESSION_IDLE_SECONDS="1",
        MCP_TASKS_MAX_SESSIONS_PER_PRINCIPAL="2",
        MCP_TASKS_MAX_CLIENT_INFO_BYTES="2000",
        MCP_TASKS_AUTH_TOKENS=_json.dumps({"carol": "carol-token"}),
    )
    proc: Proc
    proc, url = start_api("session-limits-api", env)
    try:
        headers = {"Authorization": "Bearer carol-token"}

        def initialize(capabilities: dict[str, Any]) -> httpx.Response:
            hello = {
                "protocolVersion": LEGACY,
                "capabilities": capabilities,
                "clientInfo": {"name": "t", "version": "0"},
            }
            body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
            return httpx.post(url, json=body, headers={"Accept": "application/json", **headers}, timeout=30)

        huge = initialize({"experimental": {"x": "y" * 5000}})
        assert parse_body(huge)["error"]["code"] == codes.INVALID_PARAMS and huge.status_code == 200
        first, second = initialize({}), initialize({})
        assert "mcp-session-id" in first.headers and "mcp-session-id" in second.headers
        third = parse_body(initialize({}))
        assert third["error"]["code"] == -32001 and third["error"]["data"]["limit"] == "sessions"
        # Idle past MCP_TASKS_SESSION_IDLE_SECONDS: the session is gone (404, initialize again).
        time.sleep(1.5)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {}}
        session = {"Mcp-Session-Id": first.headers["mcp-session-id"], "MCP-Protocol-Version": LEGACY}
        stale = httpx.post(url, json=ping, timeout=30, headers={**session, **headers})
        assert stale.status_code == 404
        assert "mcp-session-id" in initialize({}).headers  # expired sessions no longer count
    finally:
        proc.stop()
