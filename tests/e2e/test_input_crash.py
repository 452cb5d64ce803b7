"""Crash safety of input requests: a worker killed while a task waits for input.

The answers live in Postgres, not in the dead process: the re-run replays the recorded answers
instead of asking again, so the first question is asked once, the task completes once, and the
result carries both answers. Each test has its own stack (database, queues, worker), because
it SIGKILLs the worker; the lease is 3 s so the dead worker's hold runs out fast.

On Redis the job's message left with the dead worker (or, with kombu's ack emulation on, stays
aside for its visibility timeout, hours), so there the maintenance sweep re-publishes the job
whose lease ran out; RabbitMQ redelivers by itself when the dead
worker's connection drops.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mcp_celery_tasks.broker.celery_app import RUN_TOOL, create_app
from mcp_celery_tasks.broker.channel import queue_depth
from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from tests import support
from tests.support import Client, Proc, Stack, meta, wait_until

SUFFIX = uuid.uuid4().hex[:8]
LEASE_SECONDS = "3"
FIRST_ANSWER = {"action": "accept", "content": {"value": "before the crash"}}
SECOND_ANSWER = {"action": "accept", "content": {"confirm": True}}


@contextmanager
def crash_stack(template_db: str, broker_url: str, tag: str) -> Iterator[Stack]:
    database = f"mcpt_{SUFFIX}_crash_{tag}"
    dsn = support.create_database(database, template=template_db)
    try:
        with support.running_stack(
            f"crash-{tag}-{SUFFIX}", dsn, broker_url, f"{SUFFIX}c{tag}", MCP_TASKS_LEASE_SECONDS=LEASE_SECONDS
        ) as live:
            yield live
    finally:
        support.drop_database(database)


@pytest.fixture
def redis_crash_stack(template_db: str) -> Iterator[Stack]:
    with crash_stack(template_db, support.REDIS_URL, "redis") as live:
        yield live


@pytest.fixture
def rabbit_crash_stack(template_db: str) -> Iterator[Stack]:
    if not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    with crash_stack(template_db, support.AMQP_URL, "rabbit") as live:
        yield live


# ---- helpers ---------------------------------------------------------------------------------


def input_rows(stack: Stack, task_id: str) -> list[dict[str, Any]]:
    with stack.db() as conn:
        rows = conn.execute(
            "SELECT key, response, superseded FROM mcp_task_inputs WHERE task_id = %s "
            "ORDER BY requested_at, key",
            (task_id,),
        ).fetchall()
    return [
        {"key": key, "response": response, "superseded": superseded} for key, response, superseded in rows
    ]


def lease_ran_out(stack: Stack, task_id: str) -> bool:
    with stack.db() as conn:
        found = conn.execute(
            "SELECT lease_until IS NOT NULL AND lease_until < now() FROM mcp_tasks WHERE task_id = %s",
            (task_id,),
        ).fetchone()
    return bool(found and found[0])


def outstanding(client: Client, task_id: str) -> dict[str, Any] | None:
    task = client.get(task_id).result
    assert task["status"] not in support.TERMINAL, task
    return task.get("inputRequests") if task["status"] == "input_required" else None


def log_count(procs: list[Proc], needle: str) -> int:
    return sum(proc.log.read_bytes().decode(errors="replace").count(needle) for proc in procs)


def sweep_lost_leases(stack: Stack) -> int:
    """What the beat sweeper does every 15 s: re-publish jobs whose worker's lease ran out."""
    settings = Settings(
        database_url=stack.database_url,
        broker_url=stack.broker_url,
        default_queue=stack.env["MCP_TASKS_DEFAULT_QUEUE"],
        maintenance_queue=stack.env["MCP_TASKS_MAINTENANCE_QUEUE"],
        lease_grace_seconds=0.0,  # the caller waited until the lease ran out
    )
    app = create_app(settings)
    store = WorkerStore(settings, application_name="test-sweep")

    def publish(job_id: str, queue: str) -> None:
        app.send_task(RUN_TOOL, args=[job_id], task_id=job_id, queue=queue)

    try:
        return gc.sweep(store, publish, settings, queue_depth=lambda queue: queue_depth(app, queue))
    finally:
        store.close()
        app.close()


def kill_worker_between_questions(
    stack: Stack, recover: Callable[[Stack, str], None], tag: str
) -> tuple[dict[str, Any], str, str, str, Proc]:
    """Answer the first question, kill the worker while the second is outstanding, answer the
    second with no worker alive, start a new worker and ``recover``; return the finished task."""
    client = stack.client()
    try:
        params = {"name": "t_two_questions", "arguments": {"marker": tag}, "_meta": meta(elicitation={})}
        created = client.request("tools/call", params).result
        assert created["resultType"] == "task"
        task_id = created["taskId"]

        first = wait_until(lambda: outstanding(client, task_id), 30, what="the first question")
        (first_key,) = first
        assert client.update(task_id, {first_key: FIRST_ANSWER}).result["resultType"] == "complete"
        second = wait_until(
            lambda: (asked := outstanding(client, task_id)) and first_key not in asked and asked,
            30,
            what="the second question",
        )
        (second_key,) = second
        before = stack.row(task_id)
        assert before["attempts"] == 1 and before["status"] == "input_required"

        stack.worker.kill()
        assert stack.worker.popen.poll() is not None

        # Nobody runs the job now; the answer is recorded all the same and nothing is outstanding.
        assert client.update(task_id, {second_key: SECOND_ANSWER}).result["resultType"] == "complete"
        waiting = client.get(task_id).result
        assert waiting["status"] == "working"
        assert "inputRequests" not in waiting

        replacement = support.start_worker(f"crash-{tag}-{SUFFIX}-worker2", stack.env)
        try:
            recover(stack, task_id)
            done = client.wait_status(task_id, timeout=60)
        except BaseException:
            replacement.stop()
            raise
        return done, task_id, first_key, second_key, replacement
    finally:
        client.close()


