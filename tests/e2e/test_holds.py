"""Synchronous waits and open streams counted per principal (issue 33), on a real API beside the
shared stack's worker: alice may hold two synchronous waits and two streams at once. One more is
refused (-32001 naming the limit, HTTP 429, Retry-After) before its task exists, while bob is
served; once alice's waits end, or she walks away from them, she is served again.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support import Client, Proc, Reply, Stack, meta, start_api, wait_until

TOKENS = {"alice": "alice-secret", "bob": "bob-secret"}
QUOTA_EXCEEDED = -32001
WAITS = STREAMS = 2


@pytest.fixture(scope="module")
def capped(stack: Stack) -> Iterator[str]:
    env = dict(
        stack.env,
        MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS),
        MCP_TASKS_MAX_SYNC_WAITS_PER_PRINCIPAL=str(WAITS),
        MCP_TASKS_MAX_OPEN_STREAMS_PER_PRINCIPAL=str(STREAMS),
    )
    proc: Proc
    proc, url = start_api("holds-api", env)
    yield url
    proc.stop()


@pytest.fixture
def alice(capped: str) -> Iterator[Client]:
    c = Client(capped, token=TOKENS["alice"])
    yield c
    c.close()


@pytest.fixture
def bob(capped: str) -> Iterator[Client]:
    c = Client(capped, token=TOKENS["bob"])
    yield c
    c.close()


def rows(stack: Stack, label: str) -> int:
    with stack.db() as conn:
        found = conn.execute(
            "SELECT count(*) FROM mcp_tasks WHERE arguments ->> 'label' = %s", (label,)
        ).fetchone()
    assert found is not None
    return int(found[0])


def slow(client: Client, label: str, seconds: float, **params: Any) -> Reply:
    """A synchronous ``slow_compute`` call (no tasks extension: the caller waits for it)."""
    arguments = {"seconds": seconds, "label": label}
    return client.request(
        "tools/call", {"name": "slow_compute", "arguments": arguments, **params}, extension=False
    )


def refused(reply: Reply, limit: str) -> None:
    assert reply.status == 429, reply.body
    assert reply.error["code"] == QUOTA_EXCEEDED
    assert reply.error["data"]["limit"] == limit
    assert reply.headers["retry-after"] == "1"


def waiting(url: str, token: str, count: int, label: str, seconds: float) -> list[Future[Reply]]:
    """``count`` synchronous waits started at once, each on its own connection."""

    def one() -> Reply:
        client = Client(url, token=token)
        try:
            return slow(client, label, seconds)
        finally:
            client.close()

    pool = ThreadPoolExecutor(count)
    futures = [pool.submit(one) for _ in range(count)]
    pool.shutdown(wait=False)
    return futures


def test_one_wait_past_the_cap_is_refused_with_no_task_while_another_principal_is_served(
    capped: str, alice: Client, bob: Client, stack: Stack
) -> None:
    label = f"holds-{uuid.uuid4().hex[:8]}"
    held = waiting(capped, TOKENS["alice"], WAITS, label, 2.0)
    wait_until(lambda: rows(stack, label) == WAITS, 10, what="alice's waits to have their tasks")

    extra = f"{label}-extra"
    refused(slow(alice, extra, 0), "sync_waits")
    assert rows(stack, extra) == 0  # refused before its task was created

    served = slow(bob, f"{label}-bob", 0)
    assert served.status == 200 and served.result["isError"] is False, served.body

    for future in held:
        reply = future.result(timeout=30)
        assert reply.result["content"][0]["text"].startswith("done after"), reply.body
    again = slow(alice, extra, 0)
    assert again.status == 200 and again.result["isError"] is False, again.body
    assert rows(stack, extra) == 1


def test_waits_the_client_walked_away_from_give_their_slots_back(
    capped: str, alice: Client, stack: Stack
) -> None:
    label = f"gone-{uuid.uuid4().hex[:8]}"

    def abandoned() -> None:
        with pytest.raises(httpx.ReadTimeout):
            Client(capped, token=TOKENS["alice"], http=httpx.Client(timeout=1.0)).request(
                "tools/call",
                {"name": "slow_compute", "arguments": {"seconds": 60, "label": label}},
                extension=False,
                timeout=1.0,
            )

    threads = [threading.Thread(target=abandoned) for _ in range(WAITS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert rows(stack, label) == WAITS

    # The tasks would hold their waits for a minute: served again within seconds, the server
    # gave the slots back when the callers went away.
    def served() -> bool:
        reply = slow(alice, f"{label}-after", 0)
        return reply.status == 200

    wait_until(served, 10, 0.2, what="alice's abandoned waits to give their slots back")
    with stack.db() as conn:
        statuses = conn.execute(
            "SELECT status FROM mcp_tasks WHERE arguments ->> 'label' = %s", (label,)
        ).fetchall()
    assert {status for (status,) in statuses} == {"cancelled"}  # and their tasks were cancelled


def listen_request(token: str, task_id: str) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [task_id]}, "_meta": meta()},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
        "Authorization": f"Bearer {token}",
    }
    return {"json": body, "headers": headers}


def listen_open(url: str, token: str, task_id: str, out: list[dict[str, Any]]) -> None:
    """A ``subscriptions/listen`` stream held open; its messages go to ``out``."""
    with httpx.stream("POST", url, timeout=60, **listen_request(token, task_id)) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                out.append(json.loads(line[5:]))


def test_a_stream_past_the_cap_is_refused_and_a_relayed_call_creates_no_task(
    capped: str, bob: Client, stack: Stack
) -> None:
    label = f"streams-{uuid.uuid4().hex[:8]}"
    created = bob.request(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60, "label": label}}
    ).result
    task_id = created["taskId"]
    streams: list[list[dict[str, Any]]] = [[] for _ in range(STREAMS)]
    threads = [
        threading.Thread(target=listen_open, args=(capped, TOKENS["bob"], task_id, out), daemon=True)
        for out in streams
    ]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: all(streams), 10, what="bob's streams to be acknowledged")

        third = httpx.post(capped, timeout=10, **listen_request(TOKENS["bob"], task_id))
        assert third.status_code == 429 and third.headers["retry-after"] == "1", third.text
        assert third.json()["error"]["code"] == QUOTA_EXCEEDED
        assert third.json()["error"]["data"]["limit"] == "open_streams"
        # A synchronous call relayed on a stream (it asks for progress) is a stream as well.
        relayed = slow(bob, f"{label}-relayed", 0, _meta={**meta(False), "progressToken": "p"})
        refused(relayed, "open_streams")
        assert rows(stack, f"{label}-relayed") == 0
    finally:
        bob.cancel(task_id)
    for thread in threads:
        thread.join(10)  # the streams end with the task
    relayed = slow(bob, f"{label}-relayed", 0, _meta={**meta(False), "progressToken": "p"})
    assert relayed.status == 200 and rows(stack, f"{label}-relayed") == 1, relayed.body
