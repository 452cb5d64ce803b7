"""Streamable HTTP 2026-07-28 over the live stack: routing headers, ``_meta``, error codes and
HTTP statuses, body limits, Origin, and the synchronous path over SSE."""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp_types import SERVER_INFO_META_KEY
from mcp_types import jsonrpc as codes

from tests import support
from tests.support import TASKS_EXT, VERSION, Client, Stack, meta, wait_until

RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
UNKNOWN_TASK = "Failed to retrieve task: Task not found"


# ---- helpers ---------------------------------------------------------------------------------


def envelope(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    extension: bool = True,
    request_id: int | None = 1,
) -> tuple[dict[str, Any], dict[str, str]]:
    """A well-formed request body and the headers that match it."""
    params = dict(params or {})
    params.setdefault("_meta", meta(extension))
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        body["id"] = request_id
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    if isinstance(name, str):
        headers["Mcp-Name"] = name
    return body, headers


def post(client: Client, body: Any, headers: dict[str, str], **kwargs: Any) -> httpx.Response:
    return client.http.post(client.url, json=body, headers=headers, **kwargs)


def row_count(stack: Stack) -> int:
    with stack.db() as conn:
        found = conn.execute("SELECT count(*) FROM mcp_tasks").fetchone()
    assert found is not None
    return int(found[0])


def without_meta(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "_meta"}


def assert_error(
    reply: support.Reply | httpx.Response, code: int, status: int | None = None
) -> dict[str, Any]:
    if isinstance(reply, httpx.Response):
        body = reply.json()
        http_status = reply.status_code
    else:
        body = reply.body
        http_status = reply.status
    assert "error" in body, f"expected an error, got {body} (HTTP {http_status})"
    assert "result" not in body
    assert body["error"]["code"] == code, body
    if status is not None:
        assert http_status == status, (http_status, body)
    error: dict[str, Any] = body["error"]
    return error


@pytest.fixture
def completed_task(client: Client) -> str:
    task_id = client.start("noop")
    assert client.wait_status(task_id)["status"] == "completed"
    return task_id


@pytest.fixture
def live_task(client: Client) -> Iterator[str]:
    task_id = client.start("slow_compute", {"seconds": 30, "label": "live"})
    yield task_id
    client.cancel(task_id)


# ---- routing headers -----------------------------------------------------------------------


def test_mcp_method_header_that_does_not_match_the_body_is_rejected(client: Client) -> None:
    reply = client.request("tools/list", headers={"Mcp-Method": "tools/call"})
    assert_error(reply, codes.HEADER_MISMATCH, 400)


def test_missing_mcp_method_header_is_a_header_mismatch(client: Client) -> None:
    body, headers = envelope("tools/list")
    del headers["Mcp-Method"]
    assert_error(post(client, body, headers), codes.HEADER_MISMATCH, 400)


def test_mcp_name_that_does_not_match_the_task_id_is_rejected(client: Client, live_task: str) -> None:
    reply = client.request("tasks/get", {"taskId": live_task}, name="some-other-task")
    assert_error(reply, codes.HEADER_MISMATCH, 400)


def test_base64_encoded_mcp_name_that_matches_is_accepted(client: Client, live_task: str) -> None:
    encoded = "=?base64?" + base64.b64encode(live_task.encode()).decode() + "?="
    reply = client.request("tasks/get", {"taskId": live_task}, name=encoded)
    assert reply.status == 200
    assert reply.result["taskId"] == live_task


def test_mcp_name_that_is_not_valid_base64_is_a_header_mismatch(client: Client, live_task: str) -> None:
    reply = client.request("tasks/get", {"taskId": live_task}, name="=?base64?***?=")
    assert_error(reply, codes.HEADER_MISMATCH, 400)


def test_missing_mcp_name_on_tools_call_is_a_header_mismatch(client: Client, stack: Stack) -> None:
    before = row_count(stack)
    body, headers = envelope("tools/call", {"name": "noop", "arguments": {}})
    del headers["Mcp-Name"]
    assert_error(post(client, body, headers), codes.HEADER_MISMATCH, 400)
    assert row_count(stack) == before


def test_missing_mcp_name_on_tasks_get_is_tolerated(client: Client, live_task: str) -> None:
    body, headers = envelope("tasks/get", {"taskId": live_task})
    del headers["Mcp-Name"]
    response = post(client, body, headers)
    assert response.status_code == 200
    assert response.json()["result"]["taskId"] == live_task


