"""What counts as an infrastructure error (the one classification every retry uses), and the
bounded retry loop that rides out an outage."""

from __future__ import annotations

import errno

import amqp.exceptions
import kombu.exceptions
import psycopg
import psycopg.errors
import pytest
import redis.exceptions
import sqlalchemy.exc

from mcp_celery_tasks.errors import InfrastructureError, ToolError
from mcp_celery_tasks.transient import (
    LEASE_RENEWAL,
    OUTAGE,
    OUTCOME_WRITE,
    REQUEUE,
    Backoff,
    OutageTooLong,
    is_infrastructure,
    ride_out,
)


def _chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ConnectionError("Connection closed by server."),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        kombu.exceptions.OperationalError("[Errno 111] Connection refused"),
        amqp.exceptions.ConnectionForced("CONNECTION_FORCED - Closed via management plugin"),
        amqp.exceptions.RecoverableConnectionError("connection already closed"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.InterfaceError("the connection is closed"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
        sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("gone")),
        sqlalchemy.exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        BrokenPipeError(errno.EPIPE, "Broken pipe"),
        TimeoutError("timed out"),
        OSError(errno.ECONNREFUSED, "Connection refused"),
        InfrastructureError("the task database is unavailable"),
        _chained(RuntimeError("wrapped"), redis.exceptions.ConnectionError("down")),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_broker_and_database_failures_are_infrastructure(exc: BaseException) -> None:
    assert is_infrastructure(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad input"),
        KeyError("missing"),
        ToolError("the tool said no"),
        FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/in.csv"),
        PermissionError(errno.EACCES, "Permission denied"),
        psycopg.errors.UniqueViolation("duplicate key value"),
        psycopg.errors.UndefinedTable("relation does not exist"),
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key"),
        sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate")),
        sqlalchemy.exc.DBAPIError("SELECT 1", {}, Exception("bad"), connection_invalidated=False),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_bugs_and_tool_errors_are_not_infrastructure(exc: BaseException) -> None:
    assert not is_infrastructure(exc)


def test_a_cycle_of_causes_ends_the_search() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert not is_infrastructure(first)


class Flaky:
    """Fails ``times`` times with ``error``, then returns ``value``."""

    def __init__(self, times: int, error: BaseException, value: str = "ok") -> None:
        self.left = times
        self.error = error
        self.value = value
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.error
        return self.value


def test_ride_out_retries_an_infrastructure_error_with_doubling_pauses() -> None:
    pauses: list[float] = []
    call = Flaky(4, redis.exceptions.ConnectionError("down"))
    assert ride_out(call, budget_s=60, what="x", backoff=Backoff(0.1, 0.5), sleep=pauses.append) == "ok"
    assert call.calls == 5 and pauses == [0.1, 0.2, 0.4, 0.5]


def test_ride_out_lets_any_other_error_through_at_once() -> None:
    call = Flaky(3, ValueError("a bug"))
    with pytest.raises(ValueError):
        ride_out(call, budget_s=60, what="x", sleep=lambda _: None)
    assert call.calls == 1


def test_ride_out_gives_up_past_the_budget_with_the_cause_attached() -> None:
    call = Flaky(1000, psycopg.OperationalError("down"))
    with pytest.raises(OutageTooLong) as raised:
        ride_out(call, budget_s=0.1, what="a status report", backoff=Backoff(0.02, 0.02))
    assert isinstance(raised.value, InfrastructureError)
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)
    assert "a status report" in str(raised.value)
    assert 3 <= call.calls <= 10


def test_ride_out_stops_retrying_when_told_to() -> None:
    call = Flaky(1000, kombu.exceptions.OperationalError("down"))
    with pytest.raises(OutageTooLong):
        ride_out(call, budget_s=60, what="x", stop=lambda: call.calls >= 2, sleep=lambda _: None)
    assert call.calls == 2


def test_the_retry_policies_keep_their_timings() -> None:
    def pauses(backoff: Backoff, n: int) -> list[float]:
        return [backoff.pause(failures) for failures in range(1, n + 1)]

    assert pauses(OUTAGE, 7) == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert pauses(OUTCOME_WRITE, 5) == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert pauses(REQUEUE, 8) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert pauses(LEASE_RENEWAL, 3) == [1.0, 1.0, 1.0]
    assert REQUEUE.pause(10**6) == 60.0  # no overflow, however many failures
