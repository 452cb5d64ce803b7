"""The fixture tools the official MCP conformance suite's tasks scenarios call.

Names and arguments follow the suite (SPEC-CHECKLIST §3.2).
"""

from __future__ import annotations

from mcp_celery_tasks import McpError, TaskContext, ToolError, tool


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
