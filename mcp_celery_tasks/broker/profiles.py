"""Where brokers differ: one profile class per broker, chosen from the broker URL.

A profile owns everything that is not the same on Redis and RabbitMQ: the Celery transport
options, the limit past which the broker takes an unacknowledged job back (checked against the
tools' input timeouts when a worker starts), and what "messages waiting in a queue" means. The
rest of the package asks ``profile_for(url)`` and never looks at a URL scheme itself; a third
broker is one new subclass (it registers its schemes by being defined).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

from kombu.exceptions import OperationalError
from kombu.transport.virtual import base as virtual_base

from mcp_celery_tasks.settings import Settings

__all__ = [
    "BrokerProfile",
    "RabbitMQProfile",
    "RedeliveryLimit",
    "RedisProfile",
    "TransportOptions",
    "keep_emergency_dumps_out",
    "profile_for",
]

KOMBU_REDIS_VISIBILITY_TIMEOUT_S = 3600.0
"""kombu's Redis default when the transport options do not set one."""


@dataclass(frozen=True, slots=True)
class RedeliveryLimit:
    """How long the broker lets a job stay unacknowledged, and what the operator calls that."""

    seconds: float
    name: str


class TransportOptions(TypedDict, total=False):
    """The kombu ``broker_transport_options`` we set (each profile sets only its own)."""

    ack_emulation: bool
    """Redis: off by default (``redis_ack_emulation``)."""
    visibility_timeout: float
    """Redis with ack emulation: seconds before an unacknowledged job is delivered again."""
    confirm_publish: bool
    """RabbitMQ: publisher confirms."""
    socket_keepalive: bool
    """Redis over TCP: keepalives (``redis_tcp_user_timeout_ms``)."""
    socket_keepalive_options: dict[int, int]
    """Redis over TCP: ``TCP_KEEPIDLE``, ``TCP_KEEPINTVL``, ``TCP_KEEPCNT``, ``TCP_USER_TIMEOUT``."""


