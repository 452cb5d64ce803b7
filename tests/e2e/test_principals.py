"""Bearer-token principals: a second API with auth on, sharing the stack's database and queues.

A task belongs to the principal that created it; to anyone else it does not exist.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp_types import jsonrpc as codes

from tests import support
from tests.e2e.test_push import listen
from tests.support import Client, Stack, meta, wait_until

TOKENS = {"alice": "alice-token", "bob": "bob-token"}


@pytest.fixture(scope="module")
def auth_url(stack: Stack) -> Iterator[str]:
    env = dict(stack.env, MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS))
    proc, url = support.start_api(f"auth-api-{uuid.uuid4().hex[:8]}", env)
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def alice(auth_url: str) -> Iterator[Client]:
    c = Client(auth_url, token=TOKENS["alice"])
    yield c
    c.close()


@pytest.fixture
def bob(auth_url: str) -> Iterator[Client]:
    c = Client(auth_url, token=TOKENS["bob"])
    yield c
    c.close()


def error_of(reply: support.Reply) -> dict[str, Any]:
    assert reply.error["code"] == codes.INVALID_PARAMS, reply.body
    return reply.error


def not_found_answers(client: Client, task_id: str) -> list[dict[str, Any]]:
    """The errors of tasks/get, tasks/cancel and tasks/update on ``task_id``."""
    return [
        error_of(client.get(task_id)),
        error_of(client.cancel(task_id)),
        error_of(client.update(task_id, {"some-key": {"action": "accept"}})),
    ]


def raw_post(url: str, headers: dict[str, str]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}
    sent = {"MCP-Protocol-Version": support.VERSION, "Mcp-Method": "tools/list", **headers}
    return httpx.post(url, json=body, headers=sent, timeout=30)


def test_request_without_a_token_is_401_with_www_authenticate(auth_url: str) -> None:
    response = raw_post(auth_url, {})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].lower().startswith("bearer")


def test_request_with_a_wrong_token_is_401(auth_url: str) -> None:
    response = raw_post(auth_url, {"Authorization": "Bearer not-a-token"})
    assert response.status_code == 401
    assert "www-authenticate" in response.headers


def test_valid_token_is_accepted(alice: Client) -> None:
    assert alice.request("tools/list").result["tools"]


def test_another_principal_sees_the_task_exactly_as_an_unknown_one(
    alice: Client, bob: Client, stack: Stack
) -> None:
    task_id = alice.start("slow_compute", {"seconds": 1.5, "label": "alice"})
    assert stack.row(task_id)["owner"] == "token:alice"

    foreign = not_found_answers(bob, task_id)
    unknown = not_found_answers(bob, secrets.token_urlsafe(24))
    assert [e["message"] for e in foreign] == [e["message"] for e in unknown]
    assert foreign == unknown  # code, message and (absent) data alike

    # Bob's cancel did nothing: alice still sees her task run to completion.
    assert alice.get(task_id).result["status"] in ("working", "completed")
    done = alice.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "done after 1.5s (alice)"
    row = stack.row(task_id)
    assert row["status"] == "completed"
    assert row["cancel_requested_at"] is None


def test_anonymous_tasks_are_invisible_to_an_authenticated_principal(
    client: Client, alice: Client, stack: Stack
) -> None:
    task_id = client.start("slow_compute", {"seconds": 1.0, "label": "anon"})
    assert stack.row(task_id)["owner"] == "anon"

    foreign = not_found_answers(alice, task_id)
    unknown = not_found_answers(alice, secrets.token_urlsafe(24))
    assert foreign == unknown

    assert client.wait_status(task_id)["status"] == "completed"
    assert stack.row(task_id)["cancel_requested_at"] is None


def test_authenticated_tasks_are_invisible_to_the_anonymous_api(client: Client, alice: Client) -> None:
    task_id = alice.start("noop")
    wait_until(lambda: alice.get(task_id).result["status"] == "completed", 15, what="alice's task")
    assert not_found_answers(client, task_id) == not_found_answers(client, secrets.token_urlsafe(24))


def _listen_as(url: str, token: str, task_ids: list[str]) -> list[dict[str, Any]]:
    """The messages of a ``subscriptions/listen`` stream for ``task_ids``, sent with ``token``."""
    response = listen(url, task_ids, request_id=5, token=token)
    assert response.status_code == 200, response.text
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def test_a_listen_on_another_principals_task_hears_it_exactly_as_an_unknown_one(
    alice: Client, auth_url: str
) -> None:
    """The red team's cross-principal listen (issue 33): bob names alice's finished task and
    gets the stream an unknown id gets, never its state; alice naming it hears it."""
    task_id = alice.start("noop")
    alice.wait_status(task_id)
    foreign = _listen_as(auth_url, TOKENS["bob"], [task_id])
    unknown = _listen_as(auth_url, TOKENS["bob"], [secrets.token_urlsafe(24)])
    assert foreign == unknown
    assert "notifications/tasks" not in [message.get("method") for message in foreign]
    assert task_id not in json.dumps(foreign)
    own = _listen_as(auth_url, TOKENS["alice"], [task_id])
    heard = [m["params"] for m in own if m.get("method") == "notifications/tasks"]
    assert [(p["taskId"], p["status"]) for p in heard] == [(task_id, "completed")]


class _LegacySession:
    """A 2025-11-25 client of one principal: initialize, then requests on its session."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token, self.ids = url, token, 0
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        init = self.post({"method": "initialize", "params": hello}, None)
        assert init.status_code == 200, init.text
        self.session = init.headers["mcp-session-id"]

    def post(self, message: dict[str, Any], session: str | None) -> httpx.Response:
        self.ids += 1
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
            "Authorization": f"Bearer {self.token}",
        }
        if session:
            headers["Mcp-Session-Id"] = session
        return httpx.post(
            self.url, json={"jsonrpc": "2.0", "id": self.ids, **message}, headers=headers, timeout=60
        )

    def call(self, method: str, params: dict[str, Any], session: str | None = None) -> dict[str, Any]:
        reply = self.post({"method": method, "params": params}, session or self.session)
        body: dict[str, Any] = support.parse_body(reply)
        return {"status": reply.status_code, **{k: v for k, v in body.items() if k in ("result", "error")}}


def test_on_2025_11_25_another_principal_sees_the_task_exactly_as_an_unknown_one(
    alice: Client, auth_url: str, stack: Stack
) -> None:
    """The same rule on the older revision (SEP-1686 tasks): bob's get, result and cancel of
    alice's task answer as for an id that never existed, and alice's session id is no key."""
    mine, theirs = _LegacySession(auth_url, TOKENS["alice"]), _LegacySession(auth_url, TOKENS["bob"])
    created = mine.call(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 1.0, "label": "a"}, "task": {}}
    )
    task_id = created["result"]["task"]["taskId"]
    unknown = secrets.token_urlsafe(24)
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        assert theirs.call(method, {"taskId": task_id}) == theirs.call(method, {"taskId": unknown}), method
        assert "error" in theirs.call(method, {"taskId": task_id}), method
    assert task_id not in json.dumps(theirs.call("tasks/list", {}))
    stolen = theirs.call("tasks/get", {"taskId": task_id}, session=mine.session)  # bob on alice's session
    assert "result" not in stolen, stolen
    # Nothing bob did reached the task: alice's result is hers, uncancelled.
    done = mine.call("tasks/result", {"taskId": task_id})
    assert done["result"]["content"][0]["text"] == "done after 1.0s (a)"
    assert stack.row(task_id)["cancel_requested_at"] is None
