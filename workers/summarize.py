"""Summarize a text file with the client's model: ``ctx.sample`` (``sampling/createMessage``).

The task goes ``input_required`` with the sampling request; the client runs its LLM and answers
through ``tasks/update`` (or the MRTR retry of a synchronous call), and the tool resumes with
the message. The file is read through a ``FileRoot``: only a regular file under
``MCP_EXAMPLES_FILES_ROOT``, and only its first ``MAX_INPUT_BYTES`` bytes.
"""

from __future__ import annotations

import codecs
import os
from typing import Any

from mcp_celery_tasks import FileRoot, TaskContext, ToolError, tool

__all__ = ["summarize_file"]

FILES_ROOT = "MCP_EXAMPLES_FILES_ROOT"
MAX_INPUT_BYTES = 50_000
"""Bytes of the file read and sent to the model (the rest is never read; the result says so)."""

SYSTEM_PROMPT = "You write short, factual summaries of documents. Answer with the summary only."


# The client's model may take a while to write; reading the file again (at most 50 KB) costs
# less than holding a worker slot meanwhile, so the job gives its slot back at once (suspend) and
# runs again when the summary arrives: the sample then returns the recorded answer at once.
@tool(retention_seconds=3600, poll_interval_ms=500, suspend_after=0)
def summarize_file(ctx: TaskContext, path: str, max_tokens: int = 200) -> dict[str, Any]:
    """Summarize a UTF-8 text file in the files directory with the client's LLM (sampling).

    Needs a client that declares the sampling capability.
    """
    root = FileRoot.require_env(FILES_ROOT)
    if max_tokens < 1:
        raise ToolError("max_tokens must be at least 1")
    ctx.report(f"reading {os.path.basename(path)}")
    data, truncated = root.read_prefix(path, MAX_INPUT_BYTES)
    # Undecodable bytes become U+FFFD; a character cut at the byte cap is dropped.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not truncated)
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
