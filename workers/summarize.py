"""Summarize a text file with the client's model: ``ctx.sample`` (``sampling/createMessage``).

The task goes ``input_required`` with the sampling request; the client runs its LLM and answers
through ``tasks/update`` (or the MRTR retry of a synchronous call), and the tool resumes with
the message.
"""

from __future__ import annotations

import os
from typing import Any

from mcp_celery_tasks import TaskContext, ToolError, tool

__all__ = ["summarize_file"]

MAX_INPUT_CHARS = 50_000
"""Characters of the file sent to the model (the rest is cut, and the result says so)."""

SYSTEM_PROMPT = "You write short, factual summaries of documents. Answer with the summary only."


@tool(retention_seconds=3600, poll_interval_ms=500)
def summarize_file(ctx: TaskContext, path: str, max_tokens: int = 200) -> dict[str, Any]:
    """Summarize a UTF-8 text file with the client's LLM (sampling/createMessage).

    Needs a client that declares the sampling capability.
    """
    if max_tokens < 1:
        raise ToolError("max_tokens must be at least 1")
    ctx.report(f"reading {os.path.basename(path)}")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_INPUT_CHARS + 1)
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror or exc}") from exc
    truncated = len(text) > MAX_INPUT_CHARS
    text = text[:MAX_INPUT_CHARS]
    if not text.strip():
        raise ToolError(f"{path} is empty")
    note = " (only its beginning is shown)" if truncated else ""
    prompt = f"Summarize the file {os.path.basename(path)}{note}:\n\n{text}"
    ctx.report(f"asking the client's model to summarize {len(text)} characters")
    reply = ctx.sample(
        [{"role": "user", "content": {"type": "text", "text": prompt}}],
        max_tokens,
        system_prompt=SYSTEM_PROMPT,
        key="summary",
        modelPreferences={"intelligencePriority": 0.3, "speedPriority": 0.7},
    )
    blocks = reply.content if isinstance(reply.content, list) else [reply.content]
    summary = "\n".join(block.text for block in blocks if block.type == "text").strip()
    if not summary:
        raise ToolError(f"the client's model ({reply.model}) answered without any text")
    return {
        "path": path,
        "summary": summary,
        "model": reply.model,
        "stop_reason": reply.stop_reason,
        "input_chars": len(text),
        "input_truncated": truncated,
    }
