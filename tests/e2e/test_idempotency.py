"""Idempotent ``tools/call`` on the real server: a key in ``params._meta`` names one task per
principal, for tasks and synchronous calls of both revisions; runs are counted in files the tool
writes (tests/fixtures/idempotent.py), not in the database the feature itself writes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient
from mcp_types import TextContent
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.wire import IDEMPOTENCY_KEY_META_KEY as KEY
from tests import support
from tests.support import LOG_DIR, ROOT, Client, Stack, meta, parse_body, wait_until

TOKENS = {"alice": "alice-token", "bob": "bob-token"}
TOOLS = '["tests.fixtures.conformance", "tests.fixtures.idempotent"]'
LEGACY = "2025-11-25"
QUOTA_EXCEEDED = -32001


@pytest.fixture(scope="module")
def keyed(template_db: str) -> Iterator[Stack]:
    name = f"mcpt_idem_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name, template=template_db)
    runs = LOG_DIR.parent / f"runs-idem-{uuid.uuid4().hex[:6]}"
    runs.mkdir(parents=True)
    extra = {"MCP_TASKS_TOOL_MODULES": TOOLS, "MCP_TEST_RUNS_DIR": str(runs)}
    suffix = f"i{uuid.uuid4().hex[:6]}"
    with support.running_stack("idem", dsn, support.REDIS_URL, suffix, concurrency=2, **extra) as stack:
        yield stack
    support.drop_database(name)


@pytest.fixture(scope="module")
def auth_url(keyed: Stack) -> Iterator[str]:
    """A second API replica with bearer tokens, on the same database and queues."""
    proc, url = support.start_api(
        f"idem-auth-{uuid.uuid4().hex[:6]}", dict(keyed.env, MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS))
    )
    try:
        yield url
    finally:
        proc.stop()


def runs_of(stack: Stack, marker: str) -> int:
    path = Path(stack.env["MCP_TEST_RUNS_DIR"]) / marker
    return len(path.read_text().splitlines()) if path.exists() else 0


def call(
    client: Client, key: object, arguments: dict[str, Any], *, tool: str = "counted", tasked: bool = True
) -> support.Reply:
    params = {"name": tool, "arguments": arguments, "_meta": {**meta(tasked), KEY: key}}
    return client.request("tools/call", params, timeout=60)


def rows_with(stack: Stack, key: str) -> list[tuple[Any, ...]]:
    with stack.db() as conn:
        return conn.execute(
            "SELECT task_id, owner FROM mcp_tasks WHERE idempotency_key = %s ORDER BY owner", (key,)
        ).fetchall()


class Legacy:
    """A plain 2025-11-25 client: initialize, then requests on the session."""

    def __init__(self, url: str) -> None:
        self.url, self.http, self.ids = url, httpx.Client(timeout=60), 0
        hello = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        init = self._post({"method": "initialize", "params": hello}, None)
        self.session = init.headers["mcp-session-id"]

    def _post(self, message: dict[str, Any], session: str | None) -> httpx.Response:
        self.ids += 1
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": LEGACY}
        if session:
            headers["Mcp-Session-Id"] = session
        return self.http.post(self.url, json={"jsonrpc": "2.0", "id": self.ids, **message}, headers=headers)

    def call_tool(self, key: object, arguments: dict[str, Any], *, task: bool) -> dict[str, Any]:
        params: dict[str, Any] = {"name": "counted", "arguments": arguments, "_meta": {KEY: key}}
        if task:
            params["task"] = {}
        return parse_body(self._post({"method": "tools/call", "params": params}, self.session))


def test_fifty_concurrent_calls_with_one_key_make_one_task_and_one_run(keyed: Stack) -> None:
    key, marker = f"k-{uuid.uuid4()}", uuid.uuid4().hex
    clients = [keyed.client() for _ in range(50)]
    try:
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            replies = list(pool.map(lambda c: call(c, key, {"marker": marker, "ms": 200}), clients))
    finally:
        for c in clients:
            c.close()
    task_ids = {reply.result["taskId"] for reply in replies}
    assert len(task_ids) == 1, replies[0].body
    (task_id,) = task_ids
    with closing(keyed.client()) as client:
        assert client.wait_status(task_id)["status"] == "completed"
    assert rows_with(keyed, key) == [(task_id, "anon")]
    assert runs_of(keyed, marker) == 1


def test_two_principals_with_one_key_get_two_tasks(keyed: Stack, auth_url: str) -> None:
    key, marker = f"shared-{uuid.uuid4()}", uuid.uuid4().hex
    alice, bob = Client(auth_url, token=TOKENS["alice"]), Client(auth_url, token=TOKENS["bob"])
    try:
        a = call(alice, key, {"marker": marker, "ms": 0}).result["taskId"]
        b = call(bob, key, {"marker": marker, "ms": 0}).result["taskId"]
        assert a != b
        assert call(alice, key, {"marker": marker, "ms": 0}).result["taskId"] == a
        assert alice.wait_status(a)["status"] == "completed" and bob.wait_status(b)["status"] == "completed"
        # Bob's key reveals nothing of Alice's task, and vice versa.
        assert bob.get(a).error["code"] == codes.INVALID_PARAMS
    finally:
        alice.close()
        bob.close()
    assert [owner for _, owner in rows_with(keyed, key)] == ["token:alice", "token:bob"]
    assert runs_of(keyed, marker) == 2


def test_a_key_reused_with_other_arguments_or_another_tool_is_invalid_params(keyed: Stack) -> None:
    key, marker = f"reuse-{uuid.uuid4()}", uuid.uuid4().hex
    with closing(keyed.client()) as client:
        task_id = call(client, key, {"marker": marker, "ms": 0}).result["taskId"]
        other = call(client, key, {"marker": marker, "ms": 1}).error
        assert other["code"] == codes.INVALID_PARAMS and "other arguments" in other["message"]
        assert other["data"] == {"taskId": task_id, "mismatch": "arguments"}
        tool = call(client, key, {"marker": marker, "ms": 0}, tool="counted_other").error
        assert tool["code"] == codes.INVALID_PARAMS and "another tool ('counted'" in tool["message"]
        # The same call again, with its arguments in another order, is the same call.
        assert call(client, key, {"ms": 0, "marker": marker}).result["taskId"] == task_id
        client.wait_status(task_id)
    assert runs_of(keyed, marker) == 1


def test_a_synchronous_call_retried_with_its_key_returns_the_same_result_and_runs_once(keyed: Stack) -> None:
    key, marker = f"sync-{uuid.uuid4()}", uuid.uuid4().hex
    arguments = {"marker": marker, "ms": 1500}
    with closing(keyed.client()) as first, closing(keyed.client()) as second:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(call, first, key, arguments, tasked=False)
            wait_until(lambda: runs_of(keyed, marker) == 1, 30, 0.05, what="the first run to start")
            retried = call(second, key, arguments, tasked=False)  # while the first still waits
            original = pending.result()
        again = call(second, key, arguments, tasked=False)  # after it ended
    assert original.result["content"] == [{"type": "text", "text": f"ran {marker}"}]
    assert retried.result["content"] == original.result["content"] == again.result["content"]
    assert len(rows_with(keyed, key)) == 1
    assert runs_of(keyed, marker) == 1


def test_both_revisions_replay_tasks_and_synchronous_calls(keyed: Stack) -> None:
    legacy = Legacy(keyed.url)
    try:
        key, marker = f"legacy-task-{uuid.uuid4()}", uuid.uuid4().hex
        first = legacy.call_tool(key, {"marker": marker, "ms": 0}, task=True)["result"]["task"]
        second = legacy.call_tool(key, {"marker": marker, "ms": 0}, task=True)["result"]["task"]
        assert first["taskId"] == second["taskId"]
        sync_key, sync_marker = f"legacy-sync-{uuid.uuid4()}", uuid.uuid4().hex
        answers = [legacy.call_tool(sync_key, {"marker": sync_marker, "ms": 0}, task=False) for _ in range(2)]
        assert answers[0]["result"]["content"] == answers[1]["result"]["content"]
        assert answers[0]["result"]["content"][0]["text"] == f"ran {sync_marker}"
        mismatch = legacy.call_tool(sync_key, {"marker": sync_marker, "ms": 5}, task=False)
        assert mismatch["error"]["code"] == codes.INVALID_PARAMS
    finally:
        legacy.http.close()
    # One key names one task whichever revision retries it: a modern retry finds the legacy task.
    with closing(keyed.client()) as client:
        assert call(client, key, {"marker": marker, "ms": 0}).result["taskId"] == first["taskId"]
        client.wait_status(first["taskId"])
    assert runs_of(keyed, marker) == 1 and runs_of(keyed, sync_marker) == 1


@pytest.mark.parametrize(
    "bad", ["", "x" * 256, 42, None, ["k"], "line\nbreak", "tab\there", "caf\u00e9", "\x7f", "\u2028"]
)
def test_a_bad_key_is_invalid_params_in_both_revisions(keyed: Stack, bad: object) -> None:
    marker = uuid.uuid4().hex
    with closing(keyed.client()) as client:
        for tasked in (True, False):
            error = call(client, bad, {"marker": marker, "ms": 0}, tasked=tasked).error
            assert error["code"] == codes.INVALID_PARAMS and KEY in error["message"], error
        # A NUL never gets this far: every request string with one is refused (-32600).
        nul = call(client, "nul\x00", {"marker": marker, "ms": 0}).error
        assert nul["code"] in (codes.INVALID_REQUEST, codes.INVALID_PARAMS), nul
    legacy = Legacy(keyed.url)
    try:
        reply = legacy.call_tool(bad, {"marker": marker, "ms": 0}, task=True)
        assert reply["error"]["code"] == codes.INVALID_PARAMS
    finally:
        legacy.http.close()
    assert runs_of(keyed, marker) == 0


def test_the_longest_key_and_every_printable_character_are_accepted(keyed: Stack) -> None:
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    with closing(keyed.client()) as client:
        for key in ("y" * 255, printable + uuid.uuid4().hex):
            task_id = call(client, key, {"marker": uuid.uuid4().hex, "ms": 0}).result["taskId"]
            client.wait_status(task_id)


def test_an_expired_or_collected_task_frees_its_key(keyed: Stack) -> None:
    key, marker = f"expiry-{uuid.uuid4()}", uuid.uuid4().hex
    with closing(keyed.client()) as client:
        first = call(client, key, {"marker": marker, "ms": 0}).result["taskId"]
        client.wait_status(first)
        with keyed.db() as conn:  # its retention ran out; the collector has not come by yet
            conn.execute(
                "UPDATE mcp_tasks SET expires_at = now() - interval '1 second' WHERE task_id = %s", (first,)
            )
        second = call(client, key, {"marker": marker, "ms": 0}).result["taskId"]
        assert second != first
        client.wait_status(second)
        with keyed.db() as conn:  # collected
            conn.execute("DELETE FROM mcp_tasks WHERE task_id = %s", (second,))
        third = call(client, key, {"marker": marker, "ms": 0}).result["taskId"]
        assert third not in (first, second)
        client.wait_status(third)
    assert runs_of(keyed, marker) == 3


def test_a_retry_is_no_new_creation_for_the_rate_quota(keyed: Stack) -> None:
    """Out of creation tokens, a call with a known key still finds its task; one without is 429."""
    env = dict(
        keyed.env,
        MCP_TASKS_CREATES_PER_SECOND_PER_PRINCIPAL="0.1",
        MCP_TASKS_CREATE_BURST_PER_PRINCIPAL="1",
    )
    proc, url = support.start_api(f"idem-quota-{uuid.uuid4().hex[:6]}", env)
    key, marker = f"quota-{uuid.uuid4()}", uuid.uuid4().hex
    try:
        with closing(Client(url)) as client:
            task_id = call(client, key, {"marker": marker, "ms": 0}).result["taskId"]
            for _ in range(3):
                assert call(client, key, {"marker": marker, "ms": 0}).result["taskId"] == task_id
            refused = call(client, f"new-{uuid.uuid4()}", {"marker": marker, "ms": 0})
            assert refused.status == 429 and refused.error["code"] == QUOTA_EXCEEDED
            client.wait_status(task_id)
    finally:
        proc.stop()
    assert runs_of(keyed, marker) == 1


# ---- the client CLI: --idempotency-key, and the same key on its own retries ------------------------


def cli_call(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    command = [sys.executable, "-m", "mcp_celery_tasks.cli", "call", "--url", url, "--json", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_cli_idempotency_key_runs_a_tool_once_however_often_it_is_called(
    keyed: Stack, tmp_path: Path
) -> None:
    key, marker = f"cli-given-{uuid.uuid4()}", uuid.uuid4().hex
    args = ("counted", "--arg", f"marker={marker}", "--arg", "ms=0", "--idempotency-key", key)
    first, second = cli_call(tmp_path, keyed.url, *args), cli_call(tmp_path, keyed.url, *args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["taskId"] == json.loads(second.stdout)["taskId"]
    assert runs_of(keyed, marker) == 1
    other = cli_call(tmp_path, keyed.url, "counted", "--arg", f"marker={marker}", "--idempotency-key", key)
    assert other.returncode != 0 and "other arguments" in other.stderr


class _DropFirstCall(http.server.BaseHTTPRequestHandler):
    """Forwards to the real API, except that the first ``tools/call`` gets no answer: the API
    handles it (the task is made), then the connection closes (a response lost on the way)."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes
    upstream = ""
    calls: list[JSONObject] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = json.loads(body)
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")
        }
        with httpx.stream("POST", self.upstream, content=body, headers=headers, timeout=60) as answer:
            if message.get("method") == "tools/call":
                self.calls.append(message["params"]["_meta"])
                if len(self.calls) == 1:
                    answer.read()
                    self.close_connection = True
                    return
            self.send_response(answer.status_code)
            for name, value in answer.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.end_headers()
            for chunk in answer.iter_raw():
                self.wfile.write(chunk)
                self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_cli_retries_a_create_whose_answer_was_lost_with_the_same_key(keyed: Stack, tmp_path: Path) -> None:
    calls: list[JSONObject] = []
    handler = type("Dropper", (_DropFirstCall,), {"upstream": keyed.url, "calls": calls})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    serving = threading.Thread(target=proxy.serve_forever, daemon=True)
    serving.start()
    marker = uuid.uuid4().hex
    try:
        url = f"http://127.0.0.1:{proxy.server_address[1]}/mcp"
        done = cli_call(tmp_path, url, "counted", "--arg", f"marker={marker}", "--arg", "ms=0")
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2 and calls[0][KEY] == calls[1][KEY] and str(calls[0][KEY]).startswith("cli-")
    assert json.loads(done.stdout)["status"] == "completed"
    assert len(rows_with(keyed, str(calls[0][KEY]))) == 1
    assert runs_of(keyed, marker) == 1


def test_the_official_python_sdk_sends_the_key_in_meta(keyed: Stack) -> None:
    """What the README shows SDK users: ``call_tool(..., meta={key: ...})``."""
    key, marker = f"sdk-{uuid.uuid4()}", uuid.uuid4().hex

    sent: Any = {KEY: key}  # RequestParamsMeta takes extra items (PEP 728), which mypy cannot see

    async def twice() -> list[str]:
        async with McpClient(keyed.url) as client:
            texts = []
            for _ in range(2):
                result = await client.call_tool("counted", {"marker": marker, "ms": 0}, meta=sent)
                texts += [block.text for block in result.content if isinstance(block, TextContent)]
            return texts

    assert asyncio.run(twice()) == [f"ran {marker}"] * 2
    assert len(rows_with(keyed, key)) == 1
    assert runs_of(keyed, marker) == 1
