"""The project's Celery app: configured the team's way, then ``install`` adds the MCP jobs."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals

from mcp_celery_tasks.worker import install

PREFIX = os.environ.get("SAMPLE_QUEUE_PREFIX", "sample")

app = Celery("sample_project", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("SAMPLE_BROKER_URL", "redis://127.0.0.1:6379/13"),
    result_backend=os.environ.get("SAMPLE_RESULT_BACKEND"),
    task_compression="gzip",
    result_compression="gzip",
    task_default_queue=f"{PREFIX}.default",
    task_default_exchange=f"{PREFIX}.tasks",
    task_routes={"mcp_celery_tasks.run_tool": {"queue": f"{PREFIX}.mcp"}},
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    imports=["tests.sample_project.tasks"],
)


@signals.task_prerun.connect
def _note_task(task: Any = None, **_: Any) -> None:
    """The team's own signal handler: it sees MCP jobs like any other task."""
    log = os.environ.get("SAMPLE_SIGNAL_LOG")
    if log and task is not None:
        with open(log, "a", encoding="utf-8") as out:
            out.write(task.name + "\n")


install(app, tools=["tests.sample_project.tools"])
