"""The job runner's steps (claim, lease, run, record) on the in-memory store with fake tools:
what each refusal and each thing a tool returns or raises becomes, in milliseconds. The e2e
tests run the same runner inside a real prefork worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from mcp_celery_tasks import McpError, TaskCancelled, TaskContext, ToolError, tool
from mcp_celery_tasks.errors import TASKS_EXTENSION, InfrastructureError
from mcp_celery_tasks.json_types import as_array, as_object
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.records import ClaimedTask
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore, Row
from mcp_celery_tasks.transient import Backoff
from mcp_celery_tasks.worker.observe import JobObserver
from mcp_celery_tasks.worker.runner import JobRunner, worker_identity

# ---- fake tools (registered under names no other test uses) ------------------------------------

PREFIX = "unit_runner_"


@tool(name=PREFIX + "echo")
def _echo(text: str = "hi") -> dict[str, str]:
    return {"echo": text}


@tool(name=PREFIX + "reports")
def _reports(ctx: TaskContext) -> str:
    ctx.report("step 1")
    ctx.report("step 2")  # coalesced: only the runner's flush can write it
    return "done"


@tool(name=PREFIX + "tool_error")
def _tool_error() -> str:
    raise ToolError("the file is not there")


@tool(name=PREFIX + "mcp_error")
def _mcp_error() -> str:
    raise McpError(-32603, "internal failure on purpose")


@tool(name=PREFIX + "crash")
def _crash() -> str:
    raise KeyError("secret detail")


@tool(name=PREFIX + "outage")
def _outage() -> str:
    raise InfrastructureError("the task database is unavailable")


@tool(name=PREFIX + "huge")
def _huge() -> str:
    return "x" * 1000


STORE: MemoryStore | None = None
"""The store of the running test, for tools that play the client (cancelling mid-run)."""


def _cancel_me(ctx: TaskContext) -> None:
    assert STORE is not None
    STORE.cancel(ctx.task_id)


@tool(name=PREFIX + "cancelled")
def _cancelled(ctx: TaskContext) -> str:
    _cancel_me(ctx)
    ctx.raise_if_cancelled()
    return "unreachable"


@tool(name=PREFIX + "swallows_tool_errors")
def _swallows_tool_errors(ctx: TaskContext) -> str:
    _cancel_me(ctx)
    try:
        ctx.raise_if_cancelled()
    except ToolError:
        return "swallowed"
    return "unreachable"


@tool(name=PREFIX + "swallows_everything")
def _swallows_everything(ctx: TaskContext) -> str:
    _cancel_me(ctx)
    try:
        ctx.sleep(60)
    except Exception:
        return "swallowed"
    return "unreachable"


@tool(name=PREFIX + "ignores_cancel")
def _ignores_cancel(ctx: TaskContext) -> str:
    _cancel_me(ctx)
    return "finished anyway"


@tool(name=PREFIX + "async_echo")
async def _async_echo(text: str = "hi") -> str:
    await asyncio.sleep(0)
    return text


@tool(name=PREFIX + "async_cancelled")
async def _async_cancelled(ctx: TaskContext) -> str:
    _cancel_me(ctx)
    await asyncio.sleep(0)
    ctx.raise_if_cancelled()
    return "unreachable"


def _loop_at_checkpoints(ctx: TaskContext) -> str:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        time.sleep(0.005)
    return "never stopped"


@tool(name=PREFIX + "own_soft_limit", soft_time_limit=0.05)
def _own_soft_limit(ctx: TaskContext) -> str:
    return _loop_at_checkpoints(ctx)


@tool(name=PREFIX + "loops")
def _loops(ctx: TaskContext) -> str:
    return _loop_at_checkpoints(ctx)


@tool(name=PREFIX + "asks", input_timeout=0.5)
def _asks(ctx: TaskContext) -> str:
    ctx.elicit("Sure?", {"type": "object", "properties": {"ok": {"type": "boolean"}}})
    return "answered"


# ---- fixtures -------------------------------------------------------------------------------------


class Recorder(JobObserver):
    """Records the hooks the runner calls, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    @contextmanager
    def job(self, job_id: str, headers: Mapping[str, Any] | None) -> Iterator[None]:
        self.events.append(("job", job_id))
        yield

    @contextmanager
    def step(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[None]:
        self.events.append(("step", name, dict(attributes or {})))
        yield

    def on_claimed(self, job: ClaimedTask) -> None:
        self.events.append(("claimed", job.attempts))

    def on_ran(self, job: ClaimedTask, elapsed: float) -> None:
        self.events.append(("ran",))

    def on_finished(self, job: ClaimedTask, worker: str, outcome: str, elapsed: float) -> None:
        self.events.append(("finished", outcome))

    @property
    def outcome(self) -> str | None:
        return next((e[1] for e in self.events if e[0] == "finished"), None)


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    global STORE
    STORE = MemoryStore()
    yield STORE
    STORE = None


@pytest.fixture
def observer() -> Recorder:
    return Recorder()


def make_runner(store: MemoryStore, observer: Recorder, **settings: Any) -> JobRunner:
    runner = JobRunner(
        store,
        Settings(report_min_interval_seconds=60.0, **settings),
        lambda: MemoryInbox(),
        observer=observer,
    )
    runner.RECORD_BACKOFF = Backoff(0.001, 0.001)
    return runner


def run(store: MemoryStore, observer: Recorder, name: str, **settings: Any) -> tuple[str, Row, float | None]:
    row = store.add(PREFIX + name)
    outcome = make_runner(store, observer, **settings).run(row.job_id)
    return outcome.status, row, outcome.retry_in


def text_of(row: Row) -> str:
    assert row.result is not None
    return str(as_object(as_array(row.result["content"])[0])["text"])


# ---- claim refused ---------------------------------------------------------------------------------


def test_a_finished_task_is_skipped_without_running(store: MemoryStore, observer: Recorder) -> None:
    row = store.add(PREFIX + "crash", status="completed")
    assert make_runner(store, observer).run(row.job_id).status == "skipped"
    assert row.attempts == 0 and observer.outcome is None


def test_a_cancelled_task_is_skipped(store: MemoryStore, observer: Recorder) -> None:
    row = store.add(PREFIX + "crash")
    store.cancel(row.task_id)
    assert make_runner(store, observer).run(row.job_id).status == "skipped"


def test_an_unknown_job_is_skipped(store: MemoryStore, observer: Recorder) -> None:
    assert make_runner(store, observer).run("no-such-job").status == "skipped"


def test_a_job_someone_alive_holds_is_deferred_until_its_lease_ends(
    store: MemoryStore, observer: Recorder
) -> None:
    row = store.add(PREFIX + "echo")
    assert store.claim(row.job_id, "host:2:other", 30.0) is not None
    outcome = make_runner(store, observer).run(row.job_id)
    assert outcome.status == "deferred"
    assert outcome.retry_in is not None and 30.0 < outcome.retry_in <= 31.0
    assert row.worker == "host:2:other" and row.attempts == 1


def test_a_job_out_of_attempts_fails_with_a_clear_error(store: MemoryStore, observer: Recorder) -> None:
    row = store.add(PREFIX + "echo", attempts=3, max_attempts=3)
    assert make_runner(store, observer).run(row.job_id).status == "failed"
    assert row.status == "failed" and row.error is not None
    assert row.error["message"] == "The job was started 3 times without finishing; giving up"


def test_a_claim_during_a_database_outage_is_retried_soon(store: MemoryStore, observer: Recorder) -> None:
    row = store.add(PREFIX + "echo")
    store.fail("claim")
    outcome = make_runner(store, observer).run(row.job_id)
    assert (outcome.status, outcome.retry_in) == ("infrastructure", 2.0)
    assert row.status == "working"


def test_a_redelivered_job_whose_lease_ran_out_is_claimed_again(
    store: MemoryStore, observer: Recorder
) -> None:
    row = store.add(PREFIX + "echo")
    store.claim(row.job_id, "host:2:dead", 30.0)
    row.lease_until = 0.0  # the first worker died long ago
    assert make_runner(store, observer).run(row.job_id).status == "completed"
    assert row.attempts == 2 and ("claimed", 2) in observer.events


def test_a_tool_missing_on_this_worker_fails_the_task(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "not_registered")
    assert status == "failed" and row.status == "failed"
    assert row.error == {
        "code": -32603,
        "message": f"Tool '{PREFIX}not_registered' is not available on this worker",
    }


# ---- what the tool did -------------------------------------------------------------------------------


def test_a_returned_value_completes_the_task(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "echo")
    assert status == "completed" and row.status == "completed" and row.finished
    assert row.result is not None and row.result["structuredContent"] == {"echo": "hi"}
    assert row.lease_until is None and row.worker == worker_identity()
    assert observer.events == [
        ("job", row.job_id),
        ("step", "claim", {}),
        ("claimed", 1),
        ("ran",),
        ("step", "record outcome", {"mcp.outcome": "completed"}),
        ("finished", "completed"),
    ]


def test_an_async_tool_is_awaited(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "async_echo")
    assert status == "completed" and text_of(row) == "hi"


def test_the_last_report_lands_before_the_outcome(store: MemoryStore, observer: Recorder) -> None:
    _, row, _ = run(store, observer, "reports")
    assert row.status == "completed" and row.reports[-1][0] == "step 2"
    last_report = max(i for i, call in enumerate(store.calls) if call == "report")
    assert last_report < store.calls.index("finish")
    assert row.status_message is None  # a finished task says how it ended (the SQL store's rule)


def test_a_tool_error_completes_with_is_error(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "tool_error")
    assert status == "completed" and row.result is not None and row.result["isError"] is True
    assert text_of(row) == "the file is not there"
    assert observer.outcome == "tool_error"


def test_an_mcp_error_fails_the_task_with_that_error(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "mcp_error")
    assert status == "failed" and row.status == "failed" and row.result is None
    assert row.error == {"code": -32603, "message": "internal failure on purpose"}
    assert row.status_message == "internal failure on purpose"
    assert observer.outcome == "failed"


def test_an_unexpected_exception_is_a_sanitized_tool_error(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "crash")
    assert status == "completed" and row.result is not None and row.result["isError"] is True
    assert "unexpected error" in text_of(row) and row.job_id in text_of(row)
    assert "secret detail" not in text_of(row)


def test_a_result_over_the_limit_becomes_a_tool_error(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "huge", max_result_bytes=500)
    assert status == "completed" and row.result is not None and row.result["isError"] is True
    assert "more than the server's limit of 500" in text_of(row)


def test_an_outage_under_the_tool_gives_the_job_back_uncounted_and_retries(
    store: MemoryStore, observer: Recorder
) -> None:
    status, row, retry_in = run(store, observer, "outage")
    assert (status, retry_in) == ("infrastructure", 2.0)  # 2 ** attempts, capped at a minute
    assert row.status == "working" and row.worker is None and row.result is None
    assert (row.attempts, row.redeliveries) == (0, 1)  # a redelivery, not an attempt
    assert observer.outcome is None and ("ran",) not in observer.events


class SpyLeases:
    """Stands in for the lease thread: which runtimes it was given, which it still holds."""

    def __init__(self) -> None:
        self.watched: list[str] = []
        self.held: set[str] = set()

    def watch(self, runtime: Any) -> None:
        self.watched.append(runtime.task_id)
        self.held.add(runtime.task_id)

    def release(self, runtime: Any) -> None:
        self.held.discard(runtime.task_id)


@pytest.mark.parametrize("name", ["echo", "tool_error", "mcp_error", "crash", "outage", "cancelled", "huge"])
def test_every_run_leaves_the_lease_thread_and_the_row_without_its_lease(
    store: MemoryStore, observer: Recorder, name: str
) -> None:
    runner = make_runner(store, observer, max_result_bytes=500)
    runner._leases = leases = SpyLeases()  # type: ignore[assignment]
    row = store.add(PREFIX + name)
    runner.run(row.job_id)
    assert leases.watched == [row.task_id] and leases.held == set()
    assert row.lease_until is None or row.worker is None  # finished, or given back


# ---- cancel ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["cancelled", "swallows_tool_errors", "swallows_everything", "async_cancelled"]
)
def test_a_cancelled_tool_stops_and_the_worker_records_that_it_stopped(
    store: MemoryStore, observer: Recorder, name: str
) -> None:
    status, row, _ = run(store, observer, name)
    assert status == "cancelled"
    assert row.status == "cancelled" and row.result is None
    assert row.finished and row.lease_until is None
    assert observer.outcome == "cancelled"
    assert not any(event[:2] == ("step", "record outcome") for event in observer.events)


