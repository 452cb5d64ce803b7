"""The admin surface: the README's SQL runs as written, and the tasks CLI over real rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from mcp_celery_tasks.cli.admin.connect import redact
from mcp_celery_tasks.cli.dev import record as devrecord
from tests.support import ROOT, create_database, drop_database, dsn_for, free_port, wait_until


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
    with psycopg.connect(db_url, autocommit=True) as conn:  # a GPU worker running task-0 on device 1
        for node, devices in (("gpu@pod-a", '["0", "1"]'), ("cpu@pod-b", None)):
            conn.execute(
                """INSERT INTO mcp_workers (node, hostname, pid, pids, queues, slots, devices, instance,
                     expires_at)
                   VALUES (%s, split_part(%s, '@', 2), 100, '{101}', '{q}', 2, %s, 'i',
                     now() + interval '1 minute')""",
                (node, node, devices),
            )
        conn.execute("UPDATE mcp_tasks SET worker = 'pod-a:101:n', device = '1' WHERE task_id = 'task-0'")
    statements = _readme_sql()
    assert len(statements) == 4
    with psycopg.connect(db_url) as conn:
        waiting, failed, gpus, slowest = (conn.execute(sql).fetchall() for sql in statements)
    assert [row[0] for row in waiting] == ["task-0"] and waiting[0][4] == 1
    assert failed == [("demo", "boom", 1)]
    ((node, listed, running, free, _age, jobs),) = gpus  # the CPU worker is left out
    assert (node, listed, running, free) == ("gpu@pod-a", ["0", "1"], 1, 1)
    assert [(job["job_id"], job["device"]) for job in jobs] == [("job-0", "1")]
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


def test_admins_see_suspended_tasks_as_suspended(db_url: str) -> None:
    _seed(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE mcp_tasks SET suspended_at = now(), suspensions = 1 WHERE task_id = 'task-0'")
    suspended = json.loads(_cli(db_url, "ls", "--status", "suspended", "--json").stdout)
    assert [(row["task_id"], row["status"]) for row in suspended] == [("task-0", "suspended")]
    # input_required lists every task waiting for input, resident or suspended.
    waiting = json.loads(_cli(db_url, "ls", "--status", "input_required", "--json").stdout)
    assert [row["task_id"] for row in waiting] == ["task-0"]
    shown = json.loads(_cli(db_url, "show", "task-0", "--json").stdout)
    assert shown["task"]["display_status"] == "suspended" and shown["task"]["suspensions"] == 1
    screen = _cli(db_url, "top", "--once")
    assert screen.returncode == 0, screen.stderr
    assert "suspended" in screen.stdout
    refused = _cli(db_url, "purge", "--status", "suspended", "--older-than", "0s", "--yes")
    assert refused.returncode != 0 and "never purged" in refused.stdout + refused.stderr


def test_tasks_show_lists_a_task_s_steps_and_checkpoints_without_their_data(db_url: str) -> None:
    _seed(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mcp_task_steps (task_id, seq, name, result, size)"
            " VALUES ('task-1', 1, 'fetch', '{\"secret\": 1}', 13)"
        )
        conn.execute(
            "INSERT INTO mcp_task_checkpoints (task_id, name, generation, storage, size, sha256, chunks)"
            " VALUES ('task-1', 'weights', 'g1', 'postgres', 2048, 'abcdef0123456789', 2)"
        )
    shown = json.loads(_cli(db_url, "show", "task-1", "--json").stdout)
    assert [(s["seq"], s["name"], s["size"]) for s in shown["steps"]] == [(1, "fetch", 13)]
    (saved,) = shown["checkpoints"]
    assert (saved["name"], saved["storage"], saved["size"]) == ("weights", "postgres", 2048)
    text = _cli(db_url, "show", "task-1")
    assert text.returncode == 0, text.stderr
    assert "step 1 'fetch' (13 bytes" in text.stdout and "secret" not in text.stdout
    assert "checkpoint 'weights' (2048 bytes in postgres, sha256 abcdef012345" in text.stdout
    assert json.loads(_cli(db_url, "show", "task-2", "--json").stdout)["steps"] == []


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


def test_tool_limits_commands_set_list_clear_and_every_change_shows_in_history(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env.update(
        MCP_TASKS_DATABASE_URL=db_url,
        MCP_TASKS_ADMIN_NAME="ops\x1b]0;pwned\x07 [bold]x[/bold]",
        COLUMNS="400",
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "limits", *args],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert cli("tool", "set", "train_model", "3", "--note", "bigger GPUs").returncode == 0
    paused = cli("tool", "set", "train_model", "0", "--key", "model=moons")
    assert paused.returncode == 0 and "paused" in paused.stdout
    assert cli("tool", "set", "train_model", "-1").returncode == 2  # refused by the option's bounds
    listed = json.loads(cli("tool", "ls", "--json").stdout)
    assert [(o["concurrency_group"], o["concurrency"]) for o in listed["overrides"]] == [
        ("*", 3),
        ("model=moons", 0),
    ]
    assert cli("tool", "clear", "train_model", "--key", "model=moons").returncode == 0
    assert cli("tool", "clear", "train_model", "--key", "model=moons").returncode == 1  # gone already
    assert cli("set", "token:alice", "--max-active", "5").returncode == 0

    shown = cli("history")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "[bold]x[/bold]" in shown.stdout  # markup shown as text, not applied
    history = json.loads(cli("history", "--json").stdout)
    assert [(h["target"], h["field"], h["old_value"], h["new_value"]) for h in reversed(history)] == [
        ("tool train_model", "concurrency", None, "3"),
        ("tool train_model", "note", None, "bigger GPUs"),
        ("tool train_model for model=moons", "concurrency", None, "0"),
        ("tool train_model for model=moons", "concurrency", "0", None),
        ("principal token:alice", "max_active_tasks", None, "5"),
    ]
    assert all(str(h["actor"]).startswith("ops\x1b]0;pwned\x07 [bold]x[/bold] (db role ") for h in history)


# ---- expected failures: one line, an exit code ----------------------------------------------


def _run(*args: str, cwd: Path = ROOT, **env_vars: str) -> subprocess.CompletedProcess[str]:
    # COLUMNS and LINES only when a test gives them: pytest-xdist's workers set 80 x 24.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MCP_TASKS_") and k not in ("COLUMNS", "LINES")
    }
    env["PYTHONPATH"] = str(ROOT)  # the checkout's package, whatever the current directory
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _one_error_line(ran: subprocess.CompletedProcess[str]) -> str:
    """The one ``error: …`` line (after the ``database: …`` line saying which one it tried)."""
    assert "Traceback" not in ran.stderr, ran.stderr
    lines = [line for line in ran.stderr.strip().splitlines() if not line.startswith("database: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), ran.stderr
    return lines[0]


def test_a_database_that_cannot_be_used_is_one_line_and_exit_3(db_url: str) -> None:
    dead = f"postgresql://admin:s3cret@127.0.0.1:{free_port()}/mcp_tasks"
    missing = dsn_for(f"mcpt_missing_{uuid.uuid4().hex[:8]}")
    empty_name = f"mcpt_empty_{uuid.uuid4().hex[:8]}"
    empty = create_database(empty_name)
    try:
        for command in (("tasks", "ls"), ("tasks", "show", "abcdef"), ("tasks", "top", "--once"),
                        ("tasks", "limits", "ls"), ("tasks", "cancel", "abcdef")):  # fmt: skip
            ran = _run(*command, MCP_TASKS_DATABASE_URL=dead)
            assert ran.returncode == 3, (command, ran.stderr)
            line = _one_error_line(ran)
            assert "s3cret" not in line and "admin:***@" in line
        ran = _run("tasks", "ls", MCP_TASKS_DATABASE_URL=missing)
        assert ran.returncode == 3 and "does not exist" in _one_error_line(ran)
        ran = _run("tasks", "ls", MCP_TASKS_DATABASE_URL=empty)
        assert ran.returncode == 3 and "run `mcp-celery-tasks migrate`" in _one_error_line(ran)
        ran = _run("migrate", MCP_TASKS_DATABASE_URL=missing)
        assert ran.returncode == 3 and "does not exist" in _one_error_line(ran)
        assert _run("migrate", "nosuchrevision", MCP_TASKS_DATABASE_URL=empty).returncode == 2
        assert _run("migrate", MCP_TASKS_DATABASE_URL=empty).returncode == 0
        assert _run("tasks", "ls", "--json", MCP_TASKS_DATABASE_URL=empty).stdout.strip() == "[]"
    finally:
        drop_database(empty_name)


@pytest.mark.parametrize(
    "command",
    [("tasks", "ls"), ("tasks", "limits", "ls"), ("migrate",), ("serve",), ("worker",), ("beat",)],
    ids=" ".join,
)
def test_a_configuration_mistake_names_the_variable_and_exits_2(
    db_url: str, command: tuple[str, ...]
) -> None:
    ran = _run(*command, MCP_TASKS_DATABASE_URL=db_url, MCP_TASKS_LEASE_SECONDS="abc")
    assert ran.returncode == 2, ran.stderr
    assert "MCP_TASKS_LEASE_SECONDS='abc': Input should be a valid number" in _one_error_line(ran)


def test_dev_refuses_a_configuration_mistake_with_one_line(tmp_path: Path) -> None:
    ran = _run("dev", "--data-dir", str(tmp_path / "data"), MCP_TASKS_LEASE_SECONDS="abc")
    assert ran.returncode == 2
    assert "MCP_TASKS_LEASE_SECONDS='abc'" in _one_error_line(ran)


def _seed_ids(db_url: str, ids: list[tuple[str, str, str]]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for task_id, job_id, status in ids:
            conn.execute(
                """INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status,
                     retention_ms, poll_interval_ms, queue, max_attempts, protocol_version,
                     client_capabilities)
                   VALUES (%s, %s, 'anon', 'demo', '{}', %s, 60000, 1000, 'q', 3, '2026-07-28', '{}')""",
                (task_id, job_id, status),
            )


def test_show_and_cancel_take_a_task_id_a_job_id_or_a_unique_prefix(db_url: str) -> None:
    _seed_ids(
        db_url,
        [
            ("abcdef1xxxxxxxxxxxxxxxxxxxxxxxxx", "11111111-aaaa-4000-8000-000000000001", "working"),
            ("abcdef2xxxxxxxxxxxxxxxxxxxxxxxxx", "22222222-bbbb-4000-8000-000000000002", "completed"),
            ("-dashfirstxxxxxxxxxxxxxxxxxxxxxx", "33333333-cccc-4000-8000-000000000003", "working"),
        ],
    )

    def show(*ref: str) -> subprocess.CompletedProcess[str]:
        return _run("tasks", "show", "--json", *ref, MCP_TASKS_DATABASE_URL=db_url)

    assert json.loads(show("abcdef1").stdout)["task"]["task_id"].startswith("abcdef1")
    assert json.loads(show("222222").stdout)["task"]["task_id"].startswith("abcdef2")
    ambiguous = show("abcdef")
    assert ambiguous.returncode == 2 and "abcdef1" in ambiguous.stderr and "abcdef2" in ambiguous.stderr
    short = show("abc")
    assert short.returncode == 1 and "6+ characters" in _one_error_line(short)
    assert show("zzzzzz").returncode == 1
    # An id starting with '-' is an option unless it comes after '--'.
    assert show("-dashfirstxxxxxxxxxxxxxxxxxxxxxx").returncode == 2
    assert json.loads(show("--", "-dashfirst").stdout)["task"]["job_id"].startswith("33333333")

    finished = _run("tasks", "cancel", "abcdef2", MCP_TASKS_DATABASE_URL=db_url)
    assert finished.returncode == 1 and "already completed" in _one_error_line(finished)


def test_cancel_with_the_broker_down_still_cancels_and_says_when_the_job_stops(db_url: str) -> None:
    _seed_ids(
        db_url, [("brokerdownxxxxxxxxxxxxxxxxxxxxxx", "44444444-dddd-4000-8000-000000000004", "working")]
    )
    started = time.monotonic()
    ran = _run(
        "tasks", "cancel", "444444",
        MCP_TASKS_DATABASE_URL=db_url, MCP_TASKS_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "cancelled task brokerdown" in ran.stdout
    assert "broker is unreachable" in ran.stderr and "next checkpoint" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert time.monotonic() - started < 30
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT status FROM mcp_tasks WHERE task_id LIKE 'brokerdown%'").fetchone()
    assert row == ("cancelled",)


def test_status_filters_are_checked(db_url: str) -> None:
    bogus = _run("tasks", "ls", "--status", "bogus", MCP_TASKS_DATABASE_URL=db_url)
    assert bogus.returncode == 2 and "input_required" in _one_error_line(bogus)
    assert _run("tasks", "purge", "--older-than", "1d", "--status", "bogus", "--yes",
                MCP_TASKS_DATABASE_URL=db_url).returncode == 2  # fmt: skip
    running = _run("tasks", "purge", "--older-than", "1d", "--status", "working", "--yes",
                   MCP_TASKS_DATABASE_URL=db_url)  # fmt: skip
    assert running.returncode == 2 and "never purged" in _one_error_line(running)
    assert _run("tasks", "ls", "--status", "stopping", MCP_TASKS_DATABASE_URL=db_url).returncode == 0


def test_admin_commands_find_the_running_dev_stack_and_forget_a_stale_one(
    db_url: str, tmp_path: Path
) -> None:
    _seed(db_url)
    checkout = tmp_path / "checkout"
    (checkout / "sub" / "dir").mkdir(parents=True)
    data_dir = checkout / ".mcp-tasks"
    data_dir.mkdir()
    # Stands in for a running `mcp-celery-tasks dev` (what the record check looks at: the
    # pid, its start time, and a command line of mcp_celery_tasks ... dev).
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "mcp_celery_tasks", "dev"])
    try:
        wait_until(lambda: devrecord.process_start(fake.pid) is not None, 10, what="the stand-in")
        record = devrecord.DevRecord(
            pid=fake.pid, started=devrecord.process_start(fake.pid) or "", data_dir=str(data_dir),
            database_url=db_url, broker_url="redis://127.0.0.1:1/0", api_url="http://127.0.0.1:1",
        )  # fmt: skip
        path = devrecord.write(data_dir, record)
        assert path.stat().st_mode & 0o777 == 0o600
        ran = _run("tasks", "ls", "--json", cwd=checkout / "sub" / "dir")
        assert ran.returncode == 0, ran.stderr
        assert {row["task_id"] for row in json.loads(ran.stdout)} == {"task-0", "task-1", "task-2"}
        assert ran.stderr.splitlines()[0] == f"database: the dev stack's ({data_dir}, pid {fake.pid})"
        # MCP_TASKS_DATABASE_URL wins over the record.
        ran = _run(
            "tasks",
            "ls",
            "--json",
            cwd=checkout,
            MCP_TASKS_DATABASE_URL=f"postgresql://x@127.0.0.1:{free_port()}/x",
        )
        assert ran.returncode == 3 and "dev stack" not in ran.stderr
    finally:
        fake.kill()
        fake.wait()
    assert devrecord.find(checkout / "sub") is None  # its process is gone: stale
    assert not path.exists()
    # Neither a variable nor a running stack: no guess at a Postgres on 5432, exit 2.
    for command in (("tasks", "ls", "--json"), ("tasks", "top", "--once"), ("tasks", "limits", "ls")):
        ran = _run(*command, cwd=checkout)
        assert ran.returncode == 2 and ran.stdout == "", (command, ran.stderr)
        line = _one_error_line(ran)
        assert "./scripts/dev" in line and "MCP_TASKS_DATABASE_URL" in line


def test_admin_commands_say_which_database_they_use_password_hidden(db_url: str, tmp_path: Path) -> None:
    _seed(db_url)
    parts = urlsplit(db_url)
    user, _, host = parts.netloc.rpartition("@")
    with_password = urlunsplit(parts._replace(netloc=f"{user or 'postgres'}:s3cret@{host}"))
    # The test server trusts local connections: the password is only there to be hidden.
    ran = _run("tasks", "ls", "--json", MCP_TASKS_DATABASE_URL=with_password)
    assert ran.returncode == 0, ran.stderr
    assert len(json.loads(ran.stdout)) == 3  # stdout is the JSON alone
    assert ran.stderr.splitlines() == [f"database: MCP_TASKS_DATABASE_URL={redact(with_password)}"]
    assert "s3cret" not in ran.stderr and ":***@" in ran.stderr
    secret = tmp_path / "dsn"
    secret.write_text(with_password + "\n")
    ran = _run("tasks", "ls", "--json", cwd=tmp_path, MCP_TASKS_DATABASE_URL_FILE=str(secret))
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.splitlines() == [
        f"database: MCP_TASKS_DATABASE_URL_FILE={secret} ({redact(with_password)})"
    ]


def test_a_record_whose_pid_now_belongs_to_another_program_is_stale(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        wait_until(lambda: devrecord.process_start(other.pid) is not None, 10, what="the process")
        started = devrecord.process_start(other.pid) or ""
        for pid, start in ((other.pid, started), (os.getpid(), devrecord.process_start(os.getpid()) or "")):
            # Not a dev command line; then a dev-looking pid with another start time.
            record = devrecord.DevRecord(
                pid, start, str(tmp_path), "postgresql://x", "redis://x", "http://127.0.0.1:1"
            )
            (tmp_path / ".mcp-tasks").mkdir(exist_ok=True)
            devrecord.write(tmp_path / ".mcp-tasks", record)
            assert devrecord.find(tmp_path) is None
            assert not (tmp_path / ".mcp-tasks" / "dev.json").exists()
    finally:
        other.kill()
        other.wait()


def test_a_record_someone_else_could_have_written_is_ignored(tmp_path: Path) -> None:
    data_dir = tmp_path / ".mcp-tasks"
    data_dir.mkdir()
    me = devrecord.DevRecord(
        os.getpid(),
        devrecord.process_start(os.getpid()) or "",
        str(data_dir),
        "postgresql://x",
        "redis://x",
        "",
    )
    for api_url, mode in (("http://127.0.0.1:8000", 0o666), ("http://evil.example:80", 0o600)):
        path = devrecord.write(data_dir, devrecord.DevRecord(**{**me.__dict__, "api_url": api_url}))
        path.chmod(mode)
        assert devrecord.read(path) is None
        assert path.exists()  # not ours to judge: left alone


def test_piped_top_and_limits_ls_are_never_cut_to_80_columns(db_url: str) -> None:
    principal = "token:" + "a-very-long-service-account-name-" * 3
    tool = "a_tool_with_a_name_long_enough_to_overflow_eighty_columns_alone"
    _seed(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, error,
                 retention_ms, poll_interval_ms, queue, max_attempts, protocol_version,
                 client_capabilities, started_at, finished_at)
               VALUES ('task-long', 'job-long', %s, %s, '{}', 'failed', '{"code": -32603, "message": "x"}',
                 60000, 1000, 'q', 3, '2026-07-28', '{}', now(), now())""",
            (principal, tool),
        )
    note = "set for the nightly batch of the reporting team, ask them before raising it"
    assert _run("tasks", "limits", "set", principal, "--max-active", "7", "--note", note,
                MCP_TASKS_DATABASE_URL=db_url).returncode == 0  # fmt: skip
    for command, whole in (
        (("tasks", "limits", "ls"), (principal, note)),
        (("tasks", "top", "--once"), (tool,)),
    ):
        ran = _run(*command, MCP_TASKS_DATABASE_URL=db_url)  # stdout is a pipe here
        assert ran.returncode == 0, ran.stderr
        assert all(text in ran.stdout for text in whole), ran.stdout
        assert max(len(line) for line in ran.stdout.splitlines()) > 80
        # COLUMNS, when set, is the width to fit.
        ran = _run(*command, MCP_TASKS_DATABASE_URL=db_url, COLUMNS="100")
        assert ran.returncode == 0, ran.stderr
        assert max(len(line) for line in ran.stdout.splitlines()) <= 100, ran.stdout
