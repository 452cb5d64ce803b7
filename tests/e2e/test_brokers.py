"""The same basic behaviour on each broker (Redis and RabbitMQ)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.broker.channel import publish_job, queue_depth
from mcp_celery_tasks.settings import Settings
from tests.support import Client, Stack, free_port, wait_until


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


def test_queue_depth_counts_the_messages_waiting_in_a_queue(any_stack: Stack) -> None:
    # What the sweeper asks before it re-publishes a job no worker started (gc._unstarted).
    settings = Settings(broker_url=any_stack.broker_url)
    app = create_app(settings)
    name = f"mcpt.depth.{uuid.uuid4().hex[:8]}"  # no worker consumes it
    try:
        assert queue_depth(app, name) == 0  # no such queue (Redis: no list) holds nothing
        for _ in range(2):
            publish_job(app, str(uuid.uuid4()), name)
        assert wait_until(lambda: queue_depth(app, name) == 2, 5, what="two waiting messages")
    finally:
        with app.connection_for_write() as conn:
            # celery-types' kombu StdChannel stub lacks the transport channels' queue_purge/queue_delete.
            conn.default_channel.queue_purge(name)  # type: ignore[attr-defined]  # Redis: the list goes
            conn.default_channel.queue_delete(name)  # type: ignore[attr-defined]  # RabbitMQ: the queue goes
        app.close()
    assert queue_depth(app, name) == 0


def test_queue_depth_is_none_when_the_broker_cannot_be_asked(any_stack: Stack) -> None:
    scheme = any_stack.broker_url.split("://", 1)[0]
    app = create_app(Settings(broker_url=f"{scheme}://127.0.0.1:{free_port()}/"))
    try:
        assert queue_depth(app, "mcp.default", timeout_s=1.0) is None
    finally:
        app.close()
