"""Tools that exist only for the tests (loaded by the test stacks next to ``workers``)."""

from __future__ import annotations

from typing import Any

from mcp_celery_tasks import TaskContext, tool

CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}


@tool(mode="optional", poll_interval_ms=100)
def t_two_questions(ctx: TaskContext, marker: str = "") -> dict[str, Any]:
    """Ask one question, report, then a second; return both answers and the attempt."""
    first = ctx.elicit("First?", {"type": "object", "properties": {"value": {"type": "string"}}})
    ctx.report(f"first answered ({marker})")
    second = ctx.elicit("Second?", CONFIRM)
    return {"first": first.model_dump(exclude_none=True), "second": second.model_dump(exclude_none=True),
            "attempt": ctx.attempt}  # fmt: skip


@tool(mode="optional", poll_interval_ms=100, input_timeout=1.5)
def t_short_wait(ctx: TaskContext) -> str:
    """Ask and wait only 1.5 s for an answer."""
    ctx.elicit("Quick?", CONFIRM)
    return "answered"


@tool(mode="optional", poll_interval_ms=100)
def t_sample_and_roots(ctx: TaskContext) -> dict[str, Any]:
    """Ask the client's model and its roots at once."""
    hello = {"role": "user", "content": {"type": "text", "text": "hi"}}
    return ctx.ask_many(
        {
            "llm": ("sampling/createMessage", {"messages": [hello], "maxTokens": 10}),
            "roots": ("roots/list", None),
        }
    )


@tool(mode="optional", poll_interval_ms=100)
def t_key_reuse(ctx: TaskContext) -> str:
    """Reuse an explicit key for a different question in one run (must raise)."""
    ctx.elicit("A?", CONFIRM, key="same")
    ctx.elicit("B?", {"type": "object", "properties": {"other": {"type": "string"}}}, key="same")
    return "unreachable"


@tool(mode="optional", poll_interval_ms=100)
def t_attempt_question(ctx: TaskContext, key: str = "") -> dict[str, Any]:
    """Ask a question that names the attempt, so a re-run asks a different question.

    ``key`` empty: the automatic key; otherwise that explicit key.
    """
    answer = ctx.elicit(f"Attempt {ctx.attempt}?", CONFIRM, key=key or None)
    return {"answer": answer.model_dump(exclude_none=True), "attempt": ctx.attempt}


@tool(mode="optional", poll_interval_ms=100)
def t_two_at_once_then_work(ctx: TaskContext, seconds: float = 1.0) -> dict[str, Any]:
    """Ask two questions at once, then keep working for ``seconds`` (cancellable)."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    answers = ctx.ask_many(
        {
            "a": ("elicitation/create", {"mode": "form", "message": "A?", "requestedSchema": schema}),
            "b": ("elicitation/create", {"mode": "form", "message": "B?", "requestedSchema": schema}),
        }
    )
    ctx.sleep(seconds)
    return answers
