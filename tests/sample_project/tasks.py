"""The project's existing tasks: plain Celery, unaware of MCP."""

from __future__ import annotations

from collections import Counter
from typing import Any

from mcp_celery_tasks import get_current_context
from tests.sample_project.celeryapp import app


@app.task
def word_stats(text: str, top: int = 3) -> dict[str, Any]:
    """Count the words of a text and return the most common ones."""
    ctx = get_current_context()  # None when called from Python or as a plain Celery task
    if ctx is not None:
        ctx.report(f"counting {len(text)} characters")
    counts = Counter(text.split())
    return {"words": sum(counts.values()), "top": counts.most_common(top), "as_mcp_tool": ctx is not None}
