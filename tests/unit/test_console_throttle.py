"""Failed console sign-ins per address (``console.throttle``), on a clock the test moves."""

from __future__ import annotations

import pytest

from mcp_celery_tasks.console.security import Refused
from mcp_celery_tasks.console.throttle import FailedLogins


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_eleventh_sign_in_within_a_minute_is_refused_until_the_first_failure_is_a_minute_old() -> None:
    clock = Clock()
    logins = FailedLogins(limit=10, window_s=60.0, clock=clock)
    for _ in range(10):
        logins.check("10.0.0.1")
        logins.failed("10.0.0.1")
        clock.now += 1.0
    with pytest.raises(Refused) as refused:
        logins.check("10.0.0.1")
    assert refused.value.status == 429 and "try again in 50 s" in str(refused.value)
    logins.check("10.0.0.2")  # another address is not held back
    clock.now = 1000.0 + 60.0  # the first failure has left the window: one more try
    logins.check("10.0.0.1")
    logins.failed("10.0.0.1")
    with pytest.raises(Refused):
        logins.check("10.0.0.1")


def test_failures_older_than_the_window_are_forgotten_and_addresses_are_bounded() -> None:
    clock = Clock()
    logins = FailedLogins(limit=2, window_s=10.0, max_addresses=3, clock=clock)
    logins.failed("a")
    clock.now += 11.0
    logins.failed("a")
    logins.check("a")  # one failure in the window
    for address in ("b", "c", "d"):
        logins.failed(address)
        logins.failed(address)
    assert "a" not in logins._failures and len(logins._failures) == 3
    logins.check("a")
    with pytest.raises(Refused):
        logins.check("d")
