"""Broker traffic that is not Celery's own: inbox queues and the API's publisher thread.

Every broker operation of the API (publish a job, wake a waiting worker, revoke a job) runs
on one publisher thread, never on the event loop: a synchronous publish on the loop measured
100-250 ms p99 (shared/bench). Each operation has a deadline; after repeated failures a
circuit breaker stops trying for a while. A job that was not published stays in the outbox
(``dispatched_at IS NULL``) and the beat sweeper publishes it later; a lost wake-up costs
latency only, because the waiter re-reads its row.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kombu import Consumer, Exchange, Queue

from mcp_celery_tasks.broker.profiles import profile_for
from mcp_celery_tasks.errors import BrokerUnreachable
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.transient import is_infrastructure

__all__ = [
    "RUN_TOOL",
    "CircuitBreaker",
    "Inbox",
    "Publisher",
    "batched",
    "broker_call",
    "inbox_queue",
    "publish_job",
    "queue_depth",
    "send_wake",
]

logger = logging.getLogger("mcp_celery_tasks.channel")

RUN_TOOL = "mcp_celery_tasks.run_tool"
INBOX_EXPIRES_S = 600
"""An inbox nobody consumes, declares or publishes to for this long is deleted by the broker
(``x-expires``): a dead worker process's queue goes 10 minutes after it, not a day (issue 28).
A live process loses nothing by it: its inbox is consumed while it waits, declared again
before every wait, and ``send_wake`` declares it on the way, so an expired inbox comes back
with the wake-up in it (a wake-up is a hint anyway: the waiter re-reads its row). Changing it
is a deploy step: RabbitMQ refuses a redeclaration with another value until the queues of the
processes that run the old one are gone."""
_FLUSH_DELAY_S = 0.1
_CONNECT_TIMEOUT_S = 2.0
_DEFAULT_EXCHANGE = Exchange("")


@contextlib.contextmanager
def broker_call(what: str, on_failure: Callable[[], object] | None = None) -> Iterator[None]:
    """Around a broker call: a transport's error (``transient.is_infrastructure``) comes out as
    ``BrokerUnreachable`` naming ``what``, its cause attached; ``on_failure`` runs first (e.g.
    drop the connection). Any other error passes through."""
    try:
        yield
    except BrokerUnreachable:
        raise
    except Exception as exc:
        if not is_infrastructure(exc):
            raise
        if on_failure is not None:
            on_failure()
        raise BrokerUnreachable(f"the broker failed ({what}): {type(exc).__name__}") from exc


def batched(producer: Any) -> contextlib.AbstractContextManager[object]:
    """The producer's publishes in one kombu batch where kombu has ``Producer.batch`` (5.7: one
    pipelined round trip on Redis); older kombu publishes each message at once."""
    batch = getattr(producer, "batch", None)
    return batch() if batch is not None else contextlib.nullcontext()


def inbox_queue(name: str) -> Queue:
    """A worker process's inbox. API and worker MUST build it with identical arguments
    (RabbitMQ refuses a redeclaration with a different ``x-expires``)."""
    return Queue(
        name,
        _DEFAULT_EXCHANGE,
        routing_key=name,
        durable=True,
        auto_delete=False,
        expires=INBOX_EXPIRES_S,
    )


def publish_job(
    app: Any, job_id: str, queue_name: str, headers: dict[str, str] | None = None, producer: Any = None
) -> None:
    """Publish ``run_tool(job_id)`` with the job id as Celery task id (a quarter cheaper than
    ``send_task``, which also builds a result handle we never use). ``headers`` carry the
    trace context into the job. ``producer``: one the caller holds (e.g. in a ``batch()``)."""
    message = app.amqp.create_task_message(job_id, RUN_TOOL, [job_id], {})
    if headers:
        message.headers.update(headers)
    with broker_call(f"publishing job {job_id}"):
        if producer is not None:
            app.amqp.send_task_message(producer, RUN_TOOL, message, queue=queue_name, retry=False)
            return
        with app.producer_or_acquire() as producer:
            app.amqp.send_task_message(producer, RUN_TOOL, message, queue=queue_name, retry=False)


def queue_depth(app: Any, queue_name: str, timeout_s: float = 5.0) -> int | None:
    """Messages waiting in ``queue_name``; None when the broker cannot be asked (what counts as
    waiting is the broker profile's business)."""
    return profile_for(app.conf.broker_url).queue_depth(app, queue_name, timeout_s)


def send_wake(app: Any, inbox: str, job_id: str, timeout_s: float = 5.0) -> None:
    """Wake the worker waiting on ``inbox`` for job ``job_id``. The message names the job,
    never the task: a task id is bearer-like, and broker tooling shows message bodies.

    The inbox is declared on the way: RabbitMQ drops messages to a queue that does not exist;
    Redis applies ``x-expires`` only for a declaring publisher. kombu declares it once per pooled
    connection, not on every wake-up (the queue's ``queue_arguments`` are built at declaration,
    so ``can_cache_declaration`` holds); the worker declares its inbox before every wait anyway."""
    with (
        broker_call(f"waking {inbox}"),
        app.producer_pool.acquire(block=True, timeout=timeout_s) as producer,
    ):
        producer.publish(
            {"type": "wake", "job_id": job_id},
            exchange=_DEFAULT_EXCHANGE,
            routing_key=inbox,
            declare=[inbox_queue(inbox)],
            serializer="json",
            retry=False,
        )


class CircuitBreaker:
    """Open after ``failures`` consecutive errors; half-open again after ``reset_s``."""

    def __init__(self, failures: int, reset_s: float) -> None:
        self._limit = failures
        self._reset_s = reset_s
        self._failures = 0
        self._opened_at: float | None = None

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        return "half-open" if time.monotonic() - self._opened_at >= self._reset_s else "open"

    def allow(self) -> bool:
        return self.state != "open"

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None

    def failure(self) -> None:
        self._failures += 1
        if self._failures >= self._limit:
            self._opened_at = time.monotonic()


@dataclass(frozen=True, slots=True)
class _Op:
    kind: str  # "job" | "wake" | "revoke"
    deadline: float
    job_id: str = ""
    queue: str = ""
    inbox: str = ""
    probe: concurrent.futures.Future[bool] | None = None
    headers: dict[str, str] | None = None


class Publisher:
    """The API's single broker thread."""

    def __init__(
        self,
        app: Any,
        *,
        on_published: Callable[[Sequence[str]], object],
        deadline_s: float,
        breaker: CircuitBreaker,
    ) -> None:
        self._app = app
        self._on_published = on_published
        self._deadline_s = deadline_s
        self.breaker = breaker
        self._queue: queue.Queue[_Op | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="mcp-publisher", daemon=True)
        self.published = 0
        self.dropped = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    # ---- called from the event loop: never blocks ------------------------------------------

    def publish_job(self, job_id: str, queue_name: str, headers: dict[str, str] | None = None) -> None:
        deadline = time.monotonic() + self._deadline_s
        self._queue.put(_Op("job", deadline, job_id=job_id, queue=queue_name, headers=headers))

    def wake(self, inbox: str, job_id: str) -> None:
        self._queue.put(_Op("wake", time.monotonic() + self._deadline_s, inbox=inbox, job_id=job_id))

    def revoke(self, job_id: str) -> None:
        self._queue.put(_Op("revoke", time.monotonic() + self._deadline_s, job_id=job_id))

    def check_broker(self) -> concurrent.futures.Future[bool]:
        """Resolves True once the publisher thread reached the broker (for readiness)."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._queue.put(_Op("ping", time.monotonic() + self._deadline_s, probe=done))
        return done

    # ---- the thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        published: list[str] = []
        first_unflushed = 0.0
        while True:
            wait = max(0.0, first_unflushed + _FLUSH_DELAY_S - time.monotonic()) if published else 1.0
            try:
                op = self._queue.get(timeout=wait)
            except queue.Empty:
                op = _Op("idle", 0.0)
            if op is None:
                self._flush(published)
                return
            if op.kind != "idle":
                before = len(published)
                self._run(op, published)
                if before == 0 and published:
                    first_unflushed = time.monotonic()
            # dispatched_at only matters to the sweeper (tens of seconds): batch the marks.
            due = published and time.monotonic() - first_unflushed >= _FLUSH_DELAY_S
            if published and (due or len(published) >= 500):
                self._flush(published)

    def _run(self, op: _Op, published: list[str]) -> None:
        if op.kind == "ping":
            self._ping(op)
            return
        if time.monotonic() > op.deadline or not self.breaker.allow():
            # Left for the sweeper (jobs) or for the waiter's own re-reads (wake-ups).
            self.dropped += 1
            return
        try:
            if op.kind == "job":
                publish_job(self._app, op.job_id, op.queue, op.headers)
                published.append(op.job_id)
                self.published += 1
            elif op.kind == "wake":
                send_wake(self._app, op.inbox, op.job_id, self._deadline_s)
            elif op.kind == "revoke":
                self._app.control.revoke(op.job_id)
            self.breaker.success()
            metrics.breaker_open.set(0)
        except Exception:
            self.breaker.failure()
            metrics.breaker_open.set(1 if self.breaker.state == "open" else 0)
            self.dropped += 1
            logger.warning(
                "broker operation %s failed (breaker %s)", op.kind, self.breaker.state, exc_info=True
            )

    def _ping(self, op: _Op) -> None:
        assert op.probe is not None
        try:
            with self._app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
            op.probe.set_result(True)
        except Exception:
            op.probe.set_result(False)

    def _flush(self, published: list[str]) -> None:
        if not published:
            return
        try:
            self._on_published(list(published))
        except Exception:
            # The sweeper re-publishes rows that still look undispatched; a duplicate job is
            # harmless (the claim lets one run through).
            logger.warning("could not mark %d jobs dispatched", len(published), exc_info=True)
        published.clear()


class Inbox:
    """One worker process's inbox queue: wake-ups for the jobs it waits on (by job id).

    A wake-up is a hint: the waiter re-reads its row. So wake-ups are consumed without
    acknowledgement (``no_ack``): on Redis that takes the unacked bookkeeping off the wake-up's
    path (0.55 → 0.39 ms p50 from publish to the waiter returning, idle machine), and a hint
    lost with a dying process costs nothing. Wake-ups for other jobs (left over from an
    earlier wait) are ignored. A broker error drops the connection and is raised as
    ``BrokerUnreachable``: the runtime then polls the row until the broker is back, and the next
    call connects again.
    """

    def __init__(self, app: Any, name: str) -> None:
        self._app = app
        self.name = name
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None:
            conn = self._app.connection_for_write()
            try:
                # One quick try: the caller polls its row meanwhile, and tries again.
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=_CONNECT_TIMEOUT_S)
            except BaseException:
                conn.release()
                raise
            self._conn = conn
        return self._conn

    def declare(self) -> None:
        with broker_call(f"declaring {self.name}", on_failure=self.close):
            inbox_queue(self.name)(self._connection().default_channel).declare()

    def wait(self, job_id: str, timeout_s: float, task_id: str = "") -> bool:
        """Block up to ``timeout_s`` for a wake-up naming ``job_id``; True if one came."""
        woke = False

        def on_message(body: Any, message: Any) -> None:
            nonlocal woke
            if isinstance(body, dict) and body.get("job_id") == job_id:
                woke = True

        deadline = time.monotonic() + timeout_s
        # On failure: connect again next time; the caller polls its row meanwhile.
        with broker_call(f"waiting on {self.name}", on_failure=self.close):
            conn = self._connection()
            with Consumer(
                conn, [inbox_queue(self.name)], callbacks=[on_message], accept=["json"], no_ack=True
            ):
                while not woke:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    with contextlib.suppress(socket.timeout):
                        conn.drain_events(timeout=min(left, 1.0))
                    conn.heartbeat_check()
        return woke

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.release()
            except Exception:
                logger.debug("closing the inbox connection failed", exc_info=True)
            self._conn = None
