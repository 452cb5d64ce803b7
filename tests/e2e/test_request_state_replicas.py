"""A sealed ``requestState`` is usable once across API replicas (issue 33): two API processes on
one database share the spent states, so a state spent on one is refused by the other (-32602,
as a replay to the same process is) and starts no second task.

The shared stack's API is the first replica; a second API process of the same deployment (same
database, broker and secret keys) is started beside it for this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import support
from tests.e2e.test_inputs import (
    YES,
    Tasks,
    assert_invalid_params,
    call,
    input_rows,
    mrtr_round_one,
    sync_task_id,
    task_count,
    unique,
)
from tests.support import Client, Stack

CAPS: dict[str, Any] = {"elicitation": {}}
ALICE = {"user_name": {"action": "accept", "content": {"name": "Alice"}}}


@pytest.fixture(scope="module")
def replica(stack: Stack) -> Iterator[str]:
    """The MCP URL of a second API process on the shared stack's database."""
    proc, url = support.start_api("replica-b-api", stack.env)
    yield url
    proc.stop()


@pytest.fixture
def other(replica: str) -> Iterator[Client]:
    c = Client(replica)
    yield c
    c.close()


@pytest.fixture
def tasks(client: Client) -> Iterator[Tasks]:
    tracker = Tasks(client)
    yield tracker
    tracker.cleanup()


def test_a_pre_task_state_spent_on_one_replica_is_refused_on_the_other(
    client: Client, other: Client, stack: Stack, tasks: Tasks
) -> None:
    round_one = call(client, "test_tool_with_task", {}, caps=CAPS).result
    assert round_one["resultType"] == "input_required"
    state = round_one["requestState"]

    def retry(on: Client) -> support.Reply:
        return call(on, "test_tool_with_task", {}, caps=CAPS, inputResponses=ALICE, requestState=state)

    created = retry(client).result
    assert created["resultType"] == "task"
    tasks.track(created["taskId"])
    before = task_count(stack, "test_tool_with_task")

    replayed = retry(other)

    assert_invalid_params(replayed)
    assert "already used" in replayed.error["message"]
    assert task_count(stack, "test_tool_with_task") == before
    # And back on the first replica, whose own set refuses it without a query.
    assert "already used" in retry(client).error["message"]


def test_a_state_opened_by_one_replica_works_once_on_the_other(
    client: Client, other: Client, stack: Stack, tasks: Tasks
) -> None:
    # Sealed by one replica, spent on the other (the same keys): the first use is honoured.
    round_one = call(client, "test_tool_with_task", {}, caps=CAPS).result
    state = round_one["requestState"]
    created = call(other, "test_tool_with_task", {}, caps=CAPS, inputResponses=ALICE, requestState=state)
    assert created.result["resultType"] == "task"
    tasks.track(created.result["taskId"])
    before = task_count(stack, "test_tool_with_task")
    replayed = call(client, "test_tool_with_task", {}, caps=CAPS, inputResponses=ALICE, requestState=state)
    assert "already used" in replayed.error["message"]
    assert task_count(stack, "test_tool_with_task") == before


def test_a_synchronous_calls_answer_state_replayed_on_the_other_replica_is_refused(
    client: Client, other: Client, stack: Stack
) -> None:
    filename = unique("replica")
    first = mrtr_round_one(client, filename)
    (key,) = first["inputRequests"]
    task_id = sync_task_id(stack, "confirm_delete", filename)
    try:

        def retry(on: Client) -> support.Reply:
            return call(
                on, "confirm_delete", {"filename": filename}, extension=False, caps=CAPS,
                inputResponses={key: YES}, requestState=first["requestState"],
            )  # fmt: skip

        done = retry(client)
        assert done.result["content"] == [{"type": "text", "text": f"Deleted {filename}"}]

        replayed = retry(other)

        assert_invalid_params(replayed)
        assert "already used" in replayed.error["message"]
        assert [row["response"] for row in input_rows(stack, task_id)] == [YES]
    finally:
        client.cancel(task_id)
