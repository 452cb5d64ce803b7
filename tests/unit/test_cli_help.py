"""Help screens say what to type (metavars), never Python type tags such as ``<bool>``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import ROOT

SCREENS = [
    ("tasks",), ("tasks", "ls"), ("tasks", "show"), ("tasks", "cancel"), ("tasks", "purge"), ("tasks", "top"),
    ("tasks", "limits"), ("tasks", "limits", "ls"), ("tasks", "limits", "set"), ("tasks", "limits", "clear"),
]  # fmt: skip


@pytest.mark.parametrize("argv", SCREENS, ids=" ".join)
def test_admin_help_screens_have_no_type_tags(argv: tuple[str, ...]) -> None:
    env = {**os.environ, "COLUMNS": "120"}
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *argv, "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert re.search(r"<(bool|str|int|float|text|integer|list\[str\])>", ran.stdout) is None, ran.stdout


def test_tasks_help_gives_the_exit_codes() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "--help"],
        cwd=ROOT, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    text = " ".join(ran.stdout.split())
    assert "Exit codes: 0 done; 1 no such task" in text and "3 the database cannot be used" in text
