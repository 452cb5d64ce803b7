"""A job's limits: the tool's own values win, unset ones come from the settings, resolved once."""

from __future__ import annotations

import dataclasses

import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tools.registry import get_tool, tool
from mcp_celery_tasks.worker.limits import JobLimits


@tool(
    name="l_bounded",
    time_limit=10,
    soft_time_limit=5,
    memory_limit_mb=100,
    input_timeout=30,
    suspend_after=None,
)
def l_bounded() -> None:
    """A tool with limits of its own."""


@tool(name="l_plain")
def l_plain() -> None:
    """A tool without limits of its own."""


SETTINGS = Settings(
    tool_time_limit_seconds=600.0,
    tool_soft_time_limit_seconds=300.0,
    tool_memory_limit_mb=2048,
    input_timeout_seconds=900.0,
    sync_input_timeout_seconds=60.0,
    cancel_grace_seconds=7.0,
    suspend_after_seconds=45.0,
)


def test_a_tools_own_limits_win_over_the_settings() -> None:
    limits = JobLimits.for_tool(get_tool("l_bounded"), SETTINGS)
    assert limits == JobLimits(
        time_limit_s=10,
        soft_time_limit_s=5,
        memory_limit_mb=100,
        input_timeout_s=30,
        sync_input_timeout_s=60.0,
        cancel_grace_s=7.0,
        suspend_after_s=None,
    )


@pytest.mark.parametrize("name", ["l_plain", "not_loaded_here"])
def test_unset_limits_come_from_the_settings(name: str) -> None:
    limits = JobLimits.for_tool(get_tool(name), SETTINGS)
    assert limits == JobLimits(
        time_limit_s=600.0,
        soft_time_limit_s=300.0,
        memory_limit_mb=2048,
        input_timeout_s=900.0,
        sync_input_timeout_s=60.0,
        cancel_grace_s=7.0,
        suspend_after_s=45.0,
    )


def test_a_synchronous_calls_input_wait_is_capped() -> None:
    limits = JobLimits.for_tool(get_tool("l_plain"), SETTINGS)
    assert limits.input_wait_s(task_augmented=True) == 900.0
    assert limits.input_wait_s(task_augmented=False) == 60.0
    short = JobLimits.for_tool(get_tool("l_bounded"), SETTINGS)
    assert short.input_wait_s(task_augmented=False) == 30


@tool(name="l_suspends_at_once", suspend_after=0)
def l_suspends_at_once() -> None:
    """A tool that gives its slot back as soon as it asks."""


def test_a_job_holds_its_slot_for_input_at_most_until_it_suspends() -> None:
    assert JobLimits.for_tool(get_tool("l_plain"), SETTINGS).resident_wait_s == 45.0
    assert JobLimits.for_tool(get_tool("l_suspends_at_once"), SETTINGS).resident_wait_s == 0.0
    # Staying resident (None), the input timeout is the whole wait.
    assert JobLimits.for_tool(get_tool("l_bounded"), SETTINGS).resident_wait_s == 30
    resident = Settings(input_timeout_seconds=900.0, suspend_after_seconds=None)
    assert JobLimits.for_tool(get_tool("l_plain"), resident).resident_wait_s == 900.0


@pytest.mark.parametrize("bad", [-1, "soon", True, float("nan")])
def test_suspend_after_must_be_seconds_none_or_settings(bad: object) -> None:
    with pytest.raises(ValueError, match="suspend_after must be"):
        tool(name="l_bad_suspend", suspend_after=bad)(lambda: None)  # type: ignore[call-overload]


def test_limits_are_frozen() -> None:
    limits = JobLimits.for_tool(None, SETTINGS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.cancel_grace_s = 1.0  # type: ignore[misc]
