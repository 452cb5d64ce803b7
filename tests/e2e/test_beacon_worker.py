"""``lease_self_fence=auto`` in a real prefork worker (``mcp-celery-tasks worker``) on each broker:
as the maintenance worker it sends the "Postgres answers" beacon, and its main process listens
(tests/faults/test_partitions.py shows what the fence then does across a real partition)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from mcp_celery_tasks.broker.beacon import BeaconListener, namespace
from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.settings import Settings
from tests import support
from tests.support import wait_until


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return support.REDIS_URL
    if os.environ.get("MCP_TASKS_TEST_EMBEDDED") == "1" or not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    return support.AMQP_URL


@pytest.fixture
def auto_worker(template_db: str, broker_url: str) -> Iterator[dict[str, str]]:
    name = f"mcpt_beacon_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name, template=template_db)
    env = support.stack_env(dsn, broker_url, f"b{uuid.uuid4().hex[:6]}", MCP_TASKS_LEASE_SELF_FENCE="auto")
    worker = support.start_worker("beacon-worker", env, concurrency=1)  # consumes the maintenance queue too
    try:
        yield env
    finally:
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)


def _listeners(broker_url: str, ns: str) -> int:
    """Consumers of this namespace's beacon, as the broker counts them."""
    if broker_url.startswith("redis"):  # kombu's binding table of the exchange (fanout: PSUBSCRIBE)
        members = redis.Redis.from_url(broker_url).smembers(f"_kombu.binding.mcp.beacon.{ns}")
        return sum(1 for member in members if f"mcp.beacon.{ns}.".encode() in member)
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "consumers", "messages"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    rows = [line.split() for line in listed.splitlines() if line.startswith(f"mcp.beacon.{ns}.")]
    assert all(row[2] == "0" for row in rows), rows  # nothing waits in a beacon queue
    return sum(int(row[1]) for row in rows)


def test_an_auto_worker_sends_the_beacon_and_listens_for_it(
    auto_worker: dict[str, str], broker_url: str
) -> None:
    settings = Settings(
        database_url=auto_worker["MCP_TASKS_DATABASE_URL"],
        broker_url=broker_url,
        maintenance_queue=auto_worker["MCP_TASKS_MAINTENANCE_QUEUE"],
    )
    ns = namespace(settings)
    wait_until(lambda: _listeners(broker_url, ns) >= 1, 60, 0.2, what="the worker's beacon listener")
    ours = BeaconListener(create_app(settings), settings).start()
    try:
        wait_until(lambda: ours.heard >= 2, 30, 0.1, what="the worker's beacons")
        assert _listeners(broker_url, ns) == 2  # the worker's and ours
        heard = ours.heard
        time.sleep(2.5)  # deliberate: about one beacon a second
        assert 1 <= ours.heard - heard <= 4, ours.heard - heard
        assert ours.ignored == 0
    finally:
        ours.stop()
