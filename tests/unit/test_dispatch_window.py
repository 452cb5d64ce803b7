"""The fair publisher's window: how many jobs of a queue wait in the broker."""

from __future__ import annotations

import time

import pytest

from mcp_celery_tasks.backlog.release import DispatchWindow
from mcp_celery_tasks.settings import Settings


def window(ahead: int = 4, seconds: float = 0.1) -> DispatchWindow:
    return DispatchWindow(Settings(dispatch_ahead=ahead, dispatch_ahead_seconds=seconds))


def test_a_quiet_queue_keeps_dispatch_ahead() -> None:
    w = window()
    assert w.size("q") == 4
    w.published("q", 3)  # a few jobs a second: long jobs, or few of them
    assert w.size("q") == 4


def test_a_fast_queue_gets_about_a_tenth_of_a_second_of_its_work() -> None:
    w = window()
    for _ in range(50):
        w.published("fast", 6)  # 300 jobs in the last second
    assert w.size("fast") == 30
    assert w.size("other") == 4  # per queue


def test_the_window_is_capped_and_forgets_an_old_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    w = window(seconds=1.0)
    w.published("q", 100_000)
    assert w.size("q") == DispatchWindow.CAP
    now[0] += 1.5
    assert w.size("q") == 4


@pytest.mark.parametrize(("ahead", "seconds"), [(4, 0.0), (0, 0.1)])
def test_zero_turns_the_pace_off(ahead: int, seconds: float) -> None:
    w = window(ahead, seconds)
    w.published("q", 10_000)
    assert w.size("q") == ahead