def test_task_cancelled_is_neither_a_tool_error_nor_an_exception() -> None:
    assert issubclass(TaskCancelled, BaseException)
    assert not issubclass(TaskCancelled, Exception) and not issubclass(TaskCancelled, ToolError)


def test_a_result_that_lands_after_a_cancel_is_dropped(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "ignores_cancel")
    assert status == "superseded"
    assert row.status == "cancelled" and row.result is None and row.finished
    assert observer.outcome == "superseded"


# ---- record -----------------------------------------------------------------------------------------


def test_an_outcome_write_that_fails_a_few_times_is_retried(store: MemoryStore, observer: Recorder) -> None:
    row = store.add(PREFIX + "echo")
    store.fail("finish", times=3)
    assert make_runner(store, observer).run(row.job_id).status == "completed"
    assert store.calls.count("finish") == 4 and row.status == "completed"


def test_an_outcome_write_that_keeps_failing_gives_up_after_finish_retry_seconds(
    store: MemoryStore, observer: Recorder
) -> None:
    row = store.add(PREFIX + "echo")
    store.fail("finish", times=10**6)
    with pytest.raises(InfrastructureError):  # run_tool retries the job; the claim's fence decides
        make_runner(store, observer, finish_retry_seconds=0.05).run(row.job_id)
    assert row.status == "working" and store.calls.count("finish") > 1


