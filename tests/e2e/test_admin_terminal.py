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


def _register_worker(
    db_url: str, node: str, hostname: str, devices: list[str] | None, slots: int = 2
) -> None:
    """A live row of the worker registry, as a worker's heartbeat writes it (pid 100, child 101)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO mcp_workers (node, hostname, pid, pids, queues, slots, devices, version, pool,
                 instance, expires_at)
               VALUES (%s, %s, 100, '{101}', '{mcp.default}', %s, %s, '1.0', 'prefork', 'i',
                 now() + interval '1 minute')""",
            (node, hostname, slots, None if devices is None else psycopg.types.json.Jsonb(devices)),
        )


def test_top_shows_the_demand_per_queue_and_the_workers_with_their_devices(db_url: str) -> None:
    (running, running_job), (queued, _) = _seed(db_url, 2)
    _register_worker(db_url, "gpu-1@pod-a", "pod-a", ["0", "1"])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE mcp_tasks SET worker = 'pod-a:101:n', device = '1', dispatched_at = now(),"
            " lease_until = now() + interval '1 minute' WHERE task_id = %s",
            (running,),
        )
    out = _piped(db_url, "top", "--once")
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    # mcp.default: 2 want a slot (1 in the backlog, 1 running), 1 of 2 slots free, 1 worker.
    demand = next(r for r in rows if r[:1] == ["mcp.default"] and len(r) == 10)
    assert demand[:7] + demand[8:] == ["mcp.default", "2", "1", "0", "1", "0", "0", "1 of 2", "1"], out
    worker = next(r for r in rows if r[:1] == ["gpu-1@pod-a"])
    assert worker[1:4] == ["mcp.default", "1 of 2", "0, 1"] and worker[5] == "1: summarize_file", out
    listed = _piped(db_url, "ls")
    header = next(line for line in listed.splitlines() if "status" in line and "task" in line)
    assert "device" in header
    row = next(line for line in listed.splitlines() if running in line)
    assert [c.strip() for c in row.split("│")][1:6] == [
        running,
        running_job,
        "working",
        "summarize_file",
        "1",
    ], listed
    assert queued in listed


# ---- values from callers and tools are shown inert (red team N5) ---------------------------------

TITLE = "pwned-title"
EVIL_SUB = (
    f"jwt:https://issuer.example#\x1b]0;{TITLE}\x07\x1b[2J\x1b[H[bold red]sub[/bold red]"
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\u202eevil"
)
EVIL_TOOL = "tool\x1b[31m[link=https://evil.example]x[/link]"
EVIL_MESSAGE = "step \x1b[2J\x1b[H1\x9b31m of 2\u202e\rdone"
EVIL_ERROR = {"code": -32603, "message": f"boom \x1b]0;{TITLE}\x07 [blink]now[/blink]"}
INERT = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def _seed_hostile(db_url: str) -> str:
    task_id = secrets.token_urlsafe(24)
    with psycopg.connect(db_url, autocommit=True) as conn:
        for n, (status, error) in enumerate([("working", None), ("failed", EVIL_ERROR)]):
            conn.execute(
                """INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status,
                     status_message, error, retention_ms, poll_interval_ms, queue, max_attempts,
                     protocol_version, client_capabilities, started_at)
                   VALUES (%s, %s, %s, %s, '{}', %s, %s, %s, 60000, 1000, 'mcp.default', 3,
                     '2026-07-28', '{}', now())""",
                (
                    task_id if n == 0 else secrets.token_urlsafe(24),
                    str(uuid.uuid4()),
                    EVIL_SUB,
                    EVIL_TOOL,
                    status,
                    EVIL_MESSAGE,
                    psycopg.types.json.Jsonb(error) if error else None,
                ),
            )
        conn.execute("UPDATE mcp_tasks SET worker = 'evil-host:101:n' WHERE task_id = %s", (task_id,))
    _register_worker(db_url, f"w\x1b]0;{TITLE}\x07@evil-host", "evil-host", ["GPU-\u202e0\x1b[2J"])
    return task_id


def _piped(db_url: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    # Wide enough that no cell is cut short with "…" (Rich otherwise sizes a pipe from whatever
    # terminal stdin happens to be, or 80 columns), and no terminal inherited.
    env |= {"MCP_TASKS_DATABASE_URL": db_url, "COLUMNS": "400"}
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


@pytest.mark.parametrize("command", [["ls"], ["show", "<task>"], ["top", "--once"]], ids=lambda c: c[0])
def test_escapes_and_markup_from_callers_and_tools_print_inert(db_url: str, command: list[str]) -> None:
    task_id = _seed_hostile(db_url)
    out = _piped(db_url, *[task_id if part == "<task>" else part for part in command])
    for control in INERT:
        assert control not in out, (control, out)
    assert "https://evil.example" not in out or "[link=https://evil.example]" in out  # text, never a link
    assert "[bold red]sub[/bold red]" in out  # markup stays literal text
    if command[0] == "show":
        assert "step 1 of 2 done" in out  # the readable rest of the message survives
    if command[0] == "top":
        assert "[blink]now[/blink]" in out
        assert "w@evil-host" in out and "GPU-0" in out  # the worker's readable rest survives


def test_an_escape_laden_sub_cannot_retitle_clear_or_link_the_operators_terminal(
    db_url: str, tmux: str
) -> None:
    _seed_hostile(db_url)
    _open(tmux, 200, db_url, "ls", "--wide")
    screen = wait_until(lambda: "EXIT=" in (s := _screen(tmux)) and s, 30, 0.1, what="ls to finish")
    assert "EXIT=0" in screen, screen
    title = subprocess.run(
        ["tmux", "display-message", "-p", "-t", tmux, "#{pane_title}"], capture_output=True, text=True
    ).stdout
    assert TITLE not in title, title
    # Not cleared: the first line the command printed is still at the top of the screen.
    assert screen.startswith("database: "), screen
    assert "[bold red]sub[/bold red]" in screen
    with_escapes = subprocess.run(
        ["tmux", "capture-pane", "-p", "-e", "-J", "-t", tmux], capture_output=True, text=True
    ).stdout
    assert "\x1b]8;" not in with_escapes  # no hyperlink anywhere on the screen
