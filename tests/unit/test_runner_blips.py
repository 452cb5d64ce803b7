"""The runner and blips: a worker stopping gives its job back uncounted, an outage past the budget
ends the task with an infrastructure error (never a tool error), the redelivery cap, and the lease
held until the outcome is written."""

from __future__ import annotations

import os
import signal
from typing import Any

from mcp_types import jsonrpc as codes

from mcp_celery_tasks import TaskContext, tool
from mcp_celery_tasks.errors import WorkerStopping
from mcp_celery_tasks.testing import MemoryStore
from mcp_celery_tasks.worker import child as jobprocess
from tests.unit.test_runner import Recorder, SpyLeases, make_runner

PREFIX = "unit_runner_blips_"


@tool(name=PREFIX + "stopped")
def _stopped(ctx: TaskContext) -> str:
    raise WorkerStopping("SIGTERM")


@tool(name=PREFIX + "reports")
def _reports(ctx: TaskContext) -> str:
    ctx.report("working")
    return "done"


@tool(name=PREFIX + "echo")
def _echo() -> str:
    return "done"


def test_a_stopping_worker_gives_the_job_back_without_using_an_attempt() -> None:
    store, observer = MemoryStore(), Recorder()
    row = store.add(PREFIX + "stopped", attempts=1)  # one real attempt used before
    outcome = make_runner(store, observer).run(row.job_id)
    assert (outcome.status, outcome.retry_in) == ("stopping", None)
    assert (row.status, row.attempts, row.redeliveries, row.worker) == ("working", 1, 1, None)
    assert row.result is None and observer.outcome is None
    # The next worker may claim it at once: the lease was given back, not left to run out.
    again = store.claim(row.job_id, "host:2:next", 30.0)
    assert again is not None and again.attempts == 2


def test_an_outage_past_the_budget_fails_the_task_with_an_infrastructure_error() -> None:
    store, observer = MemoryStore(), Recorder()
    row = store.add(PREFIX + "reports")
    store.fail("report", 10_000)  # the database never answers the tool's report
    outcome = make_runner(store, observer, outage_budget_seconds=0.1).run(row.job_id)
    assert outcome.status == "failed" and row.status == "failed"
    assert row.error is not None and row.error["code"] == codes.INTERNAL_ERROR
    assert "outage budget" in row.error["message"]
    assert row.error_kind == "infrastructure" and row.result is None  # not a tool error


def test_a_job_handed_back_too_often_fails_with_its_own_error_kind() -> None:
    store, observer = MemoryStore(max_redeliveries=4), Recorder()
    row = store.add(PREFIX + "echo", redeliveries=4)
    outcome = make_runner(store, observer, max_redeliveries=4).run(row.job_id)
    assert outcome.status == "failed" and row.status == "failed"
    assert row.error_kind == "redeliveries_exhausted"
    assert row.error is not None and "handed back 4 times" in row.error["message"]


class HeldAtFinish(MemoryStore):
    """Notes whether the lease thread still held the job when its outcome was written."""

    leases: SpyLeases | None = None
    held_at_finish: bool | None = None

    def finish(self, task_id: str, worker: str, status: str, **kwargs: Any) -> bool:
        assert self.leases is not None
        self.held_at_finish = task_id in self.leases.held
        return super().finish(task_id, worker, status, **kwargs)


def test_the_lease_is_kept_until_the_outcome_is_written() -> None:
    store, observer = HeldAtFinish(), Recorder()
    runner = make_runner(store, observer)
    runner._leases = store.leases = SpyLeases()  # type: ignore[assignment]
    row = store.add(PREFIX + "echo")
    assert runner.run(row.job_id).status == "completed"
    assert store.held_at_finish is True and store.leases.held == set()


def test_a_stop_signalled_before_the_tool_began_gives_the_job_back(monkeypatch: Any) -> None:
    monkeypatch.setattr(jobprocess, "_STOP_REQUESTED", True)
    store, observer = MemoryStore(), Recorder()
    row = store.add(PREFIX + "echo")
    assert make_runner(store, observer).run(row.job_id).status == "stopping"
    assert (row.attempts, row.redeliveries, row.result) == (0, 1, None)


def test_stop_signal_hands_the_running_tool_a_worker_stopping(monkeypatch: Any) -> None:
    seen: list[bool] = []

    class Spy:
        def stop_signalled(self) -> None:
            seen.append(True)

    monkeypatch.setattr(jobprocess, "_CURRENT", Spy())
    monkeypatch.setattr(jobprocess, "_STOP_REQUESTED", False)
    jobprocess.stop_signal(15, None)
    assert seen == [True] and jobprocess.stop_requested()


def test_the_stop_handler_runs_first_then_hands_over_to_the_pools(monkeypatch: Any) -> None:
    handed: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handed.append(signum))
    monkeypatch.setattr(jobprocess, "_STOP_REQUESTED", False)
    monkeypatch.setattr(jobprocess, "_CURRENT", None)
    monkeypatch.setattr(jobprocess, "_CAUGHT_IN", None)
    monkeypatch.setattr(jobprocess, "_HANDED_OVER", {})
    try:
        jobprocess.catch_stop_signal(signal.SIGUSR1)
        jobprocess.catch_stop_signal(signal.SIGUSR1)  # once per process
        assert signal.getsignal(signal.SIGUSR1) is jobprocess.stop_signal
        os.kill(os.getpid(), signal.SIGUSR1)  # no job under way: straight to the pool's handler
        assert handed == [signal.SIGUSR1] and jobprocess.stop_requested()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_an_ignored_termination_signal_stays_ignored(monkeypatch: Any) -> None:
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # REMAP_SIGTERM: children ignore SIGTERM
    monkeypatch.setattr(jobprocess, "_CAUGHT_IN", None)
    monkeypatch.setattr(jobprocess, "_HANDED_OVER", {})
    try:
        jobprocess.catch_stop_signal(signal.SIGUSR1)
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous)