def test_an_outcome_write_that_finds_the_row_taken_is_superseded(
    store: MemoryStore, observer: Recorder
) -> None:
    row = store.add(PREFIX + "echo")
    runner = make_runner(store, observer)
    real_finish = store.finish

    def finish_after_a_takeover(*args: Any, **kwargs: Any) -> bool:
        row.worker = "host:2:other"  # our lease ran out and another worker claimed the job
        return real_finish(*args, **kwargs)

    store.finish = finish_after_a_takeover  # type: ignore[method-assign]
    assert runner.run(row.job_id).status == "superseded"
    assert row.status == "working" and row.result is None and not row.finished
    assert observer.outcome == "superseded"


# ---- limits ----------------------------------------------------------------------------------------


def test_a_tools_own_soft_time_limit_reaches_its_checkpoints(store: MemoryStore, observer: Recorder) -> None:
    status, row, _ = run(store, observer, "own_soft_limit", tool_soft_time_limit_seconds=None)
    assert status == "completed" and row.error_kind == "soft_time_limit"
    assert "soft time limit of 0.05 s" in text_of(row)


def test_the_settings_soft_time_limit_applies_to_a_tool_without_one(
    store: MemoryStore, observer: Recorder
) -> None:
    status, row, _ = run(store, observer, "loops", tool_soft_time_limit_seconds=0.05)
    assert status == "completed" and row.error_kind == "soft_time_limit"
    assert "soft time limit of 0.05 s" in text_of(row)


def asks(store: MemoryStore, observer: Recorder, extensions: dict[str, Any]) -> tuple[Row, float]:
    """Run the ``asks`` tool (its own input timeout: 0.5 s) unanswered; the row and how long it took."""
    row = store.add(PREFIX + "asks", client_capabilities={"elicitation": {}, "extensions": extensions})
    runner = make_runner(store, observer, sync_input_timeout_seconds=0.05, input_timeout_seconds=60.0)
    started = time.monotonic()
    assert runner.run(row.job_id).status == "completed"
    return row, time.monotonic() - started


def test_a_task_augmented_input_request_waits_the_tools_own_timeout(
    store: MemoryStore, observer: Recorder
) -> None:
    row, took = asks(store, observer, {TASKS_EXTENSION: {}})
    assert row.error_kind == "input_timeout"
    assert 0.5 <= took < 5.0  # neither the 0.05 s sync cap nor the 60 s setting


def test_a_synchronous_calls_input_request_is_capped_by_the_sync_timeout(
    store: MemoryStore, observer: Recorder
) -> None:
    row, took = asks(store, observer, {})
    assert row.error_kind == "input_timeout"
    assert took < 0.5  # the 0.05 s cap, not the tool's 0.5 s
