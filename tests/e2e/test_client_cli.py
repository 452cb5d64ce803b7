"""``mcp-celery-tasks call``: scripted (--json), in a real terminal (tmux), and resumable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, Client, Stack, wait_until


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _call(stack: Stack, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "call", "--url", stack.url, *args],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_call_json_follows_the_task_to_its_result_and_forgets_the_id(stack: Stack, tmp_path: Path) -> None:
    done = _call(stack, tmp_path, "slow_compute", "--arg", "seconds=0.5", "--arg", "label=cli", "--json")
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)
    assert task["status"] == "completed"
    assert task["result"]["content"][0]["text"] == "done after 0.5s (cli)"
    saved = tmp_path / "state" / "mcp-celery-tasks" / "tasks.json"
    assert json.loads(saved.read_text()) == {}


def test_call_json_answers_input_from_a_file(stack: Stack, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"*": {"action": "accept", "content": {"confirm": True}}}))
    done = _call(
        stack, tmp_path, "confirm_delete", "--arg", "filename=x.txt", "--json", "--answers", str(answers)
    )
    assert json.loads(done.stdout)["result"]["content"][0]["text"] == "Deleted x.txt"
    declined = _call(stack, tmp_path, "confirm_delete", "--arg", "filename=y.txt", "--json")
    assert "Kept y.txt (decline)" in declined.stdout


def test_call_resume_picks_up_a_task_started_elsewhere(stack: Stack, tmp_path: Path) -> None:
    task_id = Client(stack.url).start("slow_compute", {"seconds": 1})
    resumed = _call(stack, tmp_path, "--resume", task_id, "--json")
    assert json.loads(resumed.stdout)["status"] == "completed"


def test_call_reports_a_json_rpc_error_clearly(stack: Stack, tmp_path: Path) -> None:
    failed = _call(stack, tmp_path, "no_such_tool", "--json")
    assert failed.returncode == 2
    assert "Unknown tool: no_such_tool" in failed.stderr


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs tmux for the terminal tests")
        pytest.skip("tmux is not installed")
    session = f"mcpt-{uuid.uuid4().hex[:8]}"
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def _screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout


def _start(session: str, stack: Stack, tmp_path: Path, *args: str) -> None:
    command = " ".join(
        [
            sys.executable,
            "-m",
            "mcp_celery_tasks.cli",
            "call",
            "--url",
            stack.url,
            *args,
            "; echo EXIT=$?; sleep 60",
        ]
    )
    env_prefix = f"cd {ROOT} && XDG_STATE_HOME={tmp_path / 'state'} "
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "140", "-y", "40", env_prefix + command],
        check=True,
    )


def test_terminal_shows_progress_asks_the_form_once_and_prints_the_result(
    stack: Stack, tmp_path: Path, tmux: str
) -> None:
    _start(tmux, stack, tmp_path, "confirm_delete", "--arg", "filename=t.txt")
    wait_until(lambda: "accept, decline or cancel" in _screen(tmux), 30, 0.1, what="the form prompt")
    assert "Delete t.txt?" in _screen(tmux)
    subprocess.run(["tmux", "send-keys", "-t", tmux, "Enter"], check=True)
    wait_until(lambda: "confirm [y/n]" in _screen(tmux), 10, 0.1, what="the field prompt")
    subprocess.run(["tmux", "send-keys", "-t", tmux, "y", "Enter"], check=True)
    wait_until(lambda: "EXIT=0" in _screen(tmux), 30, 0.1, what="the call to finish")
    screen = _screen(tmux)
    assert "Deleted t.txt" in screen
    assert screen.count("Delete t.txt?") == 1


def test_terminal_ctrl_c_cancels_the_task(stack: Stack, tmp_path: Path, tmux: str) -> None:
    _start(tmux, stack, tmp_path, "slow_compute", "--arg", "seconds=60", "--arg", "label=watch")
    wait_until(lambda: "computing watch" in _screen(tmux), 30, 0.1, what="the live status line")
    screen = _screen(tmux)
    task_id = screen.split("task ", 1)[1].split()[0]
    assert "working" in screen
    subprocess.run(["tmux", "send-keys", "-t", tmux, "C-c"], check=True)
    wait_until(lambda: "EXIT=130" in _screen(tmux), 30, 0.1, what="the call to exit after Ctrl-C")
    assert "cancelled" in _screen(tmux)
    assert stack.row(task_id)["status"] == "cancelled"


def test_call_drives_another_sep_2663_server_fastmcp_tasks(tmp_path: Path) -> None:
    """Opt-in (MCP_TASKS_TEST_FASTMCP_PYTHON=<python with fastmcp[tasks]==4.1.4>): the same
    client against the peer implementation, including an input round trip."""
    python = os.environ.get("MCP_TASKS_TEST_FASTMCP_PYTHON")
    fixture = ROOT.parent / "shared" / "bench" / "fixtures" / "fastmcp_tasks_fixture.py"
    if not python or not fixture.exists():
        pytest.skip("set MCP_TASKS_TEST_FASTMCP_PYTHON to a venv with fastmcp[tasks]==4.1.4")
    from tests.support import free_port

    port = free_port()
    server = subprocess.Popen(
        [python, str(fixture), str(port)],
        cwd=fixture.parent,
        env={**os.environ, "FIXTURE_DOCKET_URL": "memory://"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        peer = Stack.__new__(Stack)
        peer.url = f"http://127.0.0.1:{port}/mcp"

        def up() -> bool:
            return _call(peer, tmp_path, "noop", "--json").returncode == 0

        wait_until(up, 60, 0.5, what="the fastmcp-tasks fixture server")
        slept = json.loads(_call(peer, tmp_path, "sleep_ms", "--arg", "ms=200", "--json").stdout)
        assert slept["status"] == "completed" and "slept 200 ms" in slept["result"]["content"][0]["text"]
        answers = tmp_path / "answers.json"
        answers.write_text(json.dumps({"*": {"action": "accept", "content": {"answer": "42"}}}))
        asked = json.loads(_call(peer, tmp_path, "ask", "--json", "--answers", str(answers)).stdout)
        assert "42" in asked["result"]["content"][0]["text"]
    finally:
        server.terminate()
        server.wait(10)
