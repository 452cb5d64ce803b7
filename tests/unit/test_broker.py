"""Broker profiles: chosen from the URL; each owns its transport options, redelivery limit and
queue-depth semantics (the e2e broker tests run the real brokers)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from celery import Celery

from mcp_celery_tasks import TaskContext, tool
from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.broker.channel import Inbox, broker_call, publish_job
from mcp_celery_tasks.broker.profiles import (
    BrokerProfile,
    RabbitMQProfile,
    RedeliveryLimit,
    RedisProfile,
    profile_for,
)
from mcp_celery_tasks.errors import BrokerUnreachable, InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.worker.celery_glue import check_input_timeouts


@tool(name="t_unit_broker_waiter", input_timeout=600)
def _waiter(ctx: TaskContext) -> str:
    return "never run"


@pytest.mark.parametrize(
    ("url", "profile"),
    [
        ("redis://127.0.0.1:6379/0", RedisProfile),
        ("rediss://cache.example:6380/1", RedisProfile),
        ("redis+socket:///tmp/redis.sock", RedisProfile),
        ("amqp://guest:guest@127.0.0.1:5672//", RabbitMQProfile),
        ("amqps://rabbit.example//", RabbitMQProfile),
        ("pyamqp://127.0.0.1//", RabbitMQProfile),
        ("amqp://a//;amqp://b//", RabbitMQProfile),
        ("memory://", BrokerProfile),
        ("", BrokerProfile),
        (None, BrokerProfile),
    ],
)
def test_the_profile_is_chosen_from_the_broker_url(url: str | None, profile: type[BrokerProfile]) -> None:
    assert type(profile_for(url)) is profile


def test_a_new_broker_is_one_new_class() -> None:
    class QueueServiceProfile(BrokerProfile):
        schemes = ("unit-test-queues",)

        def redelivery_limit(self, transport_options: Any, settings: Settings) -> RedeliveryLimit:
            return RedeliveryLimit(42.0, "unit-test visibility")

    found = profile_for("unit-test-queues://somewhere")
    assert isinstance(found, QueueServiceProfile)
    assert found.redelivery_limit({}, Settings()) == RedeliveryLimit(42.0, "unit-test visibility")


def test_an_app_built_for_redis_turns_kombus_ack_emulation_off_by_default() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:1/0", redis_visibility_timeout_seconds=7200)
    options = create_app(settings).conf.broker_transport_options
    assert options["ack_emulation"] is False and "visibility_timeout" not in options
    assert RedisProfile().redelivery_limit(options, settings) is None  # nothing comes back by time


def test_an_app_built_for_redis_with_ack_emulation_carries_the_visibility_timeout() -> None:
    settings = Settings(
        broker_url="redis://127.0.0.1:1/0", redis_ack_emulation=True, redis_visibility_timeout_seconds=7200
    )
    options = create_app(settings).conf.broker_transport_options
    assert options["visibility_timeout"] == 7200 and "ack_emulation" not in options


def test_redis_connections_are_bounded_against_a_silent_cut() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:1/0", redis_tcp_user_timeout_ms=4000)
    options = create_app(settings).conf.broker_transport_options
    assert options["socket_keepalive"] is True
    assert options["socket_keepalive_options"] == {
        socket.TCP_KEEPIDLE: 5,
        socket.TCP_KEEPINTVL: 2,
        socket.TCP_KEEPCNT: 3,
        socket.TCP_USER_TIMEOUT: 4000,
    }
    off = Settings(broker_url="redis://127.0.0.1:1/0", redis_tcp_user_timeout_ms=0)
    assert "socket_keepalive" not in create_app(off).conf.broker_transport_options


def test_an_app_built_for_rabbitmq_confirms_publishes() -> None:
    settings = Settings(broker_url="amqp://guest:guest@127.0.0.1:1//")
    assert create_app(settings).conf.broker_transport_options == {"confirm_publish": True}


def test_an_unknown_broker_gets_no_transport_options() -> None:
    assert create_app(Settings(broker_url="memory://")).conf.broker_transport_options == {}


def test_the_redis_limit_is_the_apps_own_visibility_timeout_or_kombus_default() -> None:
    settings = Settings(redis_visibility_timeout_seconds=99)
    redis = RedisProfile()
    assert redis.redelivery_limit({"visibility_timeout": 120}, settings) == RedeliveryLimit(
        120.0, "Redis visibility_timeout"
    )
    default = redis.redelivery_limit({}, settings)
    assert default is not None and default.seconds == 3600.0


def test_the_rabbitmq_limit_is_the_configured_consumer_timeout() -> None:
    settings = Settings(rabbitmq_consumer_timeout_seconds=900)
    assert RabbitMQProfile().redelivery_limit({}, settings) == RedeliveryLimit(
        900.0, "RabbitMQ consumer_timeout"
    )


def test_a_worker_refuses_a_team_app_whose_visibility_timeout_is_below_an_input_timeout() -> None:
    app = Celery("team", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 300}
    with pytest.raises(SystemExit, match=r"t_unit_broker_waiter.*600 s.*Redis visibility_timeout is 300 s"):
        check_input_timeouts(app, Settings(input_timeout_seconds=60, suspend_after_seconds=None))


def test_a_worker_whose_tools_suspend_sooner_starts_whatever_their_input_timeout() -> None:
    """A suspending job holds its slot (and the broker's message) only for ``suspend_after``: the
    broker's limit bounds that, not the input timeout (issue 27, item 4)."""
    app = Celery("team", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 300}
    check_input_timeouts(app, Settings(input_timeout_seconds=10**6, suspend_after_seconds=60))
    with pytest.raises(SystemExit, match=r"may wait 300 s for input holding its worker.*suspend_after"):
        check_input_timeouts(app, Settings(input_timeout_seconds=10**6, suspend_after_seconds=300))


def test_a_worker_of_our_own_redis_app_has_no_visibility_timeout_to_fit() -> None:
    app = create_app(Settings(broker_url="redis://127.0.0.1:1/0", input_timeout_seconds=10**6))
    check_input_timeouts(app, Settings(input_timeout_seconds=10**6))


def test_a_worker_starts_when_every_input_timeout_fits_the_rabbitmq_consumer_timeout() -> None:
    app = Celery("team", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    check_input_timeouts(app, Settings(input_timeout_seconds=60, rabbitmq_consumer_timeout_seconds=1800))


def test_a_worker_on_an_unknown_broker_has_no_limit_to_check() -> None:
    app = Celery("team", broker="memory://", set_as_current=False)
    check_input_timeouts(app, Settings(input_timeout_seconds=10**6))


def test_queue_depth_counts_waiting_messages_and_a_missing_queue_holds_none() -> None:
    app = Celery("depth", broker="memory://", set_as_current=False)
    profile = profile_for(app.conf.broker_url)
    assert profile.queue_depth(app, "unit.depth") == 0
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("unit.depth")
        queue.put({"n": 1})
        queue.put({"n": 2})
        assert profile.queue_depth(app, "unit.depth") == 2
        queue.close()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "amqp://guest:guest@127.0.0.1:1//"])
def test_a_broker_nobody_listens_on_comes_out_as_our_broker_error(url: str) -> None:
    # A real transport against a port nothing listens on: the driver's own error, wrapped.
    app = Celery("down", broker=url, set_as_current=False)
    # One connection try, no pause: what is tested is the wrapping (kombu's default retries of a
    # publish cost 6 s here, half of the unit suite's time).
    app.conf.broker_connection_timeout = 0.5
    app.conf.broker_transport_options = {
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0,
        "interval_max": 0,
    }
    inbox = Inbox(app, "mcp.inbox.unit.down")
    for call in (inbox.declare, lambda: inbox.wait("t", 0.1), lambda: publish_job(app, "j", "unit.q")):
        with pytest.raises(BrokerUnreachable) as raised:
            call()
        assert raised.value.__cause__ is not None
        assert not isinstance(raised.value.__cause__, BrokerUnreachable)
        assert isinstance(raised.value, InfrastructureError)


def test_a_broker_call_lets_our_own_bugs_through() -> None:
    with pytest.raises(KeyError), broker_call("a bug"):
        raise KeyError("not the broker's")
