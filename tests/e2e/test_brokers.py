"""The same basic behaviour on each broker (Redis and RabbitMQ)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Client, Stack, wait_until


@pytest.fixture
def broker_client(any_stack: Stack) -> Iterator[Client]:
    c = any_stack.client()
    yield c
    c.close()


def test_tasked_noop_completes(broker_client: Client) -> None:
    task_id = broker_client.start("noop")
    done = broker_client.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"] == [{"type": "text", "text": "ok"}]


def test_synchronous_greet_answers(broker_client: Client) -> None:
    reply = broker_client.call_tool("greet", {"name": "Grace"})
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert reply.result["content"] == [{"type": "text", "text": "Hello, Grace!"}]
    assert "taskId" not in reply.result


def test_cancelled_spin_stops_and_the_worker_records_finished_at(
    broker_client: Client, any_stack: Stack
) -> None:
    task_id = broker_client.start("spin", {"seconds": 30})
    wait_until(lambda: any_stack.row(task_id)["started_at"] is not None, 20, what="the job to start")
    ack = broker_client.cancel(task_id).result
    assert ack["resultType"] == "complete"
    assert broker_client.get(task_id).result["status"] == "cancelled"
    row = wait_until(
        lambda: (r := any_stack.row(task_id))["finished_at"] is not None and r, 15, what="the worker to stop"
    )
    assert row["status"] == "cancelled"
    assert row["result"] is None
    assert row["lease_until"] is None
    assert row["finished_at"] >= row["started_at"]
