"""The broker (Redis) stopped while clients create and poll tasks, then started again.

tools/call keeps answering CreateTaskResult (the row is committed first; the job waits in the
outbox), tasks/get keeps answering fast (no broker call on the event loop), and once the broker
is back the publisher, the sweeper and the workers catch up: every task completes once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
import redis

from tests import support
from tests.faults.services import FaultServices
from tests.faults.stack import (
    FaultClient,
    FaultStack,
    Load,
    assert_each_completed_once,
    assert_principals_isolated,
    percentile,
    running,
    wait_all_terminal,
)

OUTAGE_S = 3.0
GET_P99_BOUND_S = 1.0


@pytest.mark.slow
def test_broker_outage_keeps_the_api_answering_and_loses_no_task(
    services: FaultServices, fault_db: str
) -> None:
    stack = FaultStack("broker-stop", fault_db, services.broker.url, services.root / "runs" / "broker-stop")
    with running(stack):
        stack.start_all()
        load = Load(stack.url, creators=2, pollers=2, pause=0.01).start()
        try:
            support.wait_until(lambda: len(load.received) >= 30, 30, what="some load before the outage")
            services.broker.stop()
            down_at = load.now()
            try:
                time.sleep(OUTAGE_S)  # deliberate: the outage itself
            finally:
                up_from = load.now()
                services.broker.start()
            up_at = load.now()
            after = len(load.received)
            support.wait_until(lambda: len(load.received) >= after + 30, 30, what="load after the outage")
        finally:
            load.stop()

        bad = [c.describe() for c in load.calls if not c.ok]
        assert not bad, bad[:5]
        created_down = [c for c in load.calls if c.kind == "create" and down_at <= c.started <= up_from]
        assert created_down and all(c.result["resultType"] == "task" for c in created_down)
        gets_down = [c.seconds for c in load.between(down_at, up_from, "get")]
        creates_down = [c.seconds for c in created_down]
        assert len(gets_down) >= 20
        assert percentile(gets_down, 99) < GET_P99_BOUND_S

        rows = wait_all_terminal(stack, 60)
        settled_s = load.now() - up_at
        late = sum(
            r["dispatched_at"] is not None and (r["dispatched_at"] - r["created_at"]).total_seconds() > 1
            for r in rows.values()
        )
        summary = assert_each_completed_once(stack, load.received, rows)
        assert summary["attempts=1"] == len(load.received), summary
        assert_principals_isolated(stack, load.received)
        print(
            f"\nbroker outage {up_from - down_at:.1f} s: {len(created_down)} tasks created meanwhile "
            f"(tools/call p99 {percentile(creates_down, 99) * 1000:.0f} ms), "
            f"tasks/get p50 {percentile(gets_down, 50) * 1000:.1f} ms / p99 "
            f"{percentile(gets_down, 99) * 1000:.1f} ms over {len(gets_down)} calls; "
            f"{len(load.received)} tasks handed out, {dict(summary)}; {late} published late; "
            f"all ended {settled_s:.1f} s after the broker restart"
        )


@contextlib.contextmanager
def jobs_waiting_in_redis(
    services: FaultServices, fault_db: str, name: str, count: int, **settings: str
) -> Iterator[tuple[FaultStack, list[str]]]:
    """A stack with only its API running, and ``count`` tasks whose jobs were published to
    Redis (no worker takes them yet)."""
    stack = FaultStack(name, fault_db, services.broker.url, services.root / "runs" / name, **settings)
    with running(stack):
        stack.start_api()
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        task_ids = [task_id for _ in range(count) if (task_id := client.create(0).task_id)]
        assert len(task_ids) == count
        support.wait_until(
            lambda: all(r["dispatched_at"] for r in stack.rows(task_ids).values()), 15, what="the publisher"
        )
        # A release is committed before its publish: wait for the messages themselves.
        broker = redis.Redis(unix_socket_path=str(services.broker.socket))
        try:
            support.wait_until(
                lambda: broker.llen(stack.queues[0]) == count, 15, what="the messages in Redis"
            )
        finally:
            broker.close()
        yield stack, task_ids


@pytest.mark.slow
def test_tasks_whose_jobs_the_broker_lost_still_end(services: FaultServices, fault_db: str) -> None:
    # The broker lost them: it holds fewer messages than the queue's published, unstarted jobs,
    # so the missing ones are re-published once 5 s old (20 s by default), whatever the backlog
    # (issue 19: they used to wait until the backlog drained).
    settings = {"MCP_TASKS_REPUBLISH_IDLE_QUEUE_AFTER_SECONDS": "5"}
    with jobs_waiting_in_redis(services, fault_db, "broker-loss", 3, **settings) as (stack, _):
        services.broker.stop()
        services.broker.wipe()
        services.broker.start()
        stack.start_workers()
        stack.wait_worker_ready()
        stack.wait_sweeps(after=stack.db_now())
        # The sweeper counts them missing from the broker and re-publishes them (stack setting).
        wait_all_terminal(stack, 25)


@pytest.mark.slow
def test_a_job_a_worker_received_but_never_started_runs_once_its_queue_is_empty(
    services: FaultServices, fault_db: str
) -> None:
    # A worker took the message and lost its broker connection before starting it: on Redis
    # the message is gone (or, with kombu's ack emulation on, kept aside for its visibility
    # timeout, 12 h by default), so nothing queues the job any more. The sweeper sees an
    # empty queue and publishes it again (after 3 s here, 20 s by default), long before the
    # 30-minute rule would.
    settings = {"MCP_TASKS_REPUBLISH_IDLE_QUEUE_AFTER_SECONDS": "3"}
    with jobs_waiting_in_redis(services, fault_db, "taken", 1, **settings) as (stack, [task_id]):
        broker = redis.Redis(unix_socket_path=str(services.broker.socket))
        try:
            assert broker.rpop(stack.queues[0]) is not None  # what BRPOP hands a worker
            assert broker.llen(stack.queues[0]) == 0
        finally:
            broker.close()
        stack.start_workers()
        row = wait_all_terminal(stack, 30)[task_id]
        assert row["status"] == "completed" and row["attempts"] == 1
        marks = stack.marks(task_id)
        assert (marks["start"], marks["end"]) == (1, 1), marks
