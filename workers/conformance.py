"""The fixture tools the official MCP conformance suite's tasks scenarios call.

Names and arguments follow the suite (SPEC-CHECKLIST §3.2).
"""

from __future__ import annotations

from mcp_celery_tasks import Elicit, McpError, TaskContext, ToolError, tool


@tool(mode="forbidden")
def greet(name: str) -> str:
    """Say hello (always synchronous)."""
    return f"Hello, {name}!"


@tool(mode="optional", poll_interval_ms=200)
def slow_compute(ctx: TaskContext, seconds: float = 1.0, label: str = "") -> str:
    """Sleep for `seconds`, reporting progress; settles to cancelled when cancelled."""
    ctx.report(f"computing {label}".strip())
    ctx.sleep(seconds)
    return f"done after {seconds}s" + (f" ({label})" if label else "")


@tool(mode="required", poll_interval_ms=200)
def failing_job(ctx: TaskContext) -> str:
    """Fail with a tool error after about a second (the task still ends completed)."""
    ctx.sleep(1.0)
    raise ToolError("failing_job failed on purpose")


@tool(mode="optional", poll_interval_ms=200)
def protocol_error_job() -> str:
    """End with a JSON-RPC error: the task ends failed."""
    raise McpError(-32603, "protocol_error_job: internal failure on purpose")


@tool(mode="optional", poll_interval_ms=200)
def confirm_delete(ctx: TaskContext, filename: str = "") -> str:
    """Ask for confirmation (one elicitation), then pretend to delete the file."""
    answer = ctx.elicit(
        f"Delete {filename}?",
        {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
    )
    if answer.action == "accept" and answer.content and answer.content.get("confirm"):
        return f"Deleted {filename}"
    return f"Kept {filename} ({answer.action})"


@tool(mode="optional", poll_interval_ms=200)
def multi_input(ctx: TaskContext) -> str:
    """Ask two questions at once; both stay outstanding until answered."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    answers = ctx.ask_many(
        {
            "first": (
                "elicitation/create",
                {"mode": "form", "message": "First value?", "requestedSchema": schema},
            ),
            "second": (
                "elicitation/create",
                {"mode": "form", "message": "Second value?", "requestedSchema": schema},
            ),
        }
    )
    return "got " + ", ".join(f"{key}={answer.get('action')}" for key, answer in answers.items())


@tool(
    mode="required",
    poll_interval_ms=200,
    ask_first={
        "user_name": Elicit(
            "What is your name?",
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        )
    },
)
def test_tool_with_task(ctx: TaskContext) -> str:
    """Ask for a name before the task exists (MRTR), then greet as a task."""
    answer = ctx.preflight["user_name"]
    name = (answer.get("content") or {}).get("name", "stranger")
    return f"Hello, {name}!"
