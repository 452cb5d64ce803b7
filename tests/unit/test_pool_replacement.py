"""A child the watchdog killed is replaced at once: the pool is told to look again right after
the terminating revoke, not only at its 5 s maintenance timer (issue 28: a slot freed 0.2 s or
4.7 s after the kill, by the race between the child's sentinel and its exit)."""

from __future__ import annotations

from typing import Any

from celery import signals

from mcp_celery_tasks.worker.celery_glue import REPLACE_AFTER_S, _replace_killed_children_soon


class _Hub:
    def __init__(self) -> None:
        self.later: list[tuple[float, Any]] = []

    def call_later(self, delay: float, callback: Any) -> None:
        self.later.append((delay, callback))


class _Pool:
    def maintain_pool(self) -> None:
        """Never called here: the hub only records what it would call."""


def test_a_terminating_revoke_makes_the_pool_look_for_the_killed_child_again() -> None:
    hub, pool = _Hub(), _Pool()
    consumer = type("Consumer", (), {"hub": hub, "pool": pool})()
    _replace_killed_children_soon(consumer)
    signals.task_revoked.send(sender=None, request=None, terminated=False, signum=None, expired=False)
    assert hub.later == []  # a revoke of a job that had not started kills nothing
    signals.task_revoked.send(sender=None, request=None, terminated=True, signum=9, expired=False)
    assert [delay for delay, _ in hub.later] == list(REPLACE_AFTER_S)
    assert all(callback == pool.maintain_pool for _, callback in hub.later)