class BrokerProfile:
    """A broker with no special handling: no transport options, no known redelivery limit.

    Also the profile of a broker no subclass claims, so an unknown broker behaves as before
    profiles existed.
    """

    schemes: ClassVar[tuple[str, ...]] = ()
    """URL schemes (the transport part, before any ``+``) this profile is chosen for."""

    _registry: ClassVar[dict[str, type[BrokerProfile]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for scheme in cls.schemes:
            BrokerProfile._registry[scheme] = cls

    def transport_options(self, settings: Settings) -> TransportOptions:
        """Celery's ``broker_transport_options`` for an app built from ``settings``."""
        return {}

    def redelivery_limit(
        self, transport_options: Mapping[str, Any], settings: Settings
    ) -> RedeliveryLimit | None:
        """How long a job may run unacknowledged before the broker acts; None if unknown.

        ``transport_options`` are the app's own (a team's app may set them differently from
        ``settings``).
        """
        return None

    def queue_depth(self, app: Any, queue_name: str, timeout_s: float = 5.0) -> int | None:
        """Messages waiting in ``queue_name`` (those delivered to a worker are not counted); None
        when the broker cannot be asked. A queue that does not exist holds none."""
        with app.connection_for_write() as conn:
            try:
                conn.ensure_connection(max_retries=1, timeout=timeout_s)
                channel = conn.channel()
            except (*conn.connection_errors, OperationalError):
                return None
            try:
                return int(channel.queue_declare(queue=queue_name, passive=True).message_count)
            except conn.channel_errors:
                return 0
            except (*conn.connection_errors, OperationalError):
                return None
            finally:
                with contextlib.suppress(Exception):
                    channel.close()


class RedisProfile(BrokerProfile):
    """Redis: a delivered job leaves the list. By default (``redis_ack_emulation`` off) it is
    gone from Redis from then on: a graceful stop or a killed child puts it back, and the
    sweeper re-publishes the jobs of a worker that died. With kombu's ack emulation on, a job
    unacknowledged past ``visibility_timeout`` is delivered again.

    Queue depth: a Redis queue is a list, and an empty list is no key at all, so a queue that
    does not exist is the normal empty case (0). A delivered message is not counted as waiting.
    """

    schemes = ("redis", "rediss")

    def transport_options(self, settings: Settings) -> TransportOptions:
        options: TransportOptions = {}
        if not settings.redis_ack_emulation:
            options["ack_emulation"] = False
        else:
            # Above the longest job including input waits: the lease sweeper, not the visibility
            # timeout, is the fast recovery path after a crash.
            options["visibility_timeout"] = settings.redis_visibility_timeout_seconds
        if settings.redis_tcp_user_timeout_ms:
            # kombu drops both for a unix socket (redis+socket://).
            options["socket_keepalive"] = True
            options["socket_keepalive_options"] = {
                socket.TCP_KEEPIDLE: 5,
                socket.TCP_KEEPINTVL: 2,
                socket.TCP_KEEPCNT: 3,
                socket.TCP_USER_TIMEOUT: settings.redis_tcp_user_timeout_ms,
            }
        return options

    def redelivery_limit(
        self, transport_options: Mapping[str, Any], settings: Settings
    ) -> RedeliveryLimit | None:
        if not transport_options.get("ack_emulation", True):
            return None  # nothing is ever redelivered by time
        seconds = float(transport_options.get("visibility_timeout", KOMBU_REDIS_VISIBILITY_TIMEOUT_S))
        return RedeliveryLimit(seconds, "Redis visibility_timeout")


class RabbitMQProfile(BrokerProfile):
    """RabbitMQ: past ``consumer_timeout`` the broker closes the channel (and Celery 5.7 stops the
    whole worker); publishes are confirmed, so a job the API published is really queued.

    Queue depth: a passive declare of a queue that does not exist fails (404), and nothing waits
    there (0); a message whose worker lost its connection is requeued and counted again.
    """

    schemes = ("amqp", "amqps", "pyamqp")

    def transport_options(self, settings: Settings) -> TransportOptions:
        return {"confirm_publish": True}

    def redelivery_limit(self, transport_options: Mapping[str, Any], settings: Settings) -> RedeliveryLimit:
        # Set on the server (rabbitmq.conf), not by the client: the setting mirrors it.
        return RedeliveryLimit(settings.rabbitmq_consumer_timeout_seconds, "RabbitMQ consumer_timeout")


def profile_for(broker_url: str | None) -> BrokerProfile:
    """The profile of the broker at ``broker_url`` (a failover list uses its first URL)."""
    first = (broker_url or "").split(";", 1)[0].strip()
    scheme = first.partition("://")[0].partition("+")[0].lower()  # redis+socket:// is Redis
    return BrokerProfile._registry.get(scheme, BrokerProfile)()


def _job_of(message: Any) -> str:
    """The job id of an unrestored message: kombu 5.6 passes ``message.serializable()`` dicts,
    5.5 the messages themselves."""
    if not isinstance(message, dict):
        serializable = getattr(message, "serializable", None)
        if callable(serializable):
            with contextlib.suppress(Exception):
                message = serializable()
    if isinstance(message, dict):
        return str((message.get("headers") or {}).get("id", "?"))
    return "?"


def keep_emergency_dumps_out() -> None:
    """No kombu "emergency dump" files in the temporary folder (issue 28).

    A virtual transport (Redis) that loses its connection tries to put its delivered but
    unacknowledged messages back, fails (the server is gone) and pickles them into a new file in
    ``/tmp`` on every connection loss, which nobody reads and nothing removes. Here the jobs are
    rows: the sweeper publishes again every job whose message was lost (a lapsed lease, or one
    never started). So the job ids are logged instead, and no file is written.
    """
    virtual_base.emergency_dump_state = _log_unrestored  # type: ignore[attr-defined]  # what its QoS calls


def _log_unrestored(state: Any, open_file: Any = None, dump: Any = None, stderr: Any = None) -> None:
    jobs = [_job_of(message) for message in state or ()]
    logging.getLogger("mcp_celery_tasks.channel").warning(
        "the broker connection was lost with %d unacknowledged messages that could not be put "
        "back (jobs %s); the sweeper publishes their jobs again",
        len(jobs),
        ", ".join(jobs[:20]),
        extra={"event": "broker.unrestored", "jobs": jobs[:100]},
    )