def test_protocol_version_header_that_differs_from_meta_is_a_header_mismatch(client: Client) -> None:
    reply = client.request("tools/list", headers={"MCP-Protocol-Version": "2025-11-25"})
    assert_error(reply, codes.HEADER_MISMATCH, 400)


def test_unsupported_protocol_version_names_the_supported_and_requested_ones(client: Client) -> None:
    params = {"_meta": {**meta(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}
    reply = client.request("tools/list", params, headers={"MCP-Protocol-Version": "2099-01-01"})
    error = assert_error(reply, codes.UNSUPPORTED_PROTOCOL_VERSION, 400)
    assert error["data"]["supported"] == [VERSION, "2025-11-25", "2025-06-18", "2025-03-26"]
    assert error["data"]["requested"] == "2099-01-01"


def test_request_without_meta_is_invalid_params(client: Client) -> None:
    reply = client.request("tools/list", with_meta=False)
    assert_error(reply, codes.INVALID_PARAMS, 400)


# ---- methods -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["no/such-method", "tasks/result", "tasks/list"])
def test_unknown_and_removed_methods_are_method_not_found_with_http_404(client: Client, method: str) -> None:
    params = {"taskId": "whatever"} if method == "tasks/result" else {}
    reply = client.request(method, params)
    assert_error(reply, codes.METHOD_NOT_FOUND, 404)


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_tasks_methods_without_the_extension_are_missing_capability(
    client: Client, live_task: str, method: str
) -> None:
    params: dict[str, Any] = {"taskId": live_task}
    if method == "tasks/update":
        params["inputResponses"] = {}
    reply = client.request(method, params, extension=False)
    error = assert_error(reply, codes.MISSING_REQUIRED_CLIENT_CAPABILITY, 400)
    assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}}
    # ...and the refused cancel left the task alone.
    assert client.get(live_task).result["status"] == "working"


def test_unknown_task_id_is_invalid_params_with_one_message_for_get_update_and_cancel(
    client: Client,
) -> None:
    task_id = secrets.token_urlsafe(24)
    errors = [
        assert_error(client.get(task_id), codes.INVALID_PARAMS),
        assert_error(client.update(task_id, {}), codes.INVALID_PARAMS),
        assert_error(client.cancel(task_id), codes.INVALID_PARAMS),
    ]
    assert {e["message"] for e in errors} == {UNKNOWN_TASK}


def test_cancelling_a_completed_task_answers_the_same_empty_ack(client: Client, completed_task: str) -> None:
    first = client.cancel(completed_task).result
    second = client.cancel(completed_task).result
    assert without_meta(first) == {"resultType": "complete"}
    assert without_meta(second) == {"resultType": "complete"}
    assert client.get(completed_task).result["status"] == "completed"


def test_update_with_a_key_that_is_not_outstanding_is_acknowledged(client: Client, live_task: str) -> None:
    reply = client.update(live_task, {"not-a-key": {"action": "accept", "content": {}}})
    assert reply.status == 200
    assert without_meta(reply.result) == {"resultType": "complete"}
    assert client.get(live_task).result["status"] == "working"


# ---- the JSON-RPC envelope -----------------------------------------------------------------


def test_invalid_json_is_a_parse_error_with_http_400(client: Client) -> None:
    _, headers = envelope("tools/list")
    response = client.http.post(client.url, content=b'{"jsonrpc": "2.0", "id": 1,', headers=headers)
    error = assert_error(response, codes.PARSE_ERROR, 400)
    assert response.json()["id"] is None
    assert error["message"]


def test_body_that_is_not_utf8_is_a_parse_error(client: Client) -> None:
    _, headers = envelope("tools/list")
    response = client.http.post(client.url, content=b"\xff\xfe{}", headers=headers)
    assert_error(response, codes.PARSE_ERROR, 400)


def test_a_batch_is_an_invalid_request(client: Client) -> None:
    body, headers = envelope("tools/list")
    assert_error(post(client, [body], headers), codes.INVALID_REQUEST, 400)


def test_a_notification_is_accepted_with_http_202_and_no_body(client: Client) -> None:
    body, headers = envelope("notifications/cancelled", {"requestId": 1}, request_id=None)
    response = post(client, body, headers)
    assert response.status_code == 202
    assert response.content == b""


@pytest.mark.parametrize("verb", ["GET", "DELETE"])
def test_get_and_delete_on_the_endpoint_are_method_not_allowed(client: Client, verb: str) -> None:
    response = client.http.request(verb, client.url)
    assert response.status_code == 405
    assert "POST" in response.headers["allow"]


