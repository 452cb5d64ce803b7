"""The "Postgres answers" beacon of ``lease_self_fence=auto`` (``fencing``), through the broker.

The maintenance worker's main process checks Postgres every ``BEACON_INTERVAL_S`` and, when it
answered, publishes one small message to a fanout exchange; every prefork tool worker's main
process hears it on a queue of its own. A worker whose lease renewals fail but that still hears
the beacon is cut off from Postgres alone, and fences (``worker.watchdog``).

Cheap, and nothing piles up when nobody listens:

- the exchange is fanout and not durable: a message no queue is bound to is dropped (RabbitMQ),
  and on Redis a fanout message is a ``PUBLISH``, which keeps nothing;
- a listener's queue is exclusive and auto-deleted (RabbitMQ: it goes with its connection), and
  declared with ``x-expires`` and ``x-message-ttl`` (kombu's Redis transport expires the binding
  too); every message is transient and expires after ``BEACON_FRESH_S``;
- the body names no task, job, host or secret: a kind, a version, the deployment's namespace
  and when it was sent.

Namespaced: the exchange is ``mcp.beacon.<namespace>``, the namespace a digest of the database
name (the last part of ``database_url``, which the API, workers and the maintenance worker share
even when they log in as different roles) and the maintenance queue's name; a vhost (RabbitMQ)
or database number (Redis, kombu's fanout prefix) separates deployments already. A beacon from
another deployment on the same broker is never heard, and one that names another namespace (a
confused publisher) is ignored. Someone who may publish on the broker could still forge beacons
and make ``auto`` act as ``on`` while this worker is cut off; they can do worse with jobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Self
from urllib.parse import urlsplit

from kombu import Consumer, Exchange, Queue

from mcp_celery_tasks.broker.channel import broker_call
from mcp_celery_tasks.broker.fencing import BEACON_FRESH_S, BEACON_INTERVAL_S
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.transient import is_infrastructure

__all__ = ["BeaconListener", "BeaconSender", "beacon_body", "beacon_exchange", "namespace"]

logger = logging.getLogger("mcp_celery_tasks.beacon")

KIND = "postgres_answers"
QUEUE_EXPIRES_S = 60.0
"""A listener's queue that nobody consumed for this long is deleted (a killed worker's)."""
SILENT_AFTER_S = 30.0
"""A listener that heard no beacon this long after it started says so once (a maintenance
worker without ``lease_self_fence=auto`` never sends one)."""
_CONNECT_TIMEOUT_S = 2.0


def _database_name(url: str) -> str:
    if "://" in url:
        return urlsplit(url).path.lstrip("/")
    for part in url.split():  # libpq key=value form
        key, _, value = part.partition("=")
        if key == "dbname":
            return value
    return ""


def namespace(settings: Settings) -> str:
    """The deployment's beacon namespace (12 hex digits)."""
    seed = f"{_database_name(settings.database_url)}\n{settings.maintenance_queue}"
    return hashlib.sha256(seed.encode()).hexdigest()[:12]


def beacon_exchange(ns: str) -> Exchange:
    return Exchange(f"mcp.beacon.{ns}", type="fanout", durable=False, auto_delete=False, delivery_mode=1)


def _listener_queue(ns: str) -> Queue:
    name = f"mcp.beacon.{ns}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}"
    return Queue(
        name,
        beacon_exchange(ns),
        routing_key="",
        durable=False,
        exclusive=True,
        auto_delete=True,
        expires=QUEUE_EXPIRES_S,
        message_ttl=BEACON_FRESH_S,
    )


def beacon_body(ns: str, sent: float | None = None) -> dict[str, object]:
    return {"kind": KIND, "v": 1, "ns": ns, "sent": time.time() if sent is None else sent}


class _Loop:
    """A daemon thread that runs ``_run`` until ``stop``."""

    name = "mcp-beacon"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError


