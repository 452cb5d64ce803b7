"""Real 2026-07-28 clients from npm against a live stack: ``@modelcontextprotocol/client`` 2.4.0
with the tasks extension's requester (``@modelcontextprotocol/ext-tasks`` 0.2.2) through tasks,
elicitation, sampling (as a task and as a synchronous MRTR call) and cancel.

``scripts/install-peers`` installs them into .cache/; without npm the test skips, except in CI.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import Stack


def test_ext_tasks_client_runs_tasks_elicitation_sampling_and_cancel(stack: Stack, ext_tasks: Path) -> None:
    check_ext_tasks_client(ext_tasks, stack.url)


def check_ext_tasks_client(ext_tasks: Path, url: str, token: str | None = None) -> None:
    """Run the client's steps against ``url`` (with a bearer ``token``) and check each one."""
    run = subprocess.run(
        ["node", "client.mjs", url, *([token] if token else [])],
        cwd=ext_tasks, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    steps: dict[str, dict[str, Any]] = {
        s["step"]: s for s in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    }
    assert "error" not in steps, run.stdout[-6000:]
    assert "cancel" in steps, f"{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert steps["task"] == {"step": "task", "kind": "task", "status": "completed", "text": "done after 0.5s"}
    assert steps["elicitation"]["kind"] == "task" and steps["elicitation"]["text"] == "Deleted a.txt"
    assert steps["elicitation"]["asked"] == [["elicitation", "Delete a.txt?"]]
    assert steps["sampling"] == {
        "step": "sampling",
        "kind": "task",
        "status": "completed",
        "asked": ["roots", "sampling"],
    }
    assert steps["sync-sampling"]["kind"] == "immediate"
    assert steps["sync-sampling"]["text"] == "The model said: Paris"
    assert steps["cancel"] == {"step": "cancel", "kind": "task", "status": "cancelled"}