def assert_completed_once_with_both_answers(
    stack: Stack, done: dict[str, Any], task_id: str, keys: tuple[str, str], replacement: Proc
) -> None:
    assert done["status"] == "completed"
    assert done["result"]["isError"] is False
    assert done["result"]["structuredContent"] == {
        "first": FIRST_ANSWER,
        "second": SECOND_ANSWER,
        "attempt": 2,
    }
    row = stack.row(task_id)
    assert row["attempts"] == 2
    assert row["finished_at"] is not None and row["lease_until"] is None
    # The first question was asked once: exactly the two original requests, none asked again.
    rows = input_rows(stack, task_id)
    assert [r["key"] for r in rows] == list(keys)
    assert [r["response"] for r in rows] == [FIRST_ANSWER, SECOND_ANSWER]
    assert not any(r["superseded"] for r in rows)
    # Completed exactly once, by the new worker.
    job = f"job {row['job_id']} "
    wait_until(lambda: log_count([replacement], job + "completed") == 1, 10, what="the completion log line")
    assert log_count([stack.worker, replacement], job + "completed") == 1
    assert log_count([stack.worker, replacement], job + "superseded") == 0


# ---- the tests -------------------------------------------------------------------------------


def test_redis_job_killed_while_waiting_for_input_completes_once_after_the_sweep(
    redis_crash_stack: Stack,
) -> None:
    stack = redis_crash_stack
    sweeps: list[int] = []

    def recover(live: Stack, task_id: str) -> None:
        wait_until(lambda: lease_ran_out(live, task_id), 15, what="the dead worker's lease to run out")
        sweeps.append(sweep_lost_leases(live))

    done, task_id, first_key, second_key, replacement = kill_worker_between_questions(stack, recover, "redis")
    try:
        assert sweeps == [1]
        assert_completed_once_with_both_answers(stack, done, task_id, (first_key, second_key), replacement)
    finally:
        replacement.stop()


@pytest.mark.rabbitmq
def test_rabbitmq_job_killed_while_waiting_for_input_is_redelivered_and_completes_once(
    rabbit_crash_stack: Stack,
) -> None:
    stack = rabbit_crash_stack

    def recover(live: Stack, task_id: str) -> None:
        """Nothing to do: RabbitMQ requeued the unacknowledged job when the connection dropped."""

    done, task_id, first_key, second_key, replacement = kill_worker_between_questions(
        stack, recover, "rabbit"
    )
    try:
        assert_completed_once_with_both_answers(stack, done, task_id, (first_key, second_key), replacement)
    finally:
        replacement.stop()


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("q", id="explicit-key"),
        pytest.param("", id="automatic-key"),
    ],
)
def test_a_question_that_changed_on_the_re_run_supersedes_the_old_one_under_a_fresh_key(
    key: str, redis_crash_stack: Stack
) -> None:
    stack = redis_crash_stack
    client = stack.client()
    replacement: Proc | None = None
    try:
        params = {"name": "t_attempt_question", "arguments": {"key": key}, "_meta": meta(elicitation={})}
        task_id = client.request("tools/call", params).result["taskId"]
        old = wait_until(lambda: outstanding(client, task_id), 30, what="the first run's question")
        ((old_key, old_request),) = old.items()
        assert old_request["params"]["message"] == "Attempt 1?"

        stack.worker.kill()
        replacement = support.start_worker(f"crash-redis-{SUFFIX}-{key or 'auto'}-worker2", stack.env)
        wait_until(lambda: lease_ran_out(stack, task_id), 15, what="the dead worker's lease to run out")
        assert sweep_lost_leases(stack) == 1

        def asked_again() -> dict[str, Any] | None:
            asked = outstanding(client, task_id)
            messages = [entry["params"]["message"] for entry in (asked or {}).values()]
            return asked if "Attempt 2?" in messages else None

        new = wait_until(asked_again, 30, what="the re-run's question")
        new_key = next(k for k, entry in new.items() if entry["params"]["message"] == "Attempt 2?")
        assert new_key != old_key
        # Only the re-run's question is outstanding; the first run's is superseded (S-26, S-31).
        assert set(new) == {new_key}, f"the first run's question is still outstanding: {new}"
        rows = {row["key"]: row for row in input_rows(stack, task_id)}
        assert set(rows) == {old_key, new_key}
        assert rows[old_key]["superseded"] is True and rows[old_key]["response"] is None
        assert rows[new_key]["superseded"] is False

        # The superseded key is ignored (acked); the fresh one finishes the task.
        assert client.update(task_id, {old_key: SECOND_ANSWER}).result["resultType"] == "complete"
        assert set(outstanding(client, task_id) or {}) == {new_key}
        assert client.update(task_id, {new_key: SECOND_ANSWER}).result["resultType"] == "complete"
        done = client.wait_status(task_id, timeout=30)
        assert done["result"]["structuredContent"] == {"answer": SECOND_ANSWER, "attempt": 2}
    finally:
        client.close()
        if replacement is not None:
            replacement.stop()
