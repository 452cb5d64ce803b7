"""The README's commands meant for a running ``./scripts/dev`` run as written against one.

They are the ``bash`` blocks right after the (invisible) comment ``MARKER``. Each line is run by
bash, in a folder whose ``.mcp-tasks/`` holds a real dev stack (as ``./scripts/dev`` leaves it),
with ``mcp-celery-tasks`` on ``PATH``, and must exit 0 without a traceback. A ``<…>`` placeholder
gets a real id (``PLACEHOLDERS``); one with no value fails the test, so a new placeholder is
given one. A live view whose comment says "Ctrl-C quits" (``tasks top``) gets that Ctrl-C once
it has drawn its screen, and must then exit 0 too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, Client, free_port, wait_until

MARKER = "<!-- runs against ./scripts/dev: tests/e2e/test_readme_commands.py -->"
LIVE_REFRESHES_S = 2.5
COMMAND_S = 60.0
FINISHED = "<task id>"
RUNNING = ("<task id, job id or a 6+ character prefix>", "<task id, job id or prefix>")


def readme_commands() -> list[str]:
    """Every command line of the marked blocks (continuations joined, comments kept: bash
    skips them)."""
    text = (ROOT / "README.md").read_text()
    commands: list[str] = []
    for block in re.findall(re.escape(MARKER) + r"\n```bash\n(.*?)\n```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(line)
    return commands


def test_the_marked_blocks_hold_the_commands_a_reader_runs_against_dev() -> None:
    commands = readme_commands()
    assert (ROOT / "README.md").read_text().count(MARKER) == len(
        re.findall(re.escape(MARKER) + r"\n```bash\n", (ROOT / "README.md").read_text())
    )  # every marker is right above a bash block
    for expected in ("call train_model", "--answers answers.json", "tasks ls", "tasks top", "dev psql"):
        assert any(expected in command for command in commands), expected


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A folder outside pytest's temp root (the embedded Postgres runs as another user when we
    are root and needs every parent traversable)."""
    path = Path(tempfile.mkdtemp(prefix="mcpt-readme-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # the examples (`workers`) from this checkout
    env.pop("COLUMNS", None)
    return env


def _run(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run to its end; a live view (its comment says "Ctrl-C quits") until it has drawn its
    screen, then the Ctrl-C."""
    live = "Ctrl-C quits" in command
    said = cwd / "command.out"
    with said.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        if live:
            wait_until(lambda: bool(said.read_text().strip()), COMMAND_S, 0.2, what=command)
            time.sleep(LIVE_REFRESHES_S)  # a refresh or two of the live view
            os.killpg(proc.pid, signal.SIGINT)  # the Ctrl-C the README tells a reader to press
        # "y": what a reader answers to a confirmation (purge asks first).
        proc.communicate(None if live else "y\n", timeout=COMMAND_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, said.read_text()


def _job_id(task_id: str, cwd: Path, env: dict[str, str]) -> str:
    listed = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "ls", "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (job_id,) = [row["job_id"] for row in json.loads(listed.stdout) if row["task_id"] == task_id]
    return str(job_id)


@pytest.mark.timeout(180)
def test_every_marked_readme_command_runs_against_a_real_dev_stack(checkout: Path) -> None:
    commands = readme_commands()
    env = _env()
    port = free_port()
    log = checkout / "dev.log"
    dev = subprocess.Popen(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "dev", "--port", str(port)],
        cwd=checkout,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: "is running" in log.read_text(), 120, 0.2, what="dev to print its banner")
        client = Client(f"http://127.0.0.1:{port}/mcp")
        try:
            finished = client.start("count_words", {"paths": ["notes.txt"]})
            assert client.wait_status(finished)["status"] == "completed"
            running = client.start("train_model", {"model": "forever", "epochs": 100_000})
        finally:
            client.close()
        # The job id (a UUID) for the running one: a task id may start with '-', which the
        # README's paragraph covers (`tasks show -- -Xy3q9`), not its commands.
        job_id = _job_id(running, checkout, env)
        values = {FINISHED: finished, RUNNING[0]: job_id[:8], RUNNING[1]: job_id}
        for command in commands:
            for placeholder, value in values.items():
                command = command.replace(placeholder, value)
            assert not re.search(r"<[^>]+>", command), f"no value for the placeholder in {command!r}"
            started = time.monotonic()
            code, out = _run(command, checkout, env)
            print(f"{time.monotonic() - started:5.1f} s  {command}")
            assert code == 0 and "Traceback" not in out, f"{command!r} exited {code}:\n{out[-3000:]}"
            if "dev psql" in command:
                assert "completed" in out and "rows)" in out, out  # the counts themselves
            if "--answers answers.json" in command:
                assert '"status": "completed"' in out and '"isError": false' in out, out
            if "--save-artifacts out" in command:  # the weights' link, saved
                assert "saved moons.npz" in out and (checkout / "out" / "moons.npz").stat().st_size > 0, out
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(90)
    assert dev.returncode == 0, log.read_text()[-2000:]
