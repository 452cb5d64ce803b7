"""``mcp-celery-tasks call``: scripted (--json), in a real terminal (tmux), and resumable."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, Client, Stack, free_port, wait_until


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _call(stack: Stack, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(tmp_path, "call", "--url", stack.url, *args)


def _one_error_line(ran: subprocess.CompletedProcess[str]) -> str:
    """The single friendly line an expected failure prints (never a traceback)."""
    assert "Traceback" not in ran.stderr and "Error" not in ran.stderr.replace("error:", "")
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


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


def test_call_reports_a_json_rpc_error_in_one_line(stack: Stack, tmp_path: Path) -> None:
    unknown = _call(stack, tmp_path, "--resume", "no-such-task", "--json")
    assert unknown.returncode == 2
    assert "(-32602)" in _one_error_line(unknown)


def test_call_with_the_server_down_says_so_in_one_line(tmp_path: Path) -> None:
    down = _run(tmp_path, "call", "noop", "--url", f"http://127.0.0.1:{free_port()}/mcp")
    assert down.returncode == 3
    assert "cannot reach http://127.0.0.1:" in _one_error_line(down)
    listing = _run(tmp_path, "tools", "--url", f"http://127.0.0.1:{free_port()}/mcp")
    assert listing.returncode == 3
    _one_error_line(listing)


def test_call_gives_up_on_a_server_that_never_answers(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        hung = _run(tmp_path, "call", "noop", "--url", url, "--timeout", "0.5")
    assert hung.returncode == 3
    assert f"no answer from {url} within 0.5 s" in _one_error_line(hung)


def test_call_refuses_an_answers_file_it_cannot_use_before_calling(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/mcp"  # checked before any request: no server needed
    not_json = tmp_path / "answers.json"
    not_json.write_text("{'confirm': yes}")
    wrong_shape = tmp_path / "shape.json"
    wrong_shape.write_text('{"confirm": true}')
    for path, problem in [
        (tmp_path / "missing.json", "cannot read --answers"),
        (tmp_path, "cannot read --answers"),  # a directory
        (not_json, "is not JSON"),
        (wrong_shape, '"confirm": expected an answer object such as {"action": "accept"'),
    ]:
        refused = _run(tmp_path, "call", "noop", "--url", nowhere, "--json", "--answers", str(path))
        assert refused.returncode == 2, refused.stderr
        assert problem in _one_error_line(refused)


def test_call_refuses_a_mistyped_argument_before_calling(stack: Stack, tmp_path: Path) -> None:
    refused = _call(stack, tmp_path, "slow_compute", "--arg", "secs=1")
    assert refused.returncode == 2
    line = _one_error_line(refused)
    assert line == (
        "error: slow_compute has no argument secs (did you mean seconds?); its arguments: [seconds], [label]"
    )
    assert not (tmp_path / "state" / "mcp-celery-tasks" / "tasks.json").exists()  # no task started
    missing = _call(stack, tmp_path, "count_words")
    assert missing.returncode == 2
    assert "count_words needs --arg paths=…" in _one_error_line(missing)


def test_call_refuses_an_argument_of_the_wrong_type_before_calling(stack: Stack, tmp_path: Path) -> None:
    for args in (["--arg", "seconds=soon"], ["--arg", "seconds=soon", "--json"]):
        refused = _call(stack, tmp_path, "slow_compute", *args)
        assert refused.returncode == 2, refused.stderr
        assert (
            _one_error_line(refused) == "error: --arg seconds=soon: slow_compute takes a number for seconds"
        )
        assert refused.stdout == ""
    assert not (tmp_path / "state" / "mcp-celery-tasks" / "tasks.json").exists()  # no task started
    typed = _call(stack, tmp_path, "slow_compute", "--arg", "seconds=0.1", "--arg", "label=42", "--json")
    assert json.loads(typed.stdout)["result"]["content"][0]["text"] == "done after 0.1s (42)"


def test_call_suggests_a_tool_for_an_unknown_name(stack: Stack, tmp_path: Path) -> None:
    refused = _call(stack, tmp_path, "slow_compte")
    assert refused.returncode == 2
    line = _one_error_line(refused)
    assert "unknown tool 'slow_compte': did you mean slow_compute?" in line
    assert "greet" in line and "train_model" in line


def test_call_json_says_which_questions_it_declined(stack: Stack, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confim": {"action": "accept", "content": {"confirm": True}}}))
    declined = _call(
        stack, tmp_path, "confirm_delete", "--arg", "filename=z.txt", "--json", "--answers", str(answers)
    )
    assert declined.returncode == 0
    assert json.loads(declined.stdout)["result"]["content"][0]["text"] == "Kept z.txt (decline)"
    said = declined.stderr.strip().splitlines()
    assert len(said) == 1
    assert said[0].startswith('declined form "') and "(Delete z.txt?)" in said[0]
    assert '--answers has no "' in said[0] and '(it has "confim")' in said[0]


@pytest.fixture
def leftovers(stack: Stack, tmp_path: Path) -> Iterator[None]:
    """Cancel, after the test, every task a ``call`` under test left behind (a failing run must
    not keep the shared worker's slots busy for the tests after it)."""
    yield
    saved = tmp_path / "state" / "mcp-celery-tasks" / "tasks.json"
    if saved.exists():
        client = Client(stack.url)
        for task_id in json.loads(saved.read_text() or "{}"):
            client.cancel(task_id)


def _no_terminal(stack: Stack, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``call`` as a script runs it: stdin not a terminal. Also how long it took."""
    began = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "call", "--url", stack.url, *args],
        cwd=ROOT,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return ran, time.monotonic() - began


@pytest.mark.parametrize("mode", [["--json"], []], ids=["json", "stdin-not-a-terminal"])
@pytest.mark.usefixtures("leftovers")
def test_call_without_a_terminal_declines_sampling_at_once_and_ends(
    stack: Stack, tmp_path: Path, mode: list[str]
) -> None:
    name = f"summarize-{tmp_path.name}.txt"
    (Path(stack.env["MCP_EXAMPLES_FILES_ROOT"]) / name).write_text("A file to summarize.")
    ran, took = _no_terminal(stack, tmp_path, "summarize_file", "--arg", f"path={name}", *mode)
    assert took < 30, ran.stderr  # used to wait on the sampling request until killed
    assert ran.returncode == 1, ran.stderr  # the tool's error: the declined model said nothing
    assert 'declined sampling request "summary": no terminal to answer it (use --answers FILE)' in ran.stderr
    if mode:
        task = json.loads(ran.stdout)
        assert task["status"] == "completed" and task["result"]["isError"] is True
        assert "the client's model (none) answered without any text" in task["result"]["content"][0]["text"]
    else:
        assert "the client's model (none) answered without any text" in ran.stdout
        assert ran.stderr.strip().splitlines()[-1].startswith("tool error after ")


def _popen(stack: Stack, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "call", "--url", stack.url, *args],
        cwd=ROOT,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _running_task(stack: Stack, tmp_path: Path) -> str:
    """The id of the task the ``call`` under test started, once a worker runs its tool."""
    saved = tmp_path / "state" / "mcp-celery-tasks" / "tasks.json"

    def running() -> str | None:
        try:
            ids = list(json.loads(saved.read_text()))
        except (FileNotFoundError, ValueError):
            return None
        return ids[0] if ids and stack.row(ids[0])["started_at"] is not None else None

    return str(wait_until(running, 60, 0.1, what="the call's task to run"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.usefixtures("leftovers")
def test_a_signal_cancels_the_task_like_ctrl_c(stack: Stack, tmp_path: Path, sig: signal.Signals) -> None:
    call = _popen(stack, tmp_path, "slow_compute", "--arg", "seconds=120", "--json")
    try:
        task_id = _running_task(stack, tmp_path)
        call.send_signal(sig)
        out, err = call.communicate(timeout=30)
    finally:
        call.kill()
    assert call.returncode == 130, err
    assert f"{sig.name}: cancelling…" in err
    assert json.loads(out)["status"] == "cancelled"
    assert stack.row(task_id)["status"] == "cancelled"


@pytest.mark.usefixtures("leftovers")
def test_with_detach_a_signal_leaves_the_task_running_to_resume(stack: Stack, tmp_path: Path) -> None:
    call = _popen(stack, tmp_path, "slow_compute", "--arg", "seconds=3", "--arg", "label=kept", "--detach")
    try:
        task_id = _running_task(stack, tmp_path)
        call.send_signal(signal.SIGTERM)
        _, err = call.communicate(timeout=30)
    finally:
        call.kill()
    assert call.returncode == 130, err
    assert (
        f"SIGTERM: left task {task_id} running (--detach); "
        f"follow it with: mcp-celery-tasks call --resume {task_id}"
    ) in err
    assert stack.row(task_id)["status"] == "working"
    resumed = _run(tmp_path, "call", "--resume", task_id, "--json")  # the URL is remembered
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"]["content"][0]["text"] == "done after 3.0s (kept)"


def test_tools_lists_name_mode_arguments_and_description(stack: Stack, tmp_path: Path) -> None:
    listed = _run(tmp_path, "tools", "--url", stack.url)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    assert rows["tool"] == ["tool", "mode", "arguments", "description"]
    assert rows["slow_compute"][:4] == ["slow_compute", "optional", "[seconds],", "[label]"]
    assert rows["greet"][:3] == ["greet", "forbidden", "name"]
    assert " ".join(rows["greet"][3:]) == "Say hello (always synchronous)."
    assert rows["failing_job"][1] == "required"
    as_json = json.loads(_run(tmp_path, "tools", "--url", stack.url, "--json").stdout)
    greet = next(t for t in as_json if t["name"] == "greet")
    assert greet["mode"] == "forbidden"
    assert greet["inputSchema"]["required"] == ["name"]


def test_call_prints_a_structured_result_indented_then_how_it_ended(stack: Stack, tmp_path: Path) -> None:
    name = f"doc-{tmp_path.name}.txt"  # inside the stack's files root (MCP_EXAMPLES_FILES_ROOT)
    (Path(stack.env["MCP_EXAMPLES_FILES_ROOT"]) / name).write_text("one two three")
    done = _call(stack, tmp_path, "count_words", "--arg", f'paths=["{name}"]')
    assert done.returncode == 0, done.stderr
    assert done.stdout == json.dumps({name: 3}, indent=2) + "\n"
    assert re.fullmatch(r"completed in \d+\.\d s", done.stderr.strip().splitlines()[-1])


def test_call_ends_with_a_status_line_and_its_exit_code(stack: Stack, tmp_path: Path) -> None:
    failed = _call(stack, tmp_path, "protocol_error_job")
    assert failed.returncode == 1
    assert re.fullmatch(
        r"failed after \d+\.\d s: protocol_error_job: internal failure on purpose \(-32603\)",
        failed.stderr.strip().splitlines()[-1],
    )
    assert failed.stdout == ""
    tool_error = _call(stack, tmp_path, "failing_job")
    assert tool_error.returncode == 1
    assert tool_error.stdout == "failing_job failed on purpose\n"
    assert re.fullmatch(r"tool error after \d+\.\d s", tool_error.stderr.strip().splitlines()[-1])


def test_call_resume_counts_time_from_the_task_creation(stack: Stack, tmp_path: Path) -> None:
    client = Client(stack.url)
    task_id = client.start("slow_compute", {"seconds": 1})
    client.wait_status(task_id)
    resumed = _call(stack, tmp_path, "--resume", task_id)  # done already: this process waits for nothing
    assert resumed.returncode == 0, resumed.stderr
    last = resumed.stderr.strip().splitlines()[-1]
    assert 1.0 <= float(last.removeprefix("completed in ").removesuffix(" s")) < 10, last


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


def _keys(session: str, *keys: str) -> None:
    subprocess.run(["tmux", "send-keys", "-t", session, *keys], check=True)


def test_terminal_form_never_defaults_to_accept_or_yes_and_asks_once(
    stack: Stack, tmp_path: Path, tmux: str
) -> None:
    began = time.monotonic()
    _start(tmux, stack, tmp_path, "confirm_delete", "--arg", "filename=t.txt")
    wait_until(lambda: "accept, decline or cancel" in _screen(tmux), 30, 0.1, what="the form prompt")
    asked = time.monotonic()
    assert "Delete t.txt?" in _screen(tmux)
    _keys(tmux, "Enter")  # Enter alone accepts nothing
    wait_until(
        lambda: "Type a (accept), d (decline) or c (cancel)" in _screen(tmux), 10, 0.1, what="a re-ask"
    )
    _keys(tmux, "a", "Enter")
    wait_until(lambda: "confirm [y/n]" in _screen(tmux), 10, 0.1, what="the field prompt")
    _keys(tmux, "Enter")  # nor does it say yes to a question without a default
    wait_until(lambda: "Type y or n" in _screen(tmux), 10, 0.1, what="the field asked again")
    time.sleep(2)  # the user thinks: time the closing line must not count
    _keys(tmux, "y", "Enter")
    answered = time.monotonic()
    wait_until(lambda: "EXIT=0" in _screen(tmux), 30, 0.1, what="the call to finish")
    total = time.monotonic() - began
    screen = _screen(tmux)
    assert "Deleted t.txt" in screen
    assert screen.count("Delete t.txt?") == 1
    reported = re.search(r"completed in (\d+\.\d) s", screen)
    assert reported is not None, screen
    assert float(reported.group(1)) <= total - (answered - asked) + 0.5


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


@pytest.mark.usefixtures("leftovers")
def test_terminal_closed_cancels_the_task(stack: Stack, tmp_path: Path, tmux: str) -> None:
    _start(tmux, stack, tmp_path, "slow_compute", "--arg", "seconds=120", "--arg", "label=closed")
    wait_until(lambda: "computing closed" in _screen(tmux), 30, 0.1, what="the live status line")
    task_id = _screen(tmux).split("task ", 1)[1].split()[0]
    subprocess.run(["tmux", "kill-session", "-t", tmux], check=True)  # SIGHUP, as a closed window
    wait_until(lambda: stack.row(task_id)["status"] == "cancelled", 30, 0.2, what="the task cancelled")


@pytest.mark.usefixtures("leftovers")
def test_terminal_live_line_says_a_task_waits_before_its_tool_reports(
    stack: Stack, tmp_path: Path, tmux: str
) -> None:
    client = Client(stack.url)
    busy = [client.start("slow_compute", {"seconds": 120, "label": "busy"}) for _ in range(2)]
    try:
        wait_until(  # both worker slots taken (the stack's worker runs two)
            lambda: all(stack.row(t)["started_at"] is not None for t in busy), 60, 0.1, what="busy slots"
        )
        _start(tmux, stack, tmp_path, "slow_compute", "--arg", "seconds=0.5", "--arg", "label=later")
        wait_until(
            lambda: "waiting for a worker slot or the tool's first report" in _screen(tmux),
            30,
            0.1,
            what="the waiting line",
        )
        assert "working" in _screen(tmux)
    finally:
        for task_id in busy:
            client.cancel(task_id)
    wait_until(lambda: "EXIT=0" in _screen(tmux), 60, 0.1, what="the call to finish once a slot is free")
    assert "done after 0.5s (later)" in _screen(tmux)


def test_call_drives_another_sep_2663_server_fastmcp_tasks(tmp_path: Path) -> None:
    """Opt-in (MCP_TASKS_TEST_FASTMCP_PYTHON=<python with fastmcp[tasks]==4.1.4>): the same
    client against the peer implementation, including an input round trip."""
    python = os.environ.get("MCP_TASKS_TEST_FASTMCP_PYTHON")
    fixture = ROOT.parent / "shared" / "bench" / "fixtures" / "fastmcp_tasks_fixture.py"
    if not python or not fixture.exists():
        pytest.skip("set MCP_TASKS_TEST_FASTMCP_PYTHON to a venv with fastmcp[tasks]==4.1.4")
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


HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;https://evil.example/\x1b\\[bold]x[/bold]\x1b]8;;\x1b\\\u202e"


def test_call_prints_a_tools_result_and_errors_inert(stack: Stack, tmp_path: Path) -> None:
    # Red team N5: what a tool returns (here: its argument echoed back) and what the server says
    # about a caller's input reach the terminal as text, never as escapes or markup.
    done = _call(stack, tmp_path, "slow_compute", "--arg", "seconds=0", "--arg", f"label={HOSTILE}")
    assert done.returncode == 0, done.stderr
    assert "done after 0.0s ([bold]x[/bold])" in done.stdout, done.stdout
    refused = _call(stack, tmp_path, f"no_such_tool{HOSTILE}")
    line = _one_error_line(refused)
    for output in (done.stdout, done.stderr, refused.stdout, refused.stderr):
        assert not any(control in output for control in ("\x1b", "\x07", "\u202e")), repr(output)
    assert "no_such_tool" in line
