"""``mcp_celery_tasks.testing.run_tool``: a tool's call as the server and a worker would make it."""

from __future__ import annotations

import pytest
from mcp_types import ElicitResult
from mcp_types import jsonrpc as codes

from mcp_celery_tasks import Elicit, McpError, TaskContext, ToolError, tool
from mcp_celery_tasks.testing import InputRequest, LogEntry, Report, UnansweredInput, run_tool

CONFIRM = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@tool(name="kit_countdown")
def countdown(ctx: TaskContext, start: int) -> dict[str, int]:
    for left in range(start, 0, -1):
        ctx.raise_if_cancelled()
        ctx.report(f"{left} to go", progress=start - left + 1, total=start)
    ctx.raise_if_cancelled()
    ctx.log("info", "lift-off", {"start": start})
    return {"counted": start}


@tool(name="kit_delete")
def delete(ctx: TaskContext, name: str) -> str:
    answer = ctx.elicit(f"Delete {name}?", CONFIRM, key="confirm")
    if answer.action != "accept" or not (answer.content or {}).get("ok"):
        raise ToolError(f"{name} kept")
    return f"{name} deleted"


@tool(name="kit_wipe", ask_first={"sure": Elicit("Wipe everything?", CONFIRM)})
def wipe(ctx: TaskContext) -> str:
    return "wiped" if ctx.preflight["sure"]["content"]["ok"] else "kept"


@tool(name="kit_task_only", mode="required")
def task_only() -> str:
    return "ran"


@tool(name="kit_unkeyed")
def unkeyed(ctx: TaskContext) -> str:
    return "yes" if ctx.elicit("Proceed?", CONFIRM).action == "accept" else "no"


@tool(name="kit_refuses")
def refuses(reason: str) -> str:
    raise McpError(codes.INVALID_PARAMS, reason)


@tool(name="kit_crashes")
def crashes() -> str:
    raise KeyError("boom")


def test_a_value_becomes_structured_content_with_every_report_and_log() -> None:
    run = run_tool(countdown, {"start": 2})
    assert run.status == "completed" and not run.is_error
    assert run.structured == {"counted": 2}
    assert run.result == {
        "content": [{"type": "text", "text": '{"counted":2}'}],
        "structuredContent": {"counted": 2},
        "isError": False,
        "resultType": "complete",
    }
    assert run.reports == [Report("2 to go", 1, 2), Report("1 to go", 2, 2)]
    assert run.logs == [LogEntry("info", "kit_countdown", {"message": "lift-off", "data": {"start": 2}})]


def test_arguments_that_do_not_fit_the_schema_are_a_tool_error_and_the_tool_never_runs() -> None:
    run = run_tool("kit_countdown", {"start": "many", "stop": 1})
    assert run.is_error and run.reports == []
    assert "start" in run.text and "unknown argument 'stop'" in run.text


def test_an_answered_question_reaches_the_tool_and_is_recorded() -> None:
    yes = {"action": "accept", "content": {"ok": True}}
    run = run_tool("kit_delete", {"name": "a.txt"}, answers={"confirm": yes})
    assert run.text == "a.txt deleted"
    (request,) = run.requests
    assert request == InputRequest("confirm", "elicitation/create", request.params, yes)
    assert request.params is not None and request.params["message"] == "Delete a.txt?"


def test_an_answer_may_be_a_model_or_a_function_of_the_request() -> None:
    declined = run_tool("kit_delete", {"name": "a.txt"}, answers={"confirm": ElicitResult(action="decline")})
    assert declined.is_error and declined.text == "a.txt kept"
    asked = run_tool(
        "kit_delete",
        {"name": "b.txt"},
        answers={"confirm": lambda params: {"action": "accept", "content": {"ok": "b.txt" in str(params)}}},
    )
    assert asked.text == "b.txt deleted"


def test_a_question_without_an_answer_raises_naming_its_key() -> None:
    with pytest.raises(UnansweredInput, match=r"the tool asked 'confirm' .*'Delete a\.txt\?'") as caught:
        run_tool("kit_delete", {"name": "a.txt"})
    assert caught.value.request.key == "confirm"


def test_an_answer_that_does_not_fit_its_request_raises() -> None:
    with pytest.raises(UnansweredInput, match="missing the required field 'ok'"):
        run_tool("kit_delete", {"name": "a.txt"}, answers={"confirm": {"action": "accept", "content": {}}})


def test_a_client_without_elicitation_gets_input_not_supported_as_a_tool_error() -> None:
    run = run_tool("kit_delete", {"name": "a.txt"}, capabilities={})
    assert run.is_error and "'elicitation' capability" in run.text


@pytest.mark.parametrize(("after", "reports"), [(0, []), (1, ["3 to go"]), (2, ["3 to go", "2 to go"])])
def test_cancel_after_n_reports_stops_the_tool_at_its_next_checkpoint(after: int, reports: list[str]) -> None:
    run = run_tool(countdown, {"start": 3}, cancel_after=after)
    assert run.status == "cancelled" and run.result is None
    assert [report.message for report in run.reports] == reports


def test_an_mcp_error_is_a_failed_task_with_its_json_rpc_error() -> None:
    run = run_tool(refuses, {"reason": "no such account"})
    assert run.status == "failed" and run.result is None
    assert run.error == {"code": codes.INVALID_PARAMS, "message": "no such account"}


def test_a_crash_is_a_tool_error_that_names_the_job_not_the_exception() -> None:
    run = run_tool(crashes)
    assert run.is_error and "unexpected error" in run.text and "boom" not in run.text


def test_an_unregistered_function_is_refused() -> None:
    def plain() -> None: ...

    with pytest.raises(LookupError, match="not a registered tool"):
        run_tool(plain)


def test_ask_first_questions_are_answered_before_the_job_runs() -> None:
    yes = {"action": "accept", "content": {"ok": True}}
    run = run_tool(wipe, answers={"sure": yes})
    assert run.text == "wiped"
    assert [(request.key, request.answer) for request in run.requests] == [("sure", yes)]
    with pytest.raises(UnansweredInput, match="'sure'"):
        run_tool(wipe)
    given = run_tool(wipe, preflight={"sure": {"action": "accept", "content": {"ok": False}}})
    assert given.text == "kept" and given.requests == []


def test_missing_capabilities_are_refused_as_the_server_refuses_them() -> None:
    without_elicitation = run_tool(wipe, capabilities={"extensions": {}})
    assert without_elicitation.status == "failed" and without_elicitation.error is not None
    assert without_elicitation.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert run_tool(task_only).text == "ran"
    refused = run_tool(task_only, capabilities={"elicitation": {}})
    assert refused.error is not None and refused.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY


def test_a_question_without_a_key_is_answered_by_the_automatic_key_the_error_names() -> None:
    with pytest.raises(UnansweredInput, match=r"the tool asked '1-[0-9a-f]{16}'") as caught:
        run_tool(unkeyed)
    key = caught.value.request.key
    yes = {"action": "accept", "content": {"ok": True}}
    assert run_tool(unkeyed, answers={key: yes}).text == "yes"


@tool(name="kit_is_task")
def is_task(ctx: TaskContext) -> str:
    return "task" if ctx.is_task else "synchronous"


def test_a_run_is_a_task_unless_it_stands_for_a_synchronous_call() -> None:
    assert run_tool("kit_is_task").text == "task"
    assert run_tool("kit_is_task", synchronous=True).text == "synchronous"
