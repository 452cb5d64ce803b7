"""The benchmark fixture tools (shared/bench): noop, sleep_ms, spin."""

from __future__ import annotations

from mcp_celery_tasks import TaskContext, tool


@tool(mode="optional", poll_interval_ms=100)
def noop() -> str:
    """Return at once."""
    return "ok"


@tool(mode="optional", poll_interval_ms=100)
def sleep_ms(ctx: TaskContext, ms: int = 100) -> str:
    """Sleep `ms` milliseconds."""
    ctx.sleep(ms / 1000)
    return f"slept {ms} ms"


@tool(mode="optional", poll_interval_ms=100)
def spin(ctx: TaskContext, seconds: float = 1.0) -> str:
    """Loop in 10 ms steps until `seconds` pass; stops when cancelled."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        time.sleep(0.01)
    return f"spun {seconds}s"


@tool(mode="optional", poll_interval_ms=100)
def ask(ctx: TaskContext) -> str:
    """Ask one question and return the answer."""
    answer = ctx.elicit(
        "What is the answer?", {"type": "object", "properties": {"answer": {"type": "string"}}}
    )
    return f"answer: {(answer.content or {}).get('answer')}"
