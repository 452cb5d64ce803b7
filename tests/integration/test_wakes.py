"""Wake-ups on a real broker: the API's ``send_wake`` and a worker's ``Inbox``."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.broker.channel import Inbox, send_wake
from mcp_celery_tasks.cli.admin.tasks import _notify_broker
from mcp_celery_tasks.settings import Settings
from tests import support
from tests.support import wait_until


def app_for(broker_url: str) -> Any:
    return create_app(Settings(database_url=support.dsn_for("unused"), broker_url=broker_url))


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return support.REDIS_URL
    if os.environ.get("MCP_TASKS_TEST_EMBEDDED") == "1" or not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    return support.AMQP_URL


@pytest.fixture
def inbox(broker_url: str) -> Iterator[Inbox]:
    app = app_for(broker_url)
    box = Inbox(app, f"mcpt.inbox.test.{uuid.uuid4().hex[:10]}")
    box.declare()
    yield box
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(box.name)
    finally:
        box.close()


def test_a_wake_up_reaches_the_waiter_and_others_are_ignored(broker_url: str, inbox: Inbox) -> None:
    app = app_for(broker_url)
    send_wake(app, inbox.name, "someone-else")
    assert not inbox.wait("mine", 0.3)  # a wake-up for another task does not end this wait
    send_wake(app, inbox.name, "mine")
    assert inbox.wait("mine", 5.0)
    # Consumed without acknowledgement: nothing is left or redelivered to the next wait.
    assert not inbox.wait("mine", 0.3)


def redis_commands_on(key: str, during: Any) -> list[str]:
    """The commands Redis ran on ``key`` (MONITOR) while ``during()`` ran."""
    client = redis.Redis.from_url(support.REDIS_URL)
    seen: list[str] = []
    ready = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            ready.set()
            for event in monitor.listen():
                command = str(event.get("command", ""))
                if key in command:
                    seen.append(command.split()[0].upper())
                if done.is_set() and command.startswith("ECHO") and "mcpt-monitor-end" in command:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ready.wait(5)
    try:
        during()
    finally:
        done.set()
        client.echo("mcpt-monitor-end")
        watcher.join(10)
        client.close()
    assert not watcher.is_alive(), "MONITOR never saw the end marker"
    return seen


# MONITOR has Redis copy every command of every client to this test: beside another xdist
# worker's busy stacks it slows them all, and this test wades through their traffic.
@pytest.mark.serial
def test_a_wake_up_costs_one_push_and_no_acknowledgement_on_redis(inbox: Inbox, broker_url: str) -> None:
    if not broker_url.startswith("redis"):
        pytest.skip("counted with Redis MONITOR")
    app = app_for(broker_url)

    def three_wake_ups() -> None:
        for n in range(3):
            send_wake(app, inbox.name, f"t{n}")

    commands = redis_commands_on(inbox.name, three_wake_ups)
    assert commands.count("LPUSH") == 3, commands
    # The publisher's connection declares the inbox (an LLEN per priority step) before its first
    # wake-up only; each push still refreshes the inbox's TTL.
    assert "LLEN" in commands and "LLEN" not in commands[commands.index("LPUSH") :], commands
    assert commands.count("PEXPIRE") >= 3, commands
    # The waiter consumes with no_ack: no unacked bookkeeping on its path.
    assert redis_commands_on("unacked", lambda: inbox.wait("t2", 5.0)) == []


def test_a_wake_up_names_the_job_and_never_the_task(broker_url: str, inbox: Inbox) -> None:
    # Task ids are bearer-like: broker tooling (management UIs, MONITOR, dumps) shows message
    # bodies, so a wake-up carries the job id only.
    app = app_for(broker_url)
    send_wake(app, inbox.name, "job-4711")
    with app.connection_for_write() as conn:
        message = wait_until(lambda: conn.default_channel.basic_get(inbox.name, no_ack=True), 5, 0.05)
        body = json.loads(message.body)
    assert body == {"type": "wake", "job_id": "job-4711"}


def test_an_operator_cancel_wakes_by_job_id(broker_url: str, inbox: Inbox) -> None:
    # `tasks cancel` of a job waiting for input wakes it the way tasks/cancel does: by job id.
    settings = Settings(database_url=support.dsn_for("unused"), broker_url=broker_url)
    assert _notify_broker(settings, "job-0815", inbox.name) is None
    assert inbox.wait("job-0815", 5.0)