def test_delete_of_an_unknown_2025_session_is_404(client: Client) -> None:
    # DELETE ends a 2025-11-25 session (the handshake era); an unknown one is 404.
    response = client.http.request("DELETE", client.url, headers={"Mcp-Session-Id": "no-such-session"})
    assert response.status_code == 404


@pytest.fixture(scope="module")
def small_body_api(stack: Stack) -> Iterator[str]:
    """A second API on the stack's database and queues with a 2000-byte body limit."""
    env = dict(stack.env, MCP_TASKS_MAX_BODY_BYTES="2000")
    proc, url = support.start_api(f"small-body-api-{uuid.uuid4().hex[:8]}", env)
    try:
        yield url
    finally:
        proc.stop()


def test_body_over_the_limit_is_rejected_with_413_and_creates_no_task(
    stack: Stack, small_body_api: str
) -> None:
    small = Client(small_body_api)
    try:
        # Under the limit the same API works (and shares the stack's rows).
        fits = small.call_tool("slow_compute", {"seconds": 0, "label": "fits"})
        assert small.wait_status(fits.result["taskId"])["status"] == "completed"
        before = row_count(stack)
        reply = small.call_tool("slow_compute", {"seconds": 0, "label": "x" * 5000})
        assert_error(reply, codes.INVALID_REQUEST, 413)
        assert row_count(stack) == before
        # Without a Content-Length (chunked) the limit holds while reading.
        body, headers = envelope("tools/call", {"name": "slow_compute", "arguments": {"label": "y" * 5000}})
        raw = json.dumps(body).encode()
        chunks = iter([raw[i : i + 500] for i in range(0, len(raw), 500)])
        response = small.http.post(small.url, content=chunks, headers=headers)
        assert "content-length" not in response.request.headers
        assert_error(response, codes.INVALID_REQUEST, 413)
        assert row_count(stack) == before
    finally:
        small.close()


# ---- Origin --------------------------------------------------------------------------------


def test_foreign_origin_is_forbidden(client: Client) -> None:
    reply = client.request("tools/list", headers={"Origin": "http://evil.example"})
    assert reply.status == 403


def test_loopback_origin_is_accepted(client: Client) -> None:
    reply = client.request("tools/list", headers={"Origin": "http://localhost:1234"})
    assert reply.status == 200
    assert reply.result["tools"]


@pytest.mark.parametrize(
    "accept", ["text/html", "text/html,application/xhtml+xml;q=0.9", "application/json;q=0"]
)
def test_an_accept_header_that_names_neither_json_nor_sse_is_406(client: Client, accept: str) -> None:
    body, headers = envelope("tools/list")
    headers["Accept"] = accept
    response = post(client, body, headers)
    assert response.status_code == 406, response.text
    assert response.json()["error"]["code"] == codes.INVALID_REQUEST
    for served in ("*/*", "application/*", "text/event-stream;q=0.5, text/html"):
        headers["Accept"] = served
        assert post(client, body, headers).status_code == 200, served
    del headers["Accept"]  # no header: anything is acceptable (RFC 9110)
    assert post(client, body, headers).status_code == 200


# ---- tools/call ----------------------------------------------------------------------------


def test_invalid_tool_arguments_are_a_tool_error_naming_the_field_and_write_no_row(
    client: Client, stack: Stack
) -> None:
    before = row_count(stack)
    result = client.call_tool("slow_compute", {"seconds": "x"}).result
    assert result["isError"] is True and result["resultType"] == "complete" and "taskId" not in result
    assert "seconds" in result["content"][0]["text"]
    assert row_count(stack) == before


def test_unknown_argument_names_are_refused_with_the_valid_ones(client: Client, stack: Stack) -> None:
    before = row_count(stack)
    result = client.call_tool("slow_compute", {"secs": 1}).result
    text = result["content"][0]["text"]
    assert result["isError"] is True
    assert "'secs'" in text and "seconds" in text and "label" in text
    assert row_count(stack) == before


def test_a_cursor_on_tools_list_is_refused(client: Client) -> None:
    assert_error(client.request("tools/list", {"cursor": "bogus"}), codes.INVALID_PARAMS)


