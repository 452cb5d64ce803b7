"""A worker SIGKILLed (with its prefork children) in the middle of jobs.

On Redis the killed jobs' messages are gone (kombu's ack emulation is off; with it on they would
stay aside until the visibility timeout, hours): the sweeper must see the leases run out and
publish them again. RabbitMQ requeues them as soon as the
connection drops, and the sweeper's copies race those. Either way each task completes exactly once,
on its second attempt, and jobs still queued behind them run once on the new worker.
"""

from __future__ import annotations

import time

import pytest

from tests import support
from tests.faults.services import FaultServices
from tests.faults.stack import (
    FaultClient,
    FaultStack,
    assert_each_completed_once,
    assert_principals_isolated,
    delete_amqp_queues,
    running,
    wait_all_terminal,
)

LONG_MS = 2500
SHORT_MS = 100


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_worker_killed_mid_task_is_completed_once_by_the_next_worker(
    broker: str, services: FaultServices, fault_db: str
) -> None:
    if broker == "rabbitmq" and not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    broker_url = services.broker.url if broker == "redis" else support.AMQP_URL
    stack = FaultStack(f"crash-{broker}", fault_db, broker_url, services.root / "runs" / f"crash-{broker}")
    try:
        with running(stack):
            stack.start_all()
            alice, bob = FaultClient(stack.url, "alice"), FaultClient(stack.url, "bob")
            stack.closing(alice, bob)
            received: dict[str, str] = {}
            running_ids = []
            for client in (alice, bob):
                call = client.create(LONG_MS)
                assert call.task_id, call.describe()
                received[call.task_id] = client.who
                running_ids.append(call.task_id)
            # Both children are busy now; these wait in the broker (prefetch is one per child).
            for client in (alice, bob):
                call = client.create(SHORT_MS)
                assert call.task_id, call.describe()
                received[call.task_id] = client.who
            support.wait_until(
                lambda: all(stack.marks(t)["start"] for t in running_ids), 20, what="both long jobs to start"
            )

            stack.kill("worker")
            killed_at = time.monotonic()
            assert all(stack.marks(t)["end"] == 0 for t in running_ids), "a job ended before the kill"
            stack.start_worker("worker2")

            support.wait_until(
                lambda: all(r["status"] == "completed" for r in stack.rows(running_ids).values()),
                45,
                0.1,
                what="the killed jobs to complete on the new worker",
            )
            recovered_s = time.monotonic() - killed_at
            rows = wait_all_terminal(stack, 30)
            summary = assert_each_completed_once(stack, received, rows)
            for task_id in running_ids:
                marks = stack.marks(task_id)
                assert rows[task_id]["attempts"] == 2, rows[task_id]
                assert (marks["start@1"], marks["start@2"], marks["end@2"]) == (1, 1, 1), marks
                assert rows[task_id]["result"]["structuredContent"]["attempt"] == 2
            assert (summary["attempts=2"], summary["attempts=1"], summary["rerun"]) == (2, 2, 0), summary
            assert_principals_isolated(stack, received)
            print(f"\n{broker}: killed jobs completed {recovered_s:.1f} s after the kill")
    finally:
        if broker == "rabbitmq":
            delete_amqp_queues(broker_url, stack.queues)
