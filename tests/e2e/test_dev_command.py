"""``mcp-celery-tasks dev`` on embedded services: one command, a working server, a clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg.rows import dict_row

from mcp_celery_tasks.cli.dev import record as devrecord
from mcp_celery_tasks.cli.dev.embedded import ensure_system_user
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


def _start_dev(data_dir: Path, port: int, log: Path, **settings: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")} | settings
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


JOB_S = 6.0
"""How long the restarted job sleeps: longer than a stop takes to reach it (dev's poll, the
soft-shutdown window), so every stop finds it running."""


@pytest.mark.timeout(300)
def test_dev_stops_hand_a_running_job_back_as_a_redelivery_never_an_attempt(dev_dir: Path) -> None:
    data_dir = dev_dir / "data"
    port = free_port()
    stops = [signal.SIGHUP, signal.SIGINT, signal.SIGTERM]
    task_id, database_url, holder = "", "", None
    for restarts, stop in enumerate(stops):
        log = dev_dir / f"dev-{restarts}.log"
        with _dev_running(data_dir, port, log) as dev:
            if not task_id:
                task_id, database_url = _start_job(data_dir, port)
            row = wait_until(
                partial(_claimed_by_another, database_url, task_id, holder),
                60, 0.1, what=f"the job claimed after {restarts} restarts",
            )  # fmt: skip
            assert (row["status"], row["attempts"], row["redeliveries"]) == ("working", 1, restarts)
            holder = row["worker"]
            dev.send_signal(stop)
            if stop == signal.SIGINT:  # Ctrl-C pressed again while dev stops: the same stop
                wait_until(partial(_says, log, "stopping (SIGINT)"), 30, 0.05, what="dev stopping")
                dev.send_signal(signal.SIGINT)
            dev.wait(90)
        assert dev.returncode == 0, log.read_text()[-2000:]

    with _dev_running(data_dir, port, dev_dir / "dev-last.log"):
        row = wait_until(
            partial(_finished, database_url, task_id), JOB_S + 60, 0.2, what="the task to finish"
        )
    assert (row["status"], row["attempts"], row["redeliveries"]) == ("completed", 1, len(stops)), row
    assert row["result"]["content"][0]["text"] == f"done after {JOB_S}s"
    said = "".join(path.read_text() for path in [*dev_dir.glob("dev-*.log"), data_dir / "logs" / "dev.log"])
    assert said.count("waiting up to 1 s for slow_compute") == len(stops)
    worker_log = (data_dir / "logs" / "worker.log").read_text()
    assert worker_log.count("Initiating Soft Shutdown, terminating in 1.0 seconds") == len(stops)
    assert worker_log.count(f"job {row['job_id']} given back (stopping)") == len(stops)
    _nothing_left(data_dir, 30)


@contextlib.contextmanager
def _dev_running(data_dir: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """dev on ``data_dir`` with a soft-shutdown window of 1 s (its default is 3), once it printed
    its banner; stopped with Ctrl-C on the way out unless the body stopped it."""
    dev = _start_dev(data_dir, port, log, MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS="1")
    try:
        wait_until(partial(_says, log, "is running"), 120, 0.2, what="dev to print its banner")
        yield dev
    finally:
        if dev.poll() is None:
            dev.send_signal(signal.SIGINT)
            dev.wait(90)


def _says(log: Path, text: str) -> bool:
    return text in log.read_text()


def _start_job(data_dir: Path, port: int) -> tuple[str, str]:
    """A long ``slow_compute`` call; its task id and the stack's database URL."""
    task_id = Client(f"http://127.0.0.1:{port}/mcp").start("slow_compute", {"seconds": JOB_S})
    record = devrecord.read(data_dir / devrecord.RECORD_NAME)
    assert record is not None
    return task_id, record.database_url


def _finished(database_url: str, task_id: str) -> dict[str, Any] | None:
    row = _job_row(database_url, task_id)
    return row if row["status"] != "working" else None


def _job_row(database_url: str, task_id: str) -> dict[str, Any]:
    with psycopg.connect(database_url) as conn, conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(
            "SELECT status, attempts, redeliveries, worker, job_id, result FROM mcp_tasks WHERE task_id = %s",
            (task_id,),
        ).fetchone()
    assert found is not None
    return found


def _claimed_by_another(database_url: str, task_id: str, holder: str | None) -> dict[str, Any] | None:
    """The task's row once a worker other than ``holder`` (the last dev's) holds it."""
    row = _job_row(database_url, task_id)
    return row if row["worker"] not in (None, holder) else None


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
        assert listed.returncode == 0 and "database: the dev stack's (" in listed.stderr, listed.stderr
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


@pytest.mark.timeout(120)
def test_dev_refuses_a_taken_port_in_one_line_before_starting_anything(dev_dir: Path) -> None:
    data_dir = dev_dir / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = dev_dir / "dev.log"
        dev = _start_dev(data_dir, port, log)
        assert dev.wait(60) == 2, log.read_text()
    said = log.read_text()
    lines = said.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: port "), said
    assert str(port) in lines[0] and "--port" in lines[0]
    assert "is running" not in said and "Traceback" not in said
    assert not (data_dir / "postgres").exists() and not (data_dir / devrecord.RECORD_NAME).exists()
    _nothing_left(data_dir, 30)


@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded Postgres runs as its own user only under root")
def test_as_root_the_postgres_user_is_made_without_a_login_shell_or_home(
    capfd: pytest.CaptureFixture[str],
) -> None:
    name = f"mcpt_{uuid.uuid4().hex[:10]}"
    try:
        assert ensure_system_user(name) is True
        entry = pwd.getpwnam(name)
        assert entry.pw_shell in ("/usr/sbin/nologin", "/bin/false")
        assert not Path(entry.pw_dir).exists()
        (said,) = capfd.readouterr().err.splitlines()
        assert name in said and "no login shell" in said
        assert ensure_system_user(name) is False  # there already: nothing done, nothing said
        assert capfd.readouterr().err == ""
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
    with pytest.raises(KeyError):
        pwd.getpwnam(name)


def test_dev_psql_without_a_running_stack_says_so_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["PYTHONPATH"] = str(ROOT)
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "dev", "psql", "-c", "SELECT 1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2 and ran.stdout == ""
    (line,) = ran.stderr.splitlines()
    assert line.startswith("error: no running dev stack") and "./scripts/dev" in line