def test_tool_task_mode_is_under_our_own_meta_prefix(client: Client) -> None:
    tools = {tool["name"]: tool for tool in client.request("tools/list").result["tools"]}
    assert tools["failing_job"]["_meta"] == {"io.github.mcp-celery-tasks/taskSupport": "required"}
    for tool in tools.values():
        assert not any(key.startswith("io.modelcontextprotocol/") for key in tool.get("_meta", {}))


def test_unknown_tool_is_invalid_params(client: Client, stack: Stack) -> None:
    before = row_count(stack)
    error = assert_error(client.call_tool("no_such_tool"), codes.INVALID_PARAMS)
    assert "no_such_tool" in error["message"]
    assert row_count(stack) == before


def test_legacy_task_param_on_a_forbidden_tool_is_ignored(client: Client) -> None:
    reply = client.request(
        "tools/call", {"name": "greet", "arguments": {"name": "Ada"}, "task": {"ttl": 1000}}
    )
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert "taskId" not in reply.result
    assert reply.result["content"] == [{"type": "text", "text": "Hello, Ada!"}]


def test_discover_advertises_the_tasks_extension_and_no_legacy_tasks_capability(client: Client) -> None:
    result = client.request("server/discover").result
    capabilities = result["capabilities"]
    assert capabilities["extensions"][TASKS_EXT] == {}
    assert "tasks" not in capabilities
    assert VERSION in result["supportedVersions"]


def test_every_result_carries_result_type_and_server_info(client: Client, completed_task: str) -> None:
    # The synchronous call first: it needs a free worker slot, and the live task below holds one.
    replies = {
        "server/discover": client.request("server/discover"),
        "tools/list": client.request("tools/list"),
        "tools/call (sync)": client.call_tool("greet", {"name": "Ada"}),
    }
    live = client.start("slow_compute", {"seconds": 30, "label": "meta"})
    try:
        replies |= {
            "tools/call (task)": client.call_tool("noop"),
            "tasks/get": client.get(completed_task),
            "tasks/update": client.update(live, {}),
            "tasks/cancel": client.cancel(live),
        }
    finally:
        client.cancel(live)
    for label, reply in replies.items():
        result = reply.result
        assert result.get("resultType") in ("complete", "task"), label
        info = result.get("_meta", {}).get(SERVER_INFO_META_KEY)
        assert info and info["name"] and "version" in info, (label, result)


def test_completed_task_has_no_request_state_and_no_related_task_meta(
    client: Client, completed_task: str
) -> None:
    task = client.get(completed_task).result
    assert task["status"] == "completed"
    assert "requestState" not in task
    assert RELATED_TASK_META_KEY not in task.get("_meta", {})
    assert "requestState" not in task["result"]
    assert RELATED_TASK_META_KEY not in task["result"].get("_meta", {})


# ---- the synchronous path: SSE keep-alive and cancel on close ---------------------------------


def test_slow_synchronous_call_over_sse_sends_keep_alives_then_the_result(client: Client) -> None:
    body, headers = envelope(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 3.5}}, extension=False
    )
    headers["Accept"] = "text/event-stream, application/json"
    response = post(client, body, headers, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    assert ": keep-alive" in text
    assert text.index(": keep-alive") < text.index("data:")
    result = support.parse_body(response)["result"]
    assert result["resultType"] == "complete"
    assert result["content"][0]["text"] == "done after 3.5s"


def test_closing_the_sse_stream_of_a_synchronous_call_cancels_its_task(client: Client, stack: Stack) -> None:
    label = f"sse-close-{uuid.uuid4().hex[:8]}"
    body, headers = envelope(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 20, "label": label}}, extension=False
    )
    headers["Accept"] = "text/event-stream"
    with client.http.stream("POST", client.url, json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith(": keep-alive"):
                break
    # The response is closed before the result arrived: the server must cancel the task.

    def newest_slow_compute() -> dict[str, Any] | None:
        with stack.db() as conn:
            found = conn.execute(
                "SELECT status, arguments ->> 'label' FROM mcp_tasks WHERE tool_name = 'slow_compute' "
                "ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
        assert found is not None and found[1] == label, found
        return {"status": found[0]} if found[0] == "cancelled" else None

    wait_until(newest_slow_compute, 15, 0.1, what="the closed stream's task to be cancelled")


def test_synchronous_call_with_json_only_accept_answers_json(client: Client) -> None:
    body, headers = envelope(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.6}}, extension=False
    )
    headers["Accept"] = "application/json"
    response = post(client, body, headers, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    result = response.json()["result"]
    assert result["resultType"] == "complete"
    assert result["content"][0]["text"] == "done after 0.6s"
