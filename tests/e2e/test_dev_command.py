"""``mcp-celery-tasks dev`` on embedded services: one command, a working server, a clean stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mcp_celery_tasks.cli.dev import record as devrecord
from tests.support import ROOT, Client, free_port, wait_until


@pytest.fixture
def dev_dir() -> Iterator[Path]:
    """A folder outside pytest's own temp root: the embedded Postgres runs as another user when
    we are root and needs every parent traversable, while any pytest session that starts meanwhile
    (a second one on the machine) resets ``/tmp/pytest-of-<user>`` to 0700."""
    path = Path(tempfile.mkdtemp(prefix="mcpt-dev-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _processes_using(path: Path) -> list[psutil.Process]:
    """Every process whose command line or environment names ``path`` (the data dir is in
    Postgres's and Redis's command lines, and in every child's environment)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        try:
            environ = " ".join(proc.environ().values())
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            environ = ""
        if str(path) in cmdline or str(path) in environ:
            found.append(proc)
    return found


def _start_dev(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    # The examples (dev's default) plus one conformance fixture, through dev's --tools option.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mcp_celery_tasks.cli",
            "dev",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--tools",
            "workers,tests.fixtures.conformance",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.timeout(240)
def test_dev_runs_a_tool_on_embedded_services_stops_cleanly_and_reuses_its_data(dev_dir: Path) -> None:
    data_dir = dev_dir / "data"
    port = free_port()
    log = dev_dir / "dev.log"
    dev = _start_dev(data_dir, port, log)
    try:
        wait_until(lambda: "is running" in log.read_text(), 120, 0.2, what="dev to print its banner")
        client = Client(f"http://127.0.0.1:{port}/mcp")
        task_id = client.start("slow_compute", {"seconds": 0.1})
        assert client.wait_status(task_id)["status"] == "completed"
        banner = log.read_text()
        assert "redis+socket://" in banner and str(data_dir) in banner
        assert "search_logs" in banner and "slow_compute" in banner and "noop" not in banner
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(90)
    assert dev.returncode == 0, log.read_text()[-2000:]
    _nothing_left(data_dir, 30)

    # A second run finds the same database: the task is still there.
    dev = _start_dev(data_dir, port, log)
    try:
        wait_until(
            lambda: log.read_text().count("is running") >= 1 and _ready(port), 120, 0.2, what="restart"
        )
        assert Client(f"http://127.0.0.1:{port}/mcp").get(task_id).result["status"] == "completed"
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(90)
    _nothing_left(data_dir, 30)


def _ready(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ---- a dev stack that never leaks ----------------------------------------------------------

DEV_TOOLS = "workers,tests.fixtures.conformance"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["PYTHONPATH"] = str(ROOT)  # the checkout's package from any folder
    return env


def _dev_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mcp_celery_tasks.cli",
        "dev",
        "--port",
        str(port),
        "--tools",
        DEV_TOOLS,
    ]


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _start(checkout: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _dev_argv(port), cwd=checkout, env=_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def _keeper(data_dir: Path) -> psutil.Process:
    (keeper,) = [
        p
        for p in _processes_using(data_dir)
        if "mcp_celery_tasks.cli.dev.guard" in " ".join(p.info["cmdline"] or [])
    ]
    return keeper


def _nothing_left(data_dir: Path, within: float) -> None:
    left: list[str] = []

    def gone() -> bool:
        left[:] = [f"{p.pid} {p.info['cmdline']}"[:200] for p in _processes_using(data_dir)]
        return not left

    try:
        wait_until(gone, within, 0.5, what=f"every process of {data_dir} to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still running: {left}") from None


def _redis_servers(data_dir: Path) -> list[psutil.Process]:
    return [p for p in _processes_using(data_dir) if "redis-server" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.timeout(600)
def test_dev_never_leaks_after_sighup_or_kill_and_the_next_start_recovers(dev_dir: Path) -> None:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs tmux for the terminal tests")
        pytest.skip("tmux is not installed")
    checkout = dev_dir / "checkout"
    (checkout / "sub").mkdir(parents=True)
    data_dir = checkout / ".mcp-tasks"  # the default: how the CLI finds it from the checkout
    port = free_port()

    # 1. In a terminal that then closes (SIGHUP).
    session = f"mcpt-dev-{uuid.uuid4().hex[:8]}"
    command = " ".join(["cd", str(checkout), "&&", "env", f"PYTHONPATH={ROOT}", *_dev_argv(port)])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "50", command], check=True)
    try:
        wait_until(lambda: _ready(port) and (data_dir / "dev.json").exists(), 180, 0.5, what="dev in tmux")
        second = _cli(checkout, "dev", "--port", str(free_port()), "--tools", DEV_TOOLS)
        assert second.returncode == 2 and "already runs" in second.stderr, second.stderr
        listed = _cli(checkout / "sub", "tasks", "ls", "--json")
        assert listed.returncode == 0 and "using the dev stack of" in listed.stderr, listed.stderr
        called = _cli(checkout / "sub", "call", "slow_compute", "--arg", "seconds=0.1", "--json")
        assert called.returncode == 0, called.stderr
        assert json.loads(called.stdout)["status"] == "completed"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    _nothing_left(data_dir, 90)
    assert "stopping (SIGHUP)" in (data_dir / "logs" / "dev.log").read_text()
    assert not (data_dir / "dev.json").exists()

    # 2. dev killed with SIGKILL and started again at once: the new one waits until the old
    # one's keeper has stopped Redis and Postgres, then starts its own. Killed in turn, its
    # children get their signal from the kernel and its keeper stops the services.
    log = dev_dir / "dev.log"
    dev = _start(checkout, port, log)
    wait_until(lambda: _ready(port), 180, 0.5, what="dev")
    dev.kill()
    dev.wait()
    again = dev_dir / "again.log"
    dev = _start(checkout, port, again)
    wait_until(lambda: "is running" in again.read_text(), 180, 0.5, what="dev restarted at once")
    assert len(_redis_servers(data_dir)) == 1
    assert _cli(checkout, "call", "slow_compute", "--arg", "seconds=0.1", "--json").returncode == 0
    dev.kill()
    dev.wait()
    _nothing_left(data_dir, 90)
    assert devrecord.find(checkout) is None

    # 3. dev and its keeper both killed: Postgres and Redis stay behind. The next start reuses
    # that Postgres and replaces that Redis (never two on one socket), and its stop ends all.
    dev = _start(checkout, port, log)
    wait_until(lambda: _ready(port), 180, 0.5, what="dev")
    keeper = _keeper(data_dir)
    os.kill(dev.pid, signal.SIGKILL)
    keeper.kill()
    dev.wait()
    wait_until(lambda: not _ready(port), 60, 0.5, what="the API to die with dev")
    assert len(_redis_servers(data_dir)) == 1
    dev = _start(checkout, port, log)
    try:
        wait_until(lambda: _ready(port), 180, 0.5, what="dev after a double kill")
        assert len(_redis_servers(data_dir)) == 1
        assert _cli(checkout, "call", "slow_compute", "--arg", "seconds=0.1", "--json").returncode == 0
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(120)
    assert dev.returncode == 0, log.read_text()[-2000:]
    _nothing_left(data_dir, 30)
