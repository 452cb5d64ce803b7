"""What a tool declares and knows. Declared input requests (``needs_inputs``): a client that cannot
answer them is told so at the call (-32021 naming the capability), before any job runs, on both
protocol revisions; a client that can answer gets its task as usual. And ``ctx.is_task``."""

from __future__ import annotations

import httpx
import psycopg

from tests.support import Client, Stack, meta, parse_body

TOOL = "t_needs_elicitation"


def _rows(stack: Stack) -> int:
    with psycopg.connect(stack.database_url) as conn:
        found = conn.execute("SELECT count(*) FROM mcp_tasks WHERE tool_name = %s", (TOOL,)).fetchone()
    assert found is not None
    return int(found[0])


def test_a_client_that_cannot_answer_is_refused_before_a_job_runs(stack: Stack, client: Client) -> None:
    before = _rows(stack)
    refused = client.call_tool(TOOL)  # declares the tasks extension only
    assert refused.status == 400
    assert refused.error["code"] == -32021
    assert refused.error["data"]["requiredCapabilities"] == {"elicitation": {}}
    assert "elicitation" in refused.error["message"]
    assert _rows(stack) == before  # no task, no job


def test_a_client_that_can_answer_gets_its_task(stack: Stack, client: Client) -> None:
    reply = client.request("tools/call", {"name": TOOL, "arguments": {}, "_meta": meta(elicitation={})})
    task_id = reply.result["taskId"]
    asked = client.wait_status(task_id, ("input_required",))
    key = next(iter(asked["inputRequests"]))
    client.update(task_id, {key: {"action": "accept", "content": {"ok": True}}})
    assert client.wait_status(task_id)["result"]["content"][0]["text"] == "answered accept"


def test_a_2025_session_without_elicitation_is_refused_too(stack: Stack) -> None:
    http = httpx.Client(timeout=30)
    base = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    try:
        init = http.post(
            stack.url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=base
        )
        session = {**base, "Mcp-Session-Id": init.headers["mcp-session-id"]}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": TOOL, "arguments": {}}}
        body = parse_body(http.post(stack.url, json=call, headers=session))
    finally:
        http.close()
    assert body["error"]["code"] == -32021 and body["error"]["data"]["requiredCapabilities"] == {
        "elicitation": {}
    }


def test_a_tool_knows_whether_it_runs_as_a_task(client: Client) -> None:
    task_id = client.start("t_is_task")
    assert client.wait_status(task_id)["result"]["content"][0]["text"] == "task"
    plain = client.call_tool("t_is_task", extension=False)
    assert plain.result["content"][0]["text"] == "synchronous"
