"""The "Postgres answers" beacon of ``lease_self_fence=auto`` on real brokers (Redis, RabbitMQ):
heard by every listener of its deployment, by none of another's, not sent while Postgres does
not answer, and nothing left behind once nobody listens."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Queue

from mcp_celery_tasks.broker.beacon import (
    BeaconListener,
    BeaconSender,
    beacon_body,
    beacon_exchange,
    namespace,
)
from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from tests import support
from tests.support import wait_until


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return support.REDIS_URL
    if os.environ.get("MCP_TASKS_TEST_EMBEDDED") == "1" or not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    return support.AMQP_URL


def deployment(broker_url: str, database: str | None = None) -> Settings:
    """Settings of a deployment of its own: the beacon's namespace comes from the database name."""
    name = database or f"beacon_{uuid.uuid4().hex[:10]}"
    return Settings(database_url=support.dsn_for(name), broker_url=broker_url)


@pytest.fixture
def started() -> Iterator[list[Any]]:
    loops: list[Any] = []
    yield loops
    for loop in loops:
        loop.stop()


def listening(settings: Settings, started: list[Any]) -> BeaconListener:
    listener = BeaconListener(create_app(settings), settings).start()
    started.append(listener)
    wait_until(lambda: listener.queue_name is not None, 10, 0.02, what="the listener's queue")
    time.sleep(0.3)  # deliberate: the consumer subscribes just after its queue is declared
    return listener


def test_every_listener_of_the_deployment_hears_the_beacon(broker_url: str, started: list[Any]) -> None:
    settings = deployment(broker_url)
    first, second = listening(settings, started), listening(settings, started)
    sender = BeaconSender(create_app(settings), settings, lambda: None, interval_s=0.2).start()
    started.append(sender)
    wait_until(lambda: first.heard >= 3 and second.heard >= 3, 10, 0.05, what="beacons on both")
    ago = first.heard_ago()
    assert ago is not None and ago < 1.0
    assert first.ignored == second.ignored == 0


def test_another_deployments_beacon_is_never_heard(broker_url: str, started: list[Any]) -> None:
    ours, theirs = deployment(broker_url), deployment(broker_url)
    assert namespace(ours) != namespace(theirs)
    listener = listening(ours, started)
    sender = BeaconSender(create_app(theirs), theirs, lambda: None, interval_s=0.2).start()
    started.append(sender)
    wait_until(lambda: sender.sent >= 5, 10, 0.05, what="their beacons")
    assert listener.heard_ago() is None and listener.heard == 0
    # A confused publisher on our exchange: another deployment's body, a stale one, junk.
    with create_app(ours).connection_for_write() as conn:
        producer = conn.Producer(serializer="json")
        exchange = beacon_exchange(namespace(ours))
        for body in (
            beacon_body(namespace(theirs)),
            beacon_body(namespace(ours), sent=time.time() - 60),
            {"kind": "wake", "job_id": "x"},
        ):
            producer.publish(body, exchange=exchange, routing_key="", declare=[exchange], retry=False)
    wait_until(lambda: listener.ignored == 3, 10, 0.05, what="three messages ignored")
    assert listener.heard == 0 and listener.heard_ago() is None


def test_no_beacon_goes_out_while_postgres_does_not_answer(broker_url: str, started: list[Any]) -> None:
    settings = deployment(broker_url)
    listener = listening(settings, started)
    # A real store whose Postgres is not there (nothing listens on that port).
    gone = Settings(
        database_url=f"postgresql://postgres@127.0.0.1:{support.free_port()}/x",
        db_connect_timeout_seconds=1,
    )
    store = WorkerStore(gone)
    sender = BeaconSender(create_app(settings), settings, lambda: store.seconds_since_run("sweep"))
    assert sender.send_once() is False
    assert sender.send_once() is False
    time.sleep(0.5)  # deliberate: a beacon, had one gone out, would have arrived by now
    assert listener.heard == 0 and listener.heard_ago() is None


def test_a_beacon_that_nobody_hears_leaves_nothing_behind(broker_url: str, started: list[Any]) -> None:
    settings = deployment(broker_url)
    listener = listening(settings, started)
    queue_name = listener.queue_name
    assert queue_name is not None
    listener.stop()
    sender = BeaconSender(create_app(settings), settings, lambda: None)
    for _ in range(20):
        assert sender.send_once()
    app = create_app(settings)
    if broker_url.startswith("redis"):
        # A fanout message is a PUBLISH (nothing kept); the queue and its binding went with the
        # listener. kombu keeps one deadline per exchange name (``_kombu.binding_deadlines``).
        client = redis.Redis.from_url(broker_url)
        assert [k for k in client.keys("*") if namespace(settings).encode() in k] == []
        assert not client.exists(queue_name)
    else:
        with app.connection_for_write() as conn, pytest.raises(Exception, match=r"NOT_FOUND|404"):
            Queue(queue_name, channel=conn.default_channel).queue_declare(passive=True)
