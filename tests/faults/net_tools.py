"""Tools of the partition suite (loaded only by its stacks): bodies that beat.

Each run appends to ``$FAULTS_RUN_DIR/<task id>/beats.<attempt>.<run>`` its pid on the first
line, then the wall-clock time of every ~50 ms slice of work, besides the ``start``/``end``/
``left`` marks of ``tests.fixtures.faults``: so a test sees, outside the database, when a body
really ran, also a body whose process was killed in it (no end mark) or that kept running on
a host cut off from everything.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mcp_celery_tasks import TaskContext, tool
from tests.fixtures.faults import RUN_DIR_ENV, _body


@tool(mode="optional", poll_interval_ms=100)
def np_work(ctx: TaskContext, ms: int = 6000, cooperate: bool = True) -> dict[str, Any]:
    """Work ``ms`` in 50 ms slices with a beat each; ``cooperate``: report every slice and
    sleep through ``ctx`` (cancellable); otherwise never touch ``ctx`` (the lease is the
    watchdog's to keep)."""
    with _body(ctx) as run:
        beats = Path(os.environ[RUN_DIR_ENV]) / ctx.task_id / f"beats.{ctx.attempt}.{run}"
        with beats.open("a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")
            out.flush()
            deadline = time.monotonic() + ms / 1000
            step = 0
            while time.monotonic() < deadline:
                step += 1
                out.write(f"{time.time()!r}\n")
                out.flush()
                if cooperate:
                    ctx.report(f"step {step}")
                    ctx.sleep(0.05)
                else:
                    time.sleep(0.05)
        return {"run": run, "attempt": ctx.attempt, "pid": os.getpid()}
