"""Retry policies on a real stack: a retryable error ends the attempt and the job waits in the
backlog (no worker, no broker message) until its time; ``ctx.retry_later``; cancel while waiting.

One API and one prefork worker (two children) on the stack's own database; no beat, so the
only thing that releases a due retry is the API's fair publisher (its scan runs at least once a
second). Each fixture tool (tests/fixtures/retrying.py) marks its runs in a file with the time,
so the gaps between attempts are measured from inside the body.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import support
from tests.support import LOG_DIR, Client, Stack, wait_until

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.retrying"]'
RELEASE_BOUND_S = 1.5
"""A due retry is running within this of its time: the publisher's scan (at most 1 s apart),
the release, the broker and the claim."""


@pytest.fixture(scope="module")
def retry_stack(template_db: str) -> Iterator[Stack]:
    with support.stack_of_its_own("retry", template_db, TOOLS) as stack:
        yield stack


@pytest.fixture
def client(retry_stack: Stack) -> Iterator[Client]:
    with_client = retry_stack.client()
    yield with_client
    with_client.close()


@pytest.fixture
def marks() -> Iterator[Path]:
    folder = LOG_DIR.parent / f"retry-marks-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def runs(marks: Path) -> list[tuple[int, float]]:
    """Each run of the task: (its attempt number, when it started)."""
    path = marks / "runs"
    if not path.exists():
        return []
    return [(int(a), float(t)) for a, t in (line.split() for line in path.read_text().splitlines())]


def gaps(marks: Path) -> list[float]:
    times = [t for _, t in runs(marks)]
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def demand(stack: Stack) -> dict[str, Any]:
    queue = stack.env["MCP_TASKS_DEFAULT_QUEUE"]
    with stack.db() as conn:
        cursor = conn.execute("SELECT backlog, demand_slots FROM mcp_queue_demand WHERE queue = %s", (queue,))
        row = cursor.fetchone()
    return {"backlog": row[0], "demand_slots": row[1]} if row else {"backlog": 0, "demand_slots": 0}


def retried(stack: Stack, tool: str, kind: str) -> float:
    """``mcp_jobs_retried_total`` of one tool and kind, as the worker's metrics endpoint says."""
    url = f"http://127.0.0.1:{stack.env['MCP_TASKS_WORKER_METRICS_PORT']}/metrics"
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            if sample.name == "mcp_jobs_retried_total" and sample.labels == {"tool": tool, "kind": kind}:
                return float(sample.value)
    return 0.0


def result_text(task: dict[str, Any]) -> str:
    return str(task["result"]["content"][0]["text"])


@pytest.mark.timeout(60)
def test_a_flaky_tool_fails_twice_then_succeeds_on_its_third_attempt_with_backoff_and_its_step_done_once(
    retry_stack: Stack, client: Client, marks: Path
) -> None:
    task_id = client.start("r_flaky", {"marks": str(marks), "failures": 2})
    done = client.wait_status(task_id, timeout=30)
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    result = done["result"]["structuredContent"]
    assert [attempt for attempt, _ in runs(marks)] == [1, 2, 3]
    assert result["attempt"] == 3 and result["runs"] == 3
    # The step ran on the first attempt only; the retries got its recorded result.
    assert (marks / "prepare").read_text().splitlines() == ["ran"]
    assert result["prepared"] == {"prepared_in_run": 1}
    # exponential(initial=0.4, maximum=0.8, jitter=True): 0.2-0.4 s, then 0.4-0.8 s (jitter keeps
    # the upper half of each delay), plus at most the release bound.
    first, second = gaps(marks)
    print(f"r_flaky gaps between attempts: {first:.3f} s, {second:.3f} s")
    assert 0.2 <= first <= 0.4 + RELEASE_BOUND_S, first
    assert 0.4 <= second <= 0.8 + RELEASE_BOUND_S, second
    row = retry_stack.row(task_id)
    assert row["attempts"] == 3 and row["redeliveries"] == 0 and row["retry_at"] is None
    assert row["error_kind"] is None  # the success cleared the last error
    assert retried(retry_stack, "r_flaky", "retryable_error") == 2


@pytest.mark.timeout(30)
def test_an_error_the_policy_does_not_name_fails_at_once(
    retry_stack: Stack, client: Client, marks: Path
) -> None:
    task_id = client.start("r_wrong_error", {"marks": str(marks)})
    done = client.wait_status(task_id, timeout=20)
    assert done["status"] == "completed" and done["result"]["isError"] is True, done
    assert "unexpected error" in result_text(done)
    assert len(runs(marks)) == 1
    row = retry_stack.row(task_id)
    assert row["attempts"] == 1 and row["error_kind"] == "crash"


