"""subscriptions/listen: task notifications pushed across API replicas."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp_types import jsonrpc as codes

from tests.support import Client, Proc, Stack, meta, start_api, wait_until

SUB = "io.modelcontextprotocol/subscriptionId"


@pytest.fixture(scope="module")
def second_api(stack: Stack) -> Iterator[str]:
    """Another API replica on the same database and broker."""
    proc: Proc
    proc, url = start_api("redis-api-replica", dict(stack.env))
    yield url
    proc.stop()


def listen(
    url: str, task_ids: list[str], *, extension: bool = True, request_id: int = 42, token: str | None = None
) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": task_ids}, "_meta": meta(extension)},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
        **({"Authorization": f"Bearer {token}"} if token else {}),
    }
    return httpx.post(url, json=body, headers=headers, timeout=60)


def stream_messages(url: str, task_ids: list[str], out: list[dict[str, Any]]) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": task_ids}, "_meta": meta()},
    }
    headers = {
        "Accept": "text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                out.append(json.loads(line[5:]))


def test_subscription_on_one_replica_sees_changes_made_through_another_and_the_worker(
    stack: Stack, second_api: str
) -> None:
    creator = Client(stack.url)
    task_id = creator.request(
        "tools/call",
        {"name": "confirm_delete", "arguments": {"filename": "p.txt"}, "_meta": meta(elicitation={})},
    ).result["taskId"]
    messages: list[dict[str, Any]] = []
    reader = threading.Thread(target=stream_messages, args=(second_api, [task_id, "not-a-task"], messages))
    reader.start()
    wait_until(lambda: any(m.get("params", {}).get("status") == "input_required" for m in messages), 20)
    key = next(m for m in messages if m.get("params", {}).get("status") == "input_required")["params"]
    answer = {next(iter(key["inputRequests"])): {"action": "accept", "content": {"confirm": True}}}
    assert creator.update(task_id, answer).status == 200  # through the other replica
    reader.join(30)
    assert not reader.is_alive()
    ack = messages[0]
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["taskIds"] == [task_id]  # the unknown id is not acknowledged
    notes = [m for m in messages[1:-1]]
    assert all(n["method"] == "notifications/tasks" and n["params"]["_meta"][SUB] == 7 for n in notes)
    statuses = [n["params"]["status"] for n in notes]
    assert statuses[-1] == "completed" and "input_required" in statuses
    assert statuses.index("input_required") < len(statuses) - 1
    assert notes[-1]["params"]["result"]["content"][0]["text"] == "Deleted p.txt"
    assert all("resultType" not in n["params"] for n in notes)
    assert messages[-1]["id"] == 7 and messages[-1]["result"]["resultType"] == "complete"
    assert messages[-1]["result"]["_meta"][SUB] == 7


def test_listen_without_the_extension_is_minus_32021(stack: Stack) -> None:
    response = listen(stack.url, ["x"], extension=False)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY


def test_listen_on_already_terminal_tasks_sends_their_state_and_ends(stack: Stack) -> None:
    client = Client(stack.url)
    task_id = client.start("noop")
    client.wait_status(task_id)
    response = listen(stack.url, [task_id])
    events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    assert [e.get("method") for e in events] == [
        "notifications/subscriptions/acknowledged",
        "notifications/tasks",
        None,
    ]
    assert events[1]["params"]["status"] == "completed"
    final = events[2]
    assert final["id"] == 42 and final["result"]["resultType"] == "complete"
    assert final["result"]["_meta"][SUB] == 42
    assert final["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-celery-tasks"
