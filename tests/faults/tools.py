"""Tools for the fault-injection suite (loaded through ``MCP_TASKS_TOOL_MODULES``).

``f_count`` leaves a mark per run in ``$FAULTS_RUN_DIR/<task id>/``: ``start.<attempt>.<run>`` when
it begins and ``end.<attempt>.<run>`` when it returns, so a test sees every run of a task, also
those whose outcome never reached the row (a killed worker), and can tell a duplicate completion.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from mcp_celery_tasks import TaskContext, ToolError, tool
from tests.faults import RUN_DIR_ENV


def _mark(task_id: str, event: str, attempt: int, run: str) -> None:
    root = os.environ.get(RUN_DIR_ENV)
    if not root:
        raise ToolError(f"{RUN_DIR_ENV} is not set")
    folder = Path(root) / task_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{event}.{attempt}.{run}").touch(exist_ok=False)


@tool(mode="optional", poll_interval_ms=100)
def f_count(ctx: TaskContext, ms: int = 0) -> dict[str, Any]:
    """Mark the start, sleep ``ms`` (cancellable), mark the end; return this run's id."""
    run = uuid.uuid4().hex[:12]
    _mark(ctx.task_id, "start", ctx.attempt, run)
    ctx.sleep(ms / 1000)
    _mark(ctx.task_id, "end", ctx.attempt, run)
    return {"run": run, "attempt": ctx.attempt, "pid": os.getpid()}
