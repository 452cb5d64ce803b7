"""A tool that crashes is visible to admins everywhere they look: ``tasks ls``, ``top``'s
failures panel, ``show``, ``mcp_tasks_overview`` and the README's "what failed today" query."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.support import REDIS_URL, ROOT, TEST_TOOL_MODULES, Stack, running_stack, wait_until


@pytest.fixture
def crash_stack(db_url: str) -> Iterator[Stack]:
    modules = json.dumps([*json.loads(TEST_TOOL_MODULES), "tests.fixtures.admin"])
    suffix = f"adm{uuid.uuid4().hex[:6]}"
    with running_stack("admin", db_url, REDIS_URL, suffix, MCP_TASKS_TOOL_MODULES=modules) as live:
        yield live


def _tasks(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env |= {"MCP_TASKS_DATABASE_URL": stack.database_url, "COLUMNS": "250"}
    ran = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return ran


def _readme_failed_today() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"-- What failed today, and why.*?\n(.*?);", readme, flags=re.S)
    assert block is not None
    return block.group(1)


def test_a_crashing_tool_is_listed_as_a_failure_with_its_kind_and_message(crash_stack: Stack) -> None:
    client = crash_stack.client()
    task_id = client.start("adm_crash", {"disk": "sdq"})
    done = client.wait_status(task_id)
    assert done["status"] == "completed"  # the wire status: a tool error ends completed + isError
    job_id = crash_stack.row(task_id)["job_id"]

    client.close()
    (listed,) = [r for r in json.loads(_tasks(crash_stack, "ls", "--json").stdout) if r["task_id"] == task_id]
    assert listed["error_kind"] == "crash" and "disk sdq is full" in listed["last_error"]
    errored = json.loads(_tasks(crash_stack, "ls", "--status", "errored", "--json").stdout)
    assert [r["task_id"] for r in errored] == [task_id]  # not the readiness check's greet
    row = next(line for line in _tasks(crash_stack, "ls").stdout.splitlines() if task_id in line)
    assert "errored" in row and "crash: " in row

    top = _tasks(crash_stack, "top", "--once").stdout
    failures = top.split("recent failures", 1)[1]
    assert job_id in failures and "crash" in failures and "disk sdq is full" in failures

    shown = json.loads(_tasks(crash_stack, "show", job_id[:8], "--json").stdout)["task"]
    assert shown["error_kind"] == "crash" and "disk sdq is full" in shown["error_message"]
    assert "Traceback" not in json.dumps(shown["result"])  # the message, never a stack trace

    with psycopg.connect(crash_stack.database_url) as conn:
        overview = conn.execute(
            "SELECT status, error_kind, last_error FROM mcp_tasks_overview WHERE task_id = %s", (task_id,)
        ).fetchone()
        assert overview is not None and overview[:2] == ("completed", "crash") and "sdq" in overview[2]
        failed_today = conn.execute(_readme_failed_today()).fetchall()
    assert [(tool, count) for tool, message, count in failed_today if "sdq" in message] == [("adm_crash", 1)]


def test_an_operator_cancel_by_prefix_stops_the_running_job(crash_stack: Stack) -> None:
    client = crash_stack.client()
    task_id = client.start("slow_compute", {"seconds": 60})
    client.close()
    job_id = crash_stack.row(task_id)["job_id"]
    wait_until(lambda: crash_stack.row(task_id)["started_at"] is not None, 30, 0.1, what="the job to start")
    ran = _tasks(crash_stack, "cancel", job_id[:8], "--reason", "drained by ops")
    assert f"cancelled task {task_id} (job {job_id})" in ran.stdout
    assert "broker" not in ran.stderr  # reached: the waiting job was woken
    # The job sees it at once (woken, not at a 60 s checkpoint) and winds down.
    wait_until(lambda: crash_stack.row(task_id)["finished_at"] is not None, 30, 0.2, what="the job to stop")
    row = crash_stack.row(task_id)
    assert (row["status"], row["status_message"]) == ("cancelled", "drained by ops")
