"""Synchronous calls relay what their job reports: ``notifications/progress`` for a request with
a ``progressToken`` and ``notifications/message`` at the level the caller asked for, in both
eras, on the call's own SSE stream; tasks never get either (SEP-2663 S-53). A synchronous call
whose job needs an undeclared input kind answers -32021 (HTTP 400) on 2026-07-28."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mcp_types import jsonrpc as codes

from tests.support import VERSION, Client, Stack, meta

LEGACY = "2025-11-25"
PROGRESS = "notifications/progress"
MESSAGE = "notifications/message"


def sse_messages(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.headers["content-type"].startswith("text/event-stream"), response.text
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def modern_call(
    client: Client,
    name: str,
    request_meta: dict[str, Any],
    accept: str = "application/json, text/event-stream",
) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": request_meta},
    }
    headers = {
        "Accept": accept,
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    return client.http.post(client.url, json=body, headers=headers, timeout=60)


def of(messages: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    return [m["params"] for m in messages if m.get("method") == method]


def test_modern_sync_call_with_a_progress_token_gets_each_step_then_its_result(client: Client) -> None:
    response = modern_call(client, "test_tool_with_progress", {**meta(False), "progressToken": "tok-1"})
    messages = sse_messages(response)
    steps = of(messages, PROGRESS)
    assert [s["progress"] for s in steps] == [0, 50, 100]
    assert all(s["progressToken"] == "tok-1" and s["total"] == 100 for s in steps)
    assert (
        messages[-1]["id"] == 7 and messages[-1]["result"]["content"][0]["text"] == "Progress test completed"
    )
    assert not of(messages, MESSAGE)  # no logLevel: MUST NOT send logs


def test_a_job_that_reports_only_messages_still_sends_progress(client: Client) -> None:
    # slow_compute reports "computing" without a number (ctx.report(message)): the caller that
    # asked for progress gets it with a counter, rising, and no total.
    response = modern_call(client, "slow_compute", {**meta(False), "progressToken": "tok-m"})
    messages = sse_messages(response)
    steps = of(messages, PROGRESS)
    assert steps, messages
    assert steps[0] == {"progressToken": "tok-m", "progress": 1, "message": "computing"}
    values = [s["progress"] for s in steps]
    assert values == sorted(set(values)) and all("total" not in s for s in steps)
    assert messages[-1]["result"]["content"][0]["text"] == "done after 1.0s"


def test_modern_sync_call_gets_logs_only_at_the_level_it_asked_for(client: Client) -> None:
    asked = modern_call(
        client, "test_tool_with_logging", {**meta(False), "io.modelcontextprotocol/logLevel": "info"}
    )
    logs = of(sse_messages(asked), MESSAGE)
    assert [entry["data"] for entry in logs] == [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ]
    assert {entry["level"] for entry in logs} == {"info"}
    stricter = modern_call(
        client, "test_tool_with_logging", {**meta(False), "io.modelcontextprotocol/logLevel": "error"}
    )
    plain = modern_call(client, "test_tool_with_logging", meta(False))
    for response in (stricter, plain):
        body = (
            sse_messages(response)
            if response.headers["content-type"].startswith("text/event")
            else [response.json()]
        )
        assert not of(body, MESSAGE) and body[-1]["result"]["content"][0]["text"] == "Logging test completed"


def test_an_unknown_log_level_is_refused(client: Client) -> None:
    response = modern_call(
        client, "test_simple_text", {**meta(False), "io.modelcontextprotocol/logLevel": "loud"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == codes.INVALID_PARAMS


def test_a_task_never_gets_progress_or_logs(client: Client, stack: Stack) -> None:
    ask = {**meta(True), "progressToken": "tok-2", "io.modelcontextprotocol/logLevel": "debug"}
    response = modern_call(client, "slow_compute", ask)
    created = response.json()["result"]
    assert response.headers["content-type"].startswith("application/json") and created["resultType"] == "task"
    assert stack.row(created["taskId"])["log_level"] is None


def test_modern_sync_call_needing_an_undeclared_input_kind_is_32021(client: Client) -> None:
    for accept in ("application/json", "application/json, text/event-stream"):
        response = modern_call(client, "test_input_required_result_list_roots", meta(False), accept=accept)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
        assert error["data"]["requiredCapabilities"] == {"roots": {}}


class Session:
    """A 2025-11-25 session over plain HTTP."""

    def __init__(self, url: str, capabilities: dict[str, Any] | None = None) -> None:
        self.url = url
        self.http = httpx.Client(timeout=60)
        hello = {
            "protocolVersion": LEGACY,
            "capabilities": capabilities or {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        init = self.post({"method": "initialize", "params": hello})
        self.session = init.headers["mcp-session-id"]
        self.capabilities = init.json()["result"]["capabilities"]

    def post(self, message: dict[str, Any]) -> httpx.Response:
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": LEGACY}
        if getattr(self, "session", None):
            headers["Mcp-Session-Id"] = self.session
        return self.http.post(self.url, json={"jsonrpc": "2.0", "id": 1, **message}, headers=headers)

    def stream(self, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        response = self.post({"method": method, "params": params})
        if response.headers["content-type"].startswith("application/json"):
            return [response.json()]
        return sse_messages(response)


@pytest.fixture
def session(stack: Stack) -> Any:
    opened = Session(stack.url)
    yield opened
    opened.http.close()


def test_legacy_session_declares_logging_and_accepts_set_level(session: Session) -> None:
    assert session.capabilities["logging"] == {}
    assert session.stream("logging/setLevel", {"level": "warning"})[-1]["result"] == {}
    refused = session.stream("logging/setLevel", {"level": "chatty"})[-1]
    assert refused["error"]["code"] == codes.INVALID_PARAMS


def test_legacy_sync_call_gets_progress_and_logs_at_the_session_level(session: Session) -> None:
    quiet = session.stream("tools/call", {"name": "test_tool_with_logging", "arguments": {}})
    assert not of(quiet, MESSAGE)  # no logging/setLevel yet
    session.stream("logging/setLevel", {"level": "debug"})
    logged = session.stream("tools/call", {"name": "test_tool_with_logging", "arguments": {}})
    assert of(logged, MESSAGE)[0]["data"] == "Tool execution started"
    assert len(of(logged, MESSAGE)) == 3 and "result" in logged[-1]
    progressed = session.stream(
        "tools/call", {"name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": 5}}
    )
    assert [s["progress"] for s in of(progressed, PROGRESS)] == [0, 50, 100]
    assert {s["progressToken"] for s in of(progressed, PROGRESS)} == {5}
    assert progressed[-1]["result"]["content"][0]["text"] == "Progress test completed"


def test_legacy_task_gets_no_progress_or_logs(session: Session) -> None:
    session.stream("logging/setLevel", {"level": "debug"})
    created = session.stream(
        "tools/call",
        {"name": "slow_compute", "arguments": {"seconds": 0.5}, "task": {}, "_meta": {"progressToken": "t"}},
    )
    assert len(created) == 1 and "task" in created[0]["result"]
