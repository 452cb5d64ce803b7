"""``mcp-celery-tasks dev`` on embedded services: one command, a working server, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import ROOT, Client, free_port, wait_until


def _processes_using(path: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(path) in cmdline:
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
def test_dev_runs_a_tool_on_embedded_services_stops_cleanly_and_reuses_its_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    log = tmp_path / "dev.log"
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
    assert _processes_using(data_dir) == []

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
    assert _processes_using(data_dir) == []


def _ready(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