class BeaconSender(_Loop):
    """In the maintenance worker's main process: a beacon every interval in which
    ``postgres_answers()`` (one short query) returned, rather than raise ``InfrastructureError``."""

    name = "mcp-beacon-sender"

    def __init__(
        self,
        app: Any,
        settings: Settings,
        postgres_answers: Callable[[], object],
        interval_s: float = BEACON_INTERVAL_S,
    ) -> None:
        super().__init__()
        self._app = app
        self._ns = namespace(settings)
        self._answers = postgres_answers
        self._interval_s = interval_s
        self._conn: Any = None
        self.sent = 0

    def send_once(self) -> bool:
        """Check Postgres and, if it answered, publish one beacon; whether one went out."""
        try:
            self._answers()
        except InfrastructureError:
            return False
        exchange = beacon_exchange(self._ns)
        with broker_call("sending the beacon", on_failure=self._close):
            if self._conn is None:
                conn = self._app.connection_for_write()
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=_CONNECT_TIMEOUT_S)
                self._conn = conn
            self._conn.Producer(serializer="json").publish(
                beacon_body(self._ns),
                exchange=exchange,
                routing_key="",
                declare=[exchange],
                delivery_mode=1,
                expiration=BEACON_FRESH_S,
                retry=False,
            )
        self.sent += 1
        return True

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.release()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.send_once()
                failing = False
            except Exception as exc:
                if not failing:  # one line per outage, not one a second
                    logger.warning("beacon: could not send (%s); trying every second", exc)
                failing = True
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - began)))
        self._close()


class BeaconListener(_Loop):
    """In a prefork tool worker's main process: when this deployment's beacon was last heard."""

    name = "mcp-beacon-listener"

    def __init__(self, app: Any, settings: Settings) -> None:
        super().__init__()
        self._app = app
        self._ns = namespace(settings)
        self._heard_at: float | None = None
        self._started = time.monotonic()
        self._warned: set[str] = set()
        self.queue_name: str | None = None
        """The queue of the current connection (another after each reconnect)."""
        self.heard = 0
        self.ignored = 0

    def heard_ago(self) -> float | None:
        """Seconds since the last beacon of this deployment was heard; None if none was."""
        heard = self._heard_at
        return None if heard is None else time.monotonic() - heard

    def accept(self, body: object) -> bool:
        """Count ``body`` as a beacon if it is one of this deployment's, sent recently (by the
        wall clock: a message held back by a broker or a network counts no more)."""
        if not isinstance(body, dict) or body.get("kind") != KIND or body.get("ns") != self._ns:
            self.ignored += 1
            self._say_once("foreign", "beacon: ignored a message that is not this deployment's beacon")
            return False
        sent = body.get("sent")
        if not isinstance(sent, int | float) or abs(time.time() - sent) > BEACON_FRESH_S:
            self.ignored += 1
            self._say_once("stale", "beacon: ignored a stale one (are the hosts' clocks apart?)")
            return False
        self._heard_at = time.monotonic()
        self.heard += 1
        return True

    def _on_message(self, body: object, message: Any) -> None:
        self.accept(body)

    def _say_once(self, why: str, message: str) -> None:
        if why not in self._warned:
            self._warned.add(why)
            logger.warning(message, extra={"event": "worker.beacon_ignored", "why": why})

    def _run(self) -> None:
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._app.connection_for_read()
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=_CONNECT_TIMEOUT_S)
                queue = _listener_queue(self._ns)
                self.queue_name = queue.name
                with Consumer(
                    conn,
                    [queue],
                    callbacks=[self._on_message],
                    accept=["json"],
                    no_ack=True,
                ):
                    while not self._stop.is_set():
                        with contextlib.suppress(socket.timeout):
                            conn.drain_events(timeout=1.0)
                        conn.heartbeat_check()
                        self._say_if_silent()
            except Exception as exc:
                if not is_infrastructure(exc):
                    logger.exception("beacon: the listener failed; it starts again")
                self._stop.wait(1.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.release()

    def _say_if_silent(self) -> None:
        if self._heard_at is None and time.monotonic() - self._started > SILENT_AFTER_S:
            self._say_once(
                "silent",
                f"beacon: none heard in {SILENT_AFTER_S:g} s; lease_self_fence=auto fences nothing "
                "until one is (is the maintenance worker running, with lease_self_fence=auto?)",
            )