@pytest.mark.timeout(40)
def test_retries_end_after_max_attempts_with_a_tool_error_naming_the_sanitized_last_error(
    retry_stack: Stack, client: Client, marks: Path
) -> None:
    task_id = client.start("r_always_times_out", {"marks": str(marks)})
    done = client.wait_status(task_id, timeout=30)
    assert done["status"] == "completed" and done["result"]["isError"] is True, done
    text = result_text(done)
    assert text.startswith("The tool 'r_always_times_out' failed 4 times; the last error: TimeoutError: "), (
        text
    )
    assert "\x1b" not in text and "\n" not in text and text.endswith("…") and len(text) < 300, text
    assert [attempt for attempt, _ in runs(marks)] == [1, 2, 3, 4]
    # fixed(0.2): each gap is the delay plus how long the release took to notice it was due.
    late = [gap - 0.2 for gap in gaps(marks)]
    print("fixed(0.2) release after due: " + ", ".join(f"{s:.3f} s" for s in late))
    assert all(-0.01 <= s <= RELEASE_BOUND_S for s in late), late
    assert retry_stack.row(task_id)["error_kind"] == "retryable_error_exhausted"


@pytest.mark.timeout(30)
def test_retry_later_runs_the_tool_again_after_the_seconds_it_asked_for(
    retry_stack: Stack, client: Client, marks: Path
) -> None:
    # Longer than the publisher's scan interval: a scan sees it waiting and wakes when it is due.
    task_id = client.start("r_polite", {"marks": str(marks), "seconds": 1.5})
    done = client.wait_status(task_id, timeout=20)
    assert done["status"] == "completed" and done["result"]["structuredContent"] == {"attempt": 2, "runs": 2}
    (gap,) = gaps(marks)
    print(f"retry_later(1.5) release after due: {gap - 1.5:.3f} s")
    assert 1.5 <= gap <= 1.5 + RELEASE_BOUND_S, gap
    assert retry_stack.row(task_id)["attempts"] == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("seconds", [-1, 1e9])
def test_retry_later_with_a_hostile_delay_ends_the_call_with_a_clear_tool_error(
    retry_stack: Stack, client: Client, marks: Path, seconds: float
) -> None:
    task_id = client.start("r_polite", {"marks": str(marks), "seconds": seconds})
    done = client.wait_status(task_id, timeout=20)
    assert done["status"] == "completed" and done["result"]["isError"] is True, done
    assert result_text(done).startswith("ctx.retry_later: seconds must be a finite number from 0 to 3600")
    assert len(runs(marks)) == 1


@pytest.mark.timeout(40)
def test_a_task_waiting_for_its_retry_shows_when_holds_no_slot_and_cancels_at_once(
    retry_stack: Stack, client: Client, tmp_path: Path
) -> None:
    waiting, sentinel = tmp_path / "waiting", tmp_path / "sentinel"
    waiting.mkdir()
    sentinel.mkdir()
    reason = "429 Too Many Requests \x07(Retry-After: 30)"
    cancelled_id = client.start("r_polite", {"marks": str(waiting), "seconds": 30, "reason": reason})
    sentinel_id = client.start("r_polite", {"marks": str(sentinel), "seconds": 30})
    expected = "retrying in 30 s (attempt 2/3): 429 Too Many Requests (Retry-After: 30)"
    wait_until(lambda: client.get(cancelled_id).result.get("statusMessage") == expected, 15, what="the retry")
    wait_until(lambda: client.get(sentinel_id).result["status"] == "working" and runs(sentinel), 15)
    wait_until(lambda: retry_stack.row(sentinel_id)["retry_at"] is not None, 15, what="the sentinel's retry")
    task = client.get(cancelled_id).result
    assert task["status"] == "working" and task["statusMessage"] == expected  # not a place in line
    # Waiting holds nothing: no worker, no lease, no broker message, no demand for a slot.
    row = retry_stack.row(cancelled_id)
    assert row["worker"] is None and row["lease_until"] is None and row["dispatched_at"] is None
    assert demand(retry_stack) == {"backlog": 0, "demand_slots": 0}

    assert client.cancel(cancelled_id).status == 200
    assert client.get(cancelled_id).result["status"] == "cancelled"
    assert retry_stack.row(cancelled_id)["finished_at"] is not None  # nothing left to stop

    # Both retries fall due now: the sentinel runs again (a release pass happened), the
    # cancelled task never does.
    with retry_stack.db() as conn:
        conn.execute(
            "UPDATE mcp_tasks SET retry_at = now() WHERE task_id = ANY(%s)", ([cancelled_id, sentinel_id],)
        )
    done = client.wait_status(sentinel_id, timeout=10)
    assert done["status"] == "completed" and done["result"]["structuredContent"]["attempt"] == 2
    assert len(runs(waiting)) == 1
    row = retry_stack.row(cancelled_id)
    assert row["status"] == "cancelled" and row["attempts"] == 1 and row["dispatched_at"] is None
