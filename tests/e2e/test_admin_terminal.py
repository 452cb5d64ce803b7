"""The admin commands in a real terminal (tmux): whole ids at any width, a way out of ``top``."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from mcp_celery_tasks.cli.admin.connect import redact
from tests.support import ROOT, wait_until


@pytest.fixture
def tmux() -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs tmux for the terminal tests")
        pytest.skip("tmux is not installed")
    session = f"mcpt-adm-{uuid.uuid4().hex[:8]}"
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def _screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-J", "-t", session], capture_output=True, text=True
    ).stdout


def _open(session: str, width: int, db_url: str, *args: str) -> None:
    command = " ".join([sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", *args])
    # The terminal's own size, whatever the environment of the test run says.
    unset = [k for k in os.environ if k.startswith("MCP_TASKS_")] + ["COLUMNS", "LINES"]
    env = " ".join([f"cd {ROOT} &&", "env", *(f"-u {k}" for k in unset)])
    shell = f"{env} MCP_TASKS_DATABASE_URL='{db_url}' {command}; echo EXIT=$?; sleep 60"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", "50", shell], check=True
    )


def _seed(db_url: str, count: int) -> list[tuple[str, str]]:
    ids = [(secrets.token_urlsafe(24), str(uuid.uuid4())) for _ in range(count)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        for task_id, job_id in ids:
            conn.execute(
                """INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status,
                     status_message, retention_ms, poll_interval_ms, queue, max_attempts,
                     protocol_version, client_capabilities, started_at)
                   VALUES (%s, %s, 'token:alice', 'summarize_file', '{}', 'working',
                     'reading chapter 3 of 12, this message is long enough to need room', 60000,
                     1000, 'mcp.default', 3, '2026-07-28', '{}', now())""",
                (task_id, job_id),
            )
    return ids


@pytest.mark.parametrize("width", [120, 70, 40])
def test_ls_shows_every_id_whole_at_any_terminal_width(db_url: str, tmux: str, width: int) -> None:
    ids = _seed(db_url, 3)
    _open(tmux, width, db_url, "ls")
    screen = wait_until(lambda: "EXIT=" in (s := _screen(tmux)) and s, 30, 0.1, what="ls to finish")
    assert "EXIT=0" in screen, screen
    # The stderr lines (which database; what was left out) wrap like any text; the table fits.
    lines = [line for line in screen.splitlines() if not line.startswith(("narrow terminal", "database: "))]
    assert screen.startswith(f"database: MCP_TASKS_DATABASE_URL={redact(db_url)}"), screen
    for task_id, job_id in ids:
        # Whole, on one line each: copied from the terminal into show or cancel.
        assert any(task_id in line for line in lines), screen
        assert any(job_id in line for line in lines), screen
    assert all(len(line) <= width for line in lines), screen
    if width < 120:
        assert re.search(r"left out .*message", screen), screen
        assert "--wide" in screen


def test_ls_piped_is_never_narrowed(db_url: str, tmux: str) -> None:
    ids = _seed(db_url, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env |= {"MCP_TASKS_DATABASE_URL": db_url, "COLUMNS": "40"}
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "ls"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    row = next(line for line in ran.stdout.splitlines() if ids[0][0] in line)
    assert ids[0][1] in row and "summarize_file" in row and "token:alice" in row
    assert "left out" not in ran.stderr


def test_top_says_how_to_quit_and_ctrl_c_exits_0(db_url: str, tmux: str) -> None:
    _seed(db_url, 1)
    _open(tmux, 120, db_url, "top", "--interval", "0.5")
    wait_until(lambda: "Ctrl-C to quit" in _screen(tmux), 30, 0.1, what="top's first screen")
    assert "summarize_file" in _screen(tmux), _screen(tmux)
    subprocess.run(["tmux", "send-keys", "-t", tmux, "C-c"], check=True)
    screen = wait_until(lambda: "EXIT=" in (s := _screen(tmux)) and s, 15, 0.1, what="top to quit")
    assert "EXIT=0" in screen and "Traceback" not in screen, screen
