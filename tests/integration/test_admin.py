"""The admin surface: the README's SQL runs as written, and the tasks CLI over real rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import psycopg

from tests.support import ROOT


def _readme_sql() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    statements = [s.strip() for block in blocks for s in block.split(";")]
    return [s for s in statements if s and not all(line.startswith("--") for line in s.splitlines())]


def _seed(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for index, (status, error) in enumerate(
            [("input_required", None), ("failed", '{"code": -32603, "message": "boom"}'), ("completed", None)]
        ):
            conn.execute(
                """INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, error,
                     retention_ms, poll_interval_ms, queue, max_attempts, protocol_version,
                     client_capabilities, started_at, finished_at)
                   VALUES (%s, %s, 'anon', 'demo', '{}', %s, %s, 60000, 1000, 'q', 3, '2026-07-28', '{}',
                     now() - interval '2 seconds',
                     CASE WHEN %s = 'input_required' THEN NULL ELSE now() END)""",
                (f"task-{index}", f"job-{index}", status, error, status),
            )
        conn.execute(
            "INSERT INTO mcp_task_inputs (task_id, key, method, params, params_hash)"
            " VALUES ('task-0', 'k', 'elicitation/create', '{}', 'h')"
        )


def test_readme_admin_queries_run_and_answer(db_url: str) -> None:
    _seed(db_url)
    statements = _readme_sql()
    assert len(statements) == 3
    with psycopg.connect(db_url) as conn:
        waiting, failed, slowest = (conn.execute(sql).fetchall() for sql in statements)  # type: ignore[call-overload]
    assert [row[0] for row in waiting] == ["task-0"] and waiting[0][4] == 1
    assert failed == [("demo", "boom", 1)]
    assert slowest[0][0] == "demo"


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["MCP_TASKS_DATABASE_URL"] = db_url
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_tasks_cli_lists_filters_shows_and_purges(db_url: str) -> None:
    _seed(db_url)
    listed = json.loads(_cli(db_url, "ls", "--json").stdout)
    assert {row["task_id"] for row in listed} == {"task-0", "task-1", "task-2"}
    waiting = json.loads(_cli(db_url, "ls", "--status", "input_required", "--json").stdout)
    assert [row["task_id"] for row in waiting] == ["task-0"]
    shown = json.loads(_cli(db_url, "show", "job-1", "--json").stdout)
    assert shown["task"]["task_id"] == "task-1" and shown["task"]["error"]["message"] == "boom"
    assert _cli(db_url, "show", "nope").returncode == 1
    purged = _cli(db_url, "purge", "--older-than", "0s", "--yes")
    assert "deleted 2 tasks" in purged.stdout  # the running task stays
    assert [row["task_id"] for row in json.loads(_cli(db_url, "ls", "--json").stdout)] == ["task-0"]


def test_tasks_top_once_shows_active_tasks_and_recent_failures(db_url: str) -> None:
    _seed(db_url)
    screen = _cli(db_url, "top", "--once")
    assert screen.returncode == 0, screen.stderr
    assert "waiting for input" in screen.stdout and "demo" in screen.stdout
    assert "boom" in screen.stdout  # the failed task's error


def test_admins_see_the_fair_backlog_per_principal_and_a_task_s_place_in_line(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for index, (owner, dispatched) in enumerate(
            [("token:alice", True), ("token:alice", False), ("token:alice", False), ("token:bob", False)]
        ):
            conn.execute(
                """INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status,
                     retention_ms, poll_interval_ms, queue, max_attempts, protocol_version,
                     client_capabilities, created_at, dispatched_at)
                   VALUES (%s, %s, %s, 'demo', '{}', 'working', 60000, 1000, 'q', 3, '2026-07-28', '{}',
                     now() - %s * interval '1 second', CASE WHEN %s THEN now() END)""",
                (f"task-{index}", f"job-{index}", owner, 10 - index, dispatched),
            )
    listed = {row["task_id"]: row for row in json.loads(_cli(db_url, "ls", "--json").stdout)}
    assert listed["task-2"]["status_message"] == "queued (fair backlog)"
    assert listed["task-0"]["status_message"] is None  # in the broker: no longer in the backlog
    # task-2: alice's task-1 ahead, bob's one, and the one queued in the broker.
    shown = json.loads(_cli(db_url, "show", "task-2", "--json").stdout)
    assert shown["task"]["place_in_line"] == "3 jobs ahead (fair backlog)"
    screen = _cli(db_url, "top", "--once")
    assert screen.returncode == 0, screen.stderr
    assert (
        "per principal" in screen.stdout and "token:alice" in screen.stdout and "token:bob" in screen.stdout
    )


def test_limits_set_ls_clear_round_trip(db_url: str) -> None:
    import json as _json
    import os
    import subprocess
    import sys

    from tests.support import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["MCP_TASKS_DATABASE_URL"] = db_url

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "limits", *args],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert cli("set", "token:alice", "--max-active", "5000", "--note", "batch team").returncode == 0
    assert cli("set", "token:alice", "--rate", "50").returncode == 0  # the earlier value stays
    (row,) = _json.loads(cli("ls", "--json").stdout)
    assert (row["principal"], row["max_active_tasks"], row["creates_per_second"]) == (
        "token:alice",
        5000,
        50.0,
    )
    assert row["note"] == "batch team" and row["create_burst"] is None
    assert cli("set", "token:alice").returncode == 2  # nothing to set
    assert cli("clear", "token:alice").returncode == 0
    assert _json.loads(cli("ls", "--json").stdout) == []
    assert cli("clear", "token:alice").returncode == 1
