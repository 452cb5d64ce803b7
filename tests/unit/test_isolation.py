"""Isolated bodies through the worker's own ``JobRunner`` (``testing.run_tool``: the real runtime
and context on the in-memory store; each body a real process): the same results as in-process,
no credential in reach, the pool child as the trust boundary."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.testing import ToolRun, run_tool
from mcp_celery_tasks.tools.registry import get_tool
from tests.fixtures import isolated  # noqa: F401  # registers the tools

ANSWER = {"c": {"action": "accept", "content": {"colour": "red"}}}
ISOLATED = Settings(
    report_min_interval_seconds=0.0, cancel_check_interval_seconds=0.0, tool_isolation="process"
)


def _text(run: ToolRun) -> str:
    result: Any = run.result
    return str(result["content"][0]["text"])


def _structured(run: ToolRun) -> dict[str, Any]:
    result: Any = run.result
    return dict(result["structuredContent"])


def _same(result: Any) -> Any:
    """A result with job ids masked (a crash names its job)."""
    return re.sub(r"job [0-9a-f]{32}", "job <id>", str(result))


@pytest.mark.parametrize(
    ("tool", "arguments", "answers"),
    [
        ("plain_normal", {"size_kib": 1500}, ANSWER),
        ("plain_normal", {"size_kib": 1}, {"c": {"action": "decline"}}),
        ("greet", {"name": "Ada"}, None),
        ("leak_probe", {}, None),  # its result differs: compared below, not here
    ],
)
def test_an_isolated_run_ends_as_the_in_process_run_does(
    tool: str, arguments: dict[str, Any], answers: dict[str, Any] | None
) -> None:
    if tool == "greet":
        import tests.fixtures.conformance  # noqa: F401  # greet
    inline = run_tool(tool, arguments, answers=answers)
    isolated_run = run_tool(tool, arguments, answers=answers, settings=ISOLATED)
    if tool == "leak_probe":
        assert isolated_run.status == inline.status == "completed"
        return
    assert _same(isolated_run.result) == _same(inline.result)
    assert isolated_run.status == inline.status
    assert [(r.message, r.progress, r.total) for r in isolated_run.reports] == [
        (r.message, r.progress, r.total) for r in inline.reports
    ]
    assert [(e.level, e.data) for e in isolated_run.logs] == [(e.level, e.data) for e in inline.logs]
    assert [r.key for r in isolated_run.requests] == [r.key for r in inline.requests]


@pytest.mark.parametrize(
    ("tool", "says"),
    [
        ("iso_tool_error", "no such file: plans.txt"),
        ("iso_crash", "failed with an unexpected error"),
        ("iso_exit", "'iso_exit' exited with code 3 before it returned"),
        ("iso_forger", "'iso_forger' broke the protocol with the worker (a reply to 999 while waiting for"),
    ],
)
def test_a_failing_body_ends_in_an_error_result(tool: str, says: str) -> None:
    run = run_tool(tool, {})
    assert run.status == "completed" and run.is_error
    assert says in _text(run)


def test_a_body_that_dies_is_recorded_as_a_crash() -> None:
    from mcp_celery_tasks.worker.isolation import BodyCrashed
    from mcp_celery_tasks.worker.outcomes import tool_error_kind

    assert tool_error_kind(BodyCrashed("x")) == "crash"


def test_the_pool_child_refuses_requests_it_does_not_know_and_goes_on() -> None:
    said = _structured(run_tool("iso_rogue", {}))
    assert said == {
        "drop_tables": "ValueError: unknown operation 'drop_tables'",
        "report": "TypeError: message must be a string of at most 65536 characters",
        "ask": "TypeError: ask takes a list of 1 to 256 requests",
    }


def test_cancel_reaches_an_isolated_body() -> None:
    run = run_tool("iso_normal", {"size_kib": 1}, answers=ANSWER, cancel_after=1)
    assert run.status == "cancelled"
    assert [r.message for r in run.reports] == ["starting"]


def test_the_soft_limit_reaches_an_isolated_body_in_plain_python() -> None:
    settings = Settings(tool_soft_time_limit_seconds=None, report_min_interval_seconds=0.0)
    run = run_tool("iso_soft", {}, settings=settings)
    assert _text(run) == "cleaned up after the soft limit"


def test_a_soft_limit_that_comes_while_the_body_starts_is_raised_as_the_tool_starts() -> None:
    """The body holds the signal until its handlers are in: before, SIGUSR2's default action
    ended it ("killed by signal SIGUSR2"), a crash where a soft limit is due."""
    from tests.fixtures import isolated_slow_start  # noqa: F401  # 1 s to import

    run = run_tool("iso_slow_start", {}, settings=Settings(report_min_interval_seconds=0.0))
    assert _text(run) == "The tool 'iso_slow_start' ran past its soft time limit of 0.3 s"


def test_retry_later_from_a_body_schedules_the_next_attempt() -> None:
    run = run_tool("iso_retry_later", {})
    assert "asked to retry later" in _text(run)
    assert "downstream said 429" in _text(run)


def test_no_credential_is_in_reach_of_an_isolated_body(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = "postgresql://worker:s3cret-pw@127.0.0.1:5432/none"
    monkeypatch.setenv("MCP_TASKS_DATABASE_URL", dsn)
    monkeypatch.setenv("SOME_ALIAS", dsn)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    settings = Settings(report_min_interval_seconds=0.0)
    inline = _structured(run_tool("leak_probe", {}, settings=settings))
    assert any("s3cret-pw" in line for line in inline["environ"])  # the control: in-process sees it
    found = _structured(run_tool("leak_probe_isolated", {}, settings=settings))
    assert found["environ"] == [] and found["gc_connections"] == [] and found["dsns_found"] == 0
    assert found["parent_environ"] == ["<denied: Permission denied>"]
    assert found["parent_mem"].startswith("maps <denied")
    assert found["parent_ptrace"].startswith("<denied")
    assert found["cuda"] == "5"


def test_isolation_is_declared_per_tool_and_checked() -> None:
    from mcp_celery_tasks import tool

    assert get_tool("iso_echo").isolation == "process"  # type: ignore[union-attr]
    assert get_tool("plain_normal").isolation == "none"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="isolation is one of none, process"):
        tool(name="iso_bad", isolation="fork")(lambda: None)  # type: ignore[call-overload]
