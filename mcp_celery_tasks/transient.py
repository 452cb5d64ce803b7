"""Infrastructure blips: which errors are the database's or the broker's, and riding them out.

A job must not pay for a broker restart or a Postgres failover: the runtime retries its own
store and broker calls with bounded backoff for up to an outage budget
(``outage_budget_seconds``), and tool code never sees such an error. ``is_infrastructure`` is
the one place that decides what counts; it names the client libraries' exception classes
instead of importing them, so this module stays free of every library's home.

**The one retry policy.** Every wait after an infrastructure failure is a ``Backoff`` named
here, so the timings are read (and changed) in one place:

- ``OUTAGE``: a running job's own store and broker calls (``ride_out``'s default), 0.2 s
  doubling to 5 s, for up to the outage budget;
- ``OUTCOME_WRITE``: recording a finished job's outcome, 0.5 s doubling to 5 s, for up to
  ``finish_retry_seconds`` (the work is done and must not be redone);
- ``REQUEUE``: the Celery countdown of a job given back after an outage under its tool, 1 s
  doubling to 60 s by the job's attempts;
- ``LEASE_RENEWAL``: the lease thread's next try of a renewal that failed, every second (the
  lease must be back the moment the database is).
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from mcp_celery_tasks.errors import InfrastructureError

__all__ = [
    "LEASE_RENEWAL",
    "OUTAGE",
    "OUTCOME_WRITE",
    "REQUEUE",
    "Backoff",
    "OutageTooLong",
    "is_infrastructure",
    "ride_out",
]

logger = logging.getLogger("mcp_celery_tasks.blips")

T = TypeVar("T")

_INFRASTRUCTURE: Final = frozenset(
    {
        # redis-py (BusyLoadingError is a ConnectionError; ReadOnlyError: a failover in progress)
        "redis.exceptions.ConnectionError",
        "redis.exceptions.TimeoutError",
        "redis.exceptions.ReadOnlyError",
        # kombu wraps transport errors in OperationalError; py-amqp's own connection errors
        # (ConnectionForced on a broker restart or `rabbitmqctl close_connection`)
        "kombu.exceptions.OperationalError",
        "amqp.exceptions.ConnectionError",
        "amqp.exceptions.RecoverableConnectionError",
        # psycopg 3 (AdminShutdown, QueryCanceled and connection failures are OperationalErrors)
        "psycopg.OperationalError",
        "psycopg.InterfaceError",
        "psycopg.errors.ReadOnlySqlTransaction",  # a failover: connected to a standby
        # SQLAlchemy
        "sqlalchemy.exc.OperationalError",
        "sqlalchemy.exc.InterfaceError",
        "sqlalchemy.exc.DisconnectionError",
    }
)

_SOCKET_ERRNOS: Final = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.ENOTCONN,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ESHUTDOWN,
        errno.ENOENT,  # a unix socket whose server is gone
    }
)


def _names(exc: BaseException) -> set[str]:
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__}


def is_infrastructure(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is the database or the broker failing,
    as opposed to a bug or a tool's own error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, InfrastructureError):
            return True
        if _names(current) & _INFRASTRUCTURE:
            return True
        if getattr(current, "connection_invalidated", False):  # sqlalchemy DBAPIError: a disconnect
            return True
        if isinstance(current, ConnectionError | TimeoutError):  # socket-level (builtins)
            return True
        if isinstance(current, OSError) and current.errno in _SOCKET_ERRNOS and _from_socket(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _from_socket(exc: OSError) -> bool:
    # A plain OSError with a connection errno, raised by a client library (ENOENT only counts for
    # a socket path, never for a file the tool opened: such errors carry a filename).
    return exc.filename is None


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses between tries that double from ``first_s`` up to ``max_s``."""

    first_s: float
    max_s: float

    def pause(self, failures: int) -> float:
        """The pause after ``failures`` failures in a row (1: after the first)."""
        return min(self.max_s, self.first_s * 2.0 ** min(max(failures - 1, 0), 64))


OUTAGE: Final = Backoff(first_s=0.2, max_s=5.0)
OUTCOME_WRITE: Final = Backoff(first_s=0.5, max_s=5.0)
REQUEUE: Final = Backoff(first_s=1.0, max_s=60.0)
LEASE_RENEWAL: Final = Backoff(first_s=1.0, max_s=1.0)


class OutageTooLong(InfrastructureError):
    """The database or the broker stayed unreachable for longer than the outage budget."""


def ride_out(
    call: Callable[[], T],
    *,
    budget_s: float,
    what: str,
    backoff: Backoff = OUTAGE,
    stop: Callable[[], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, retried with ``backoff``'s pauses while it fails with an infrastructure error.

    Raises ``OutageTooLong`` (chained to the last error) once ``budget_s`` has passed, or at once
    when ``stop()`` turns true (the worker is shutting down). Any other error passes through.
    """
    started = time.monotonic()
    failures = 0
    while True:
        try:
            result = call()
        except Exception as exc:
            if not is_infrastructure(exc):
                raise
            failures += 1
            waited = time.monotonic() - started
            if waited >= budget_s or (stop is not None and stop()):
                raise OutageTooLong(
                    f"the task database or broker was unreachable for {waited:.0f} s ({what})"
                ) from exc
            if failures == 1:
                logger.warning("%s failed (%s); retrying for up to %g s", what, type(exc).__name__, budget_s)
            sleep(min(backoff.pause(failures), budget_s - waited))
            continue
        if failures:
            logger.info("%s succeeded after %d failures (%.1f s)", what, failures, time.monotonic() - started)
        return result
