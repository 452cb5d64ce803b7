"""Wake-ups on a real broker: the API's ``send_wake`` and a worker's ``Inbox``."""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Queue

from mcp_celery_tasks.broker import channel
from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.broker.channel import Inbox, send_wake
from mcp_celery_tasks.broker.operator import notify_cancelled
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
    assert notify_cancelled(settings, "job-0815", inbox.name) is None
    assert inbox.wait("job-0815", 5.0)


@pytest.fixture
def rabbit_app() -> Any:
    if os.environ.get("MCP_TASKS_TEST_EMBEDDED") == "1" or not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    return app_for(support.AMQP_URL)


def _exists(app: Any, name: str) -> bool:
    with app.connection_for_write() as conn:
        try:
            conn.default_channel.queue_declare(name, passive=True)
        except Exception as exc:  # NOT_FOUND closes the channel
            assert "NOT_FOUND" in str(exc) or "404" in str(exc), exc
            return False
        return True


def test_an_inbox_on_rabbitmq_expires_ten_minutes_after_its_last_use(rabbit_app: Any) -> None:
    """The queue carries our short ``x-expires`` on the server: a redeclaration with the old
    one-day value is refused, naming the value the queue really has."""
    box = Inbox(rabbit_app, f"mcpt.inbox.test.{uuid.uuid4().hex[:10]}")
    box.declare()
    try:
        with rabbit_app.connection_for_write() as conn:
            day = Queue(box.name, routing_key=box.name, durable=True, expires=86_400)
            with pytest.raises(Exception, match="x-expires") as refused:
                day(conn.default_channel).declare()
        assert str(channel.INBOX_EXPIRES_S * 1000) in str(refused.value), refused.value
    finally:
        with rabbit_app.connection_for_write() as conn:
            conn.default_channel.queue_delete(box.name)
        box.close()


def test_an_expired_inbox_is_gone_and_a_wake_up_brings_it_back(
    rabbit_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead process's inbox disappears once unused for ``INBOX_EXPIRES_S`` (1 s here); a
    wake-up sent after that declares it again and still reaches a waiter."""
    monkeypatch.setattr(channel, "INBOX_EXPIRES_S", 1)
    box = Inbox(rabbit_app, f"mcpt.inbox.test.{uuid.uuid4().hex[:10]}")
    box.declare()
    box.close()  # the process is gone: nobody consumes, declares or publishes
    try:
        # A passive declare counts as a use (it renews the lease): look less often than it expires.
        support.wait_until(lambda: not _exists(rabbit_app, box.name), 15, 2.0, what="the inbox to expire")
        send_wake(rabbit_app, box.name, "mine")
        assert box.wait("mine", 5.0)
    finally:
        with rabbit_app.connection_for_write() as conn:
            conn.default_channel.queue_delete(box.name)
        box.close()


def test_a_redis_connection_over_tcp_carries_the_keepalive_and_user_timeout() -> None:
    """What kombu really sets on the socket (``redis_tcp_user_timeout_ms``, default 3 s)."""
    if not support.REDIS_URL.startswith("redis://"):
        pytest.skip("Redis on a unix socket here: no TCP options")
    with app_for(support.REDIS_URL).connection_for_write() as conn:
        client = conn.default_channel.client
        client.ping()
        connection = client.connection_pool.get_connection()
        try:
            sock = connection._sock
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        finally:
            client.connection_pool.release(connection)
