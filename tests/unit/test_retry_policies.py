"""Retry policies: backoff delays (bounds, growth, jitter), the checks ``@tool`` runs on a policy
when a tool module is imported, ``ctx.retry_later``'s checks, and what the runner makes of a
retryable error (on the in-memory store: the Postgres side is tests/e2e/test_retries.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mcp_celery_tasks import TaskContext, ToolError, exponential, fixed, tool
from mcp_celery_tasks.errors import InfrastructureError, McpError, TaskCancelled
from mcp_celery_tasks.json_types import as_array, as_object
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore, run_tool
from mcp_celery_tasks.tools.registry import get_tool
from mcp_celery_tasks.tools.retries import DEFAULT_BACKOFF, MAX_REASON_CHARS, reason_text, retry_later
from mcp_celery_tasks.transient import Backoff as Pauses
from mcp_celery_tasks.worker.runner import JobRunner

# ---- backoff ------------------------------------------------------------------------------------


def test_exponential_backoff_doubles_from_initial_up_to_its_maximum() -> None:
    policy = exponential(initial=1, maximum=300, jitter=False)
    assert [policy.delay(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def test_a_huge_attempt_number_stays_at_the_maximum_without_overflowing() -> None:
    policy = exponential(initial=0.5, maximum=60, factor=10, jitter=False)
    assert policy.delay(10_000) == 60
    assert policy.delay(0) == 0.5  # never below the first delay


def test_jitter_draws_each_delay_from_the_upper_half_of_its_value() -> None:
    policy = exponential(initial=2, maximum=5, jitter=True)
    assert policy.delay(1, rand=lambda: 0.0) == 1.0
    assert policy.delay(1, rand=lambda: 0.999999) == pytest.approx(2.0, abs=1e-5)
    assert policy.delay(5, rand=lambda: 0.5) == 3.75  # capped at 5 first, then jittered
    drawn = [policy.delay(2) for _ in range(2000)]
    assert all(2.0 <= d <= 4.0 for d in drawn)
    assert max(drawn) - min(drawn) > 1.5  # it does spread


def test_fixed_backoff_is_the_same_every_time_and_zero_is_allowed() -> None:
    assert [fixed(7.5).delay(n) for n in (1, 2, 50)] == [7.5, 7.5, 7.5]
    assert fixed(0).delay(3) == 0


def test_the_default_policy_is_one_second_doubling_to_five_minutes_with_jitter() -> None:
    assert (DEFAULT_BACKOFF.initial, DEFAULT_BACKOFF.maximum, DEFAULT_BACKOFF.jitter) == (1.0, 300.0, True)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: exponential(initial=-1), "initial=…"),
        (lambda: exponential(initial=0), "> 0"),
        (lambda: exponential(initial=math.nan), "finite"),
        (lambda: exponential(maximum=math.inf), "finite"),
        (lambda: exponential(initial=10, maximum=5), "must not be below initial"),
        (lambda: exponential(maximum=10**9), "at most 86400"),
        (lambda: exponential(factor=0.5), "factor"),
        (lambda: exponential(factor=math.nan), "factor"),
        (lambda: fixed(-0.1), "fixed"),
        (lambda: fixed(math.nan), "finite"),
        (lambda: fixed(1e300), "at most"),
    ],
)
def test_hostile_backoff_values_are_refused_naming_the_value(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("value", ["1", True, None, [1]])
def test_a_delay_that_is_not_a_number_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="number of seconds"):
        fixed(value)


# ---- @tool(retry_on=…) --------------------------------------------------------------------------


def test_a_policy_is_recorded_on_the_tool_spec() -> None:
    @tool(name="test_policy__recorded", retry_on=(TimeoutError, ConnectionError), max_attempts=5)
    def flaky() -> None: ...

    spec = get_tool("test_policy__recorded")
    assert spec is not None and spec.retry is not None and spec.max_attempts == 5
    assert spec.retry.backoff == DEFAULT_BACKOFF
    assert spec.retry.matches(TimeoutError()) and spec.retry.matches(ConnectionResetError())
    assert not spec.retry.matches(ValueError())
    assert get_tool("test_policy__recorded") is spec


def test_a_tool_without_retry_on_has_no_policy() -> None:
    @tool(name="test_policy__none")
    def plain() -> None: ...

    spec = get_tool("test_policy__none")
    assert spec is not None and spec.retry is None


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"retry_on": ("TimeoutError",)}, TypeError, "exception classes"),
        ({"retry_on": (KeyboardInterrupt,)}, ValueError, "not an Exception"),
        ({"retry_on": (TaskCancelled,)}, ValueError, "not an Exception"),
        ({"retry_on": (ToolError,)}, ValueError, "package's own errors"),
        ({"retry_on": (McpError,)}, ValueError, "package's own errors"),
        ({"retry_on": (InfrastructureError,)}, ValueError, "package's own errors"),
        ({"retry_on": TimeoutError, "max_attempts": 0}, ValueError, "from 1 to 100"),
        ({"retry_on": TimeoutError, "max_attempts": 10**9}, ValueError, "from 1 to 100"),
        ({"retry_on": TimeoutError, "max_attempts": True}, ValueError, "max_attempts"),
        ({"retry_on": TimeoutError, "max_attempts": 2.5}, ValueError, "max_attempts"),
        ({"retry_on": TimeoutError, "backoff": 5}, TypeError, "exponential"),
        ({"backoff": fixed(1)}, ValueError, "backoff needs retry_on"),
    ],
)
def test_a_hostile_policy_is_refused_at_registration_naming_the_tool(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    name = f"test_policy__hostile_{abs(hash(repr(options)))}"
    with pytest.raises(error, match=message) as raised:
        tool(name=name, **options)(lambda: None)
    assert name in str(raised.value)
    assert get_tool(name) is None  # nothing half-registered


# ---- ctx.retry_later -------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf, 3600.5, 1e308, True, "5", None])
def test_retry_later_refuses_a_hostile_delay_with_a_tool_error(seconds: Any) -> None:
    with pytest.raises(ToolError, match=r"ctx\.retry_later: seconds must be"):
        retry_later(seconds, "busy", 3600.0)


def test_retry_later_takes_zero_to_the_maximum_and_a_string_reason() -> None:
    assert retry_later(0, "", 60.0).seconds == 0
    assert retry_later(60, "429", 60.0).reason == "429"
    with pytest.raises(ToolError, match="reason must be a string"):
        retry_later(1, 429, 60.0)


def test_a_reason_is_flattened_stripped_of_control_and_bidi_characters_and_truncated() -> None:
    assert reason_text("a\x1b[31mb\nc\u202ed\u2028e\x00") == "a [31mb c d e"
    long = reason_text("x" * 1000)
    assert len(long) == MAX_REASON_CHARS and long.endswith("…")


# ---- the runner ------------------------------------------------------------------------------------


@tool(name="test_policy__times_out", retry_on=TimeoutError, max_attempts=3, backoff=fixed(12))
def times_out(ctx: TaskContext) -> None:
    raise TimeoutError("registry\nslow")


@tool(name="test_policy__asks_later", max_attempts=2)
def asks_later(ctx: TaskContext, seconds: float) -> str:
    if ctx.attempt == 1:
        ctx.retry_later(seconds, "429 Too Many Requests")
    return f"ran on attempt {ctx.attempt}"


class Unprintable(TimeoutError):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@tool(name="test_policy__unprintable", retry_on=TimeoutError, max_attempts=2, backoff=fixed(1))
def unprintable(ctx: TaskContext) -> None:
    raise Unprintable()


def runner(store: MemoryStore, **settings: Any) -> JobRunner:
    made = JobRunner(store, Settings(report_min_interval_seconds=60.0, **settings), lambda: MemoryInbox())
    made.RECORD_BACKOFF = Pauses(0.001, 0.001)
    return made


def test_a_retryable_error_frees_the_job_until_its_time_and_says_so() -> None:
    store = MemoryStore()
    row = store.add("test_policy__times_out", max_attempts=3)
    outcome = runner(store).run(row.job_id)
    assert outcome.status == "backoff" and outcome.retry_in is None  # the message is done
    assert row.status == "working" and row.worker is None and row.lease_until is None
    assert row.status_message == "retrying in 12 s (attempt 2/3): TimeoutError: registry slow"
    assert row.attempts == 1 and row.retry_at is not None and row.error_kind == "retryable_error"
    # A stale message of the last attempt does not run it before its time.
    assert runner(store).run(row.job_id).status == "skipped" and row.attempts == 1


def test_the_policys_delay_is_cut_to_the_servers_maximum() -> None:
    store = MemoryStore()
    row = store.add("test_policy__times_out", max_attempts=3)
    runner(store, retry_max_delay_seconds=5).run(row.job_id)
    assert row.status_message is not None and row.status_message.startswith("retrying in 5 s (attempt 2/3)")


def test_the_last_attempt_ends_with_a_tool_error_naming_the_error() -> None:
    store = MemoryStore()
    row = store.add("test_policy__times_out", max_attempts=1)
    assert runner(store).run(row.job_id).status == "completed"
    assert row.result is not None and row.result["isError"] is True
    text = as_object(as_array(row.result["content"])[0])["text"]
    assert (
        text == "The tool 'test_policy__times_out' failed once; the last error: TimeoutError: registry slow"
    )
    assert row.error_kind == "retryable_error_exhausted"


def test_a_cancel_that_came_first_wins_over_the_retry() -> None:
    class CancelFirst(MemoryStore):
        def schedule_retry(
            self, task_id: str, worker: str, delay_s: float, message: str, kind: str, detail: str
        ) -> bool:
            self.cancel(task_id)
            return super().schedule_retry(task_id, worker, delay_s, message, kind, detail)

    store = CancelFirst()
    row = store.add("test_policy__times_out", max_attempts=3)
    assert runner(store).run(row.job_id).status == "superseded"
    assert row.status == "cancelled" and row.retry_at is None


def test_retry_later_with_attempts_left_waits_for_its_time_then_runs_the_next_attempt() -> None:
    store = MemoryStore()
    row = store.add("test_policy__asks_later", {"seconds": 0.25}, max_attempts=2)
    assert runner(store).run(row.job_id).status == "backoff"
    assert row.status_message == "retrying in 0.25 s (attempt 2/2): 429 Too Many Requests"
    assert runner(store).run(row.job_id).status == "skipped"  # not before its time
    row.retry_at = None
    assert runner(store).run(row.job_id).status == "completed"
    assert row.result is not None
    assert as_object(as_array(row.result["content"])[0])["text"] == "ran on attempt 2"


def test_the_testing_kit_runs_retries_at_once_and_the_last_ends_naming_the_error() -> None:
    assert run_tool(asks_later, {"seconds": 30}).text == "ran on attempt 2"
    ran = run_tool(times_out)
    assert ran.is_error
    assert ran.text == (
        "The tool 'test_policy__times_out' failed 3 times; the last error: TimeoutError: registry slow"
    )


def test_an_exception_whose_text_raises_is_still_retried_under_its_type_name() -> None:
    store = MemoryStore()
    row = store.add("test_policy__unprintable", max_attempts=2)
    assert runner(store).run(row.job_id).status == "backoff"
    assert row.status_message == "retrying in 1 s (attempt 2/2): Unprintable"


def test_retry_later_on_the_last_attempt_ends_with_a_tool_error_naming_the_reason() -> None:
    store = MemoryStore()
    row = store.add("test_policy__asks_later", {"seconds": 5}, max_attempts=1)
    assert runner(store).run(row.job_id).status == "completed"
    assert row.result is not None and row.result["isError"] is True
    assert as_object(as_array(row.result["content"])[0])["text"] == (
        "The tool 'test_policy__asks_later' asked to retry later after its last attempt (once): "
        "429 Too Many Requests"
    )
    assert row.error_kind == "retry_later_exhausted"


@tool(name="test_policy__outage", retry_on=Exception, max_attempts=3, backoff=fixed(60))
def outage(ctx: TaskContext) -> None:
    raise InfrastructureError("the task database is unavailable")


def test_an_infrastructure_error_is_given_back_uncounted_even_under_a_catch_all_policy() -> None:
    store = MemoryStore()
    row = store.add("test_policy__outage", max_attempts=3)
    outcome = runner(store).run(row.job_id)
    assert outcome.status == "infrastructure" and outcome.retry_in is not None  # the broker redelivers
    assert row.attempts == 0 and row.redeliveries == 1 and row.retry_at is None
