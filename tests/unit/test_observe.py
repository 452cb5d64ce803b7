"""Telemetry, the production observer: the metric names and labels, the task.finished log event
and the spans the runner's steps used to emit inline."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from mcp_celery_tasks.store.records import ClaimedTask
from mcp_celery_tasks.worker.observe import Telemetry

TOOL = "unit_observe_tool"


def job(attempts: int = 1) -> ClaimedTask:
    return ClaimedTask(
        task_id="secret-task-id",
        job_id="job-1",
        tool_name=TOOL,
        arguments={},
        preflight=None,
        client_capabilities={},
        attempts=attempts,
        max_attempts=3,
        queue="mcp.unit",
        age_s=0.5,
    )


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_finished_job_counts_its_outcome_and_logs_task_finished(caplog: pytest.LogCaptureFixture) -> None:
    before = sample("mcp_tasks_finished_total", tool=TOOL, outcome="tool_error")
    with caplog.at_level(logging.INFO, logger="mcp_celery_tasks.worker"):
        Telemetry().on_finished(job(), "host:1:me", "tool_error", 1.23456)
    assert sample("mcp_tasks_finished_total", tool=TOOL, outcome="tool_error") == before + 1
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "task.finished"]
    assert record.name == "mcp_celery_tasks.worker"
    fields = ("job_id", "tool", "queue", "attempt", "worker", "outcome", "duration_s")
    assert {name: getattr(record, name) for name in fields} == {
        "job_id": "job-1",
        "tool": TOOL,
        "queue": "mcp.unit",
        "attempt": 1,
        "worker": "host:1:me",
        "outcome": "tool_error",
        "duration_s": 1.2346,
    }
    assert "secret-task-id" not in caplog.text


@pytest.mark.parametrize("outcome", ["cancelled", "superseded"])
def test_a_job_that_stopped_for_a_cancel_counts_as_cancelled(outcome: str) -> None:
    effective = sample("mcp_cancels_effective_total", tool=TOOL)
    finished = sample("mcp_tasks_finished_total", tool=TOOL, outcome="cancelled")
    Telemetry().on_finished(job(), "host:1:me", outcome, 0.1)
    assert sample("mcp_cancels_effective_total", tool=TOOL) == effective + 1
    assert sample("mcp_tasks_finished_total", tool=TOOL, outcome="cancelled") == finished + 1


def test_pickup_latency_is_observed_on_the_first_attempt_only() -> None:
    before = sample("mcp_task_pickup_seconds_count", tool=TOOL, queue="mcp.unit")
    Telemetry().on_claimed(job(attempts=1))
    Telemetry().on_claimed(job(attempts=2))
    assert sample("mcp_task_pickup_seconds_count", tool=TOOL, queue="mcp.unit") == before + 1


def test_run_time_is_observed_per_tool_and_queue() -> None:
    before = sample("mcp_task_run_seconds_count", tool=TOOL, queue="mcp.unit")
    Telemetry().on_ran(job(), 0.2)
    assert sample("mcp_task_run_seconds_count", tool=TOOL, queue="mcp.unit") == before + 1


def test_an_input_wait_is_a_gauge_while_it_lasts_and_a_duration_after() -> None:
    waits = sample("mcp_input_wait_seconds_count", tool=TOOL)
    with Telemetry().waiting_for_input(TOOL, 2):
        assert sample("mcp_inputs_waiting", tool=TOOL) == 1
    assert sample("mcp_inputs_waiting", tool=TOOL) == 0
    assert sample("mcp_input_wait_seconds_count", tool=TOOL) == waits + 1
