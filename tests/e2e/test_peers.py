"""Real 2026-07-28 clients from npm against a live stack: ``@modelcontextprotocol/client`` 2.4.0
with the tasks extension's requester (``@modelcontextprotocol/ext-tasks`` 0.2.2) through tasks,
elicitation, sampling (as a task and as a synchronous MRTR call) and cancel.

``scripts/install-peers`` installs them into .cache/; without npm the test skips, except in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, Stack

EXT_DIR = ROOT / ".cache" / "peers-ts-ext"


@pytest.fixture(scope="session")
def ext_tasks() -> Path:
    installed = EXT_DIR / "node_modules" / "@modelcontextprotocol" / "ext-tasks" / "package.json"
    if not installed.exists():
        ran = subprocess.run(
            [str(ROOT / "scripts" / "install-peers")], capture_output=True, text=True, timeout=900
        )
        if ran.returncode != 0 or shutil.which("node") is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"scripts/install-peers failed: {ran.stderr[-2000:]}")
            pytest.skip("npm could not install @modelcontextprotocol/client and ext-tasks")
    shutil.copy(ROOT / "tests" / "e2e" / "peers" / "ext_tasks_client.mjs", EXT_DIR / "client.mjs")
    return EXT_DIR


def test_ext_tasks_client_runs_tasks_elicitation_sampling_and_cancel(stack: Stack, ext_tasks: Path) -> None:
    run = subprocess.run(
        ["node", "client.mjs", stack.url], cwd=ext_tasks, capture_output=True, text=True, timeout=180
    )
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
