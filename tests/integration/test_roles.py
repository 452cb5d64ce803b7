"""Least privilege: each group role ``migrate --roles`` grants runs what its process runs, and
nothing an attacker holding that process's DSN would want (limits, other tables, deleting work)."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from mcp_celery_tasks.errors import ArtifactRefused
from mcp_celery_tasks.maintenance.gc import collect_garbage
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore, roles, schema
from mcp_celery_tasks.worker.artifacts import JobArtifacts
from tests import console_http, support

Login = Callable[[str], str]
"""Group role -> the DSN of a fresh login role that is a member of it."""


def _denied(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def _allowed(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture
def login(db_url: str) -> Iterator[Login]:
    roles.grant_roles(Settings(database_url=db_url))
    roles.grant_roles(Settings(database_url=db_url))  # a second run converges, never fails
    made: list[str] = []

    def make(group: str) -> str:
        name = f"mcpt_{group.removeprefix('mcp_tasks_')}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(support.ADMIN_DSN, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                    psycopg.sql.Identifier(name), psycopg.sql.Identifier(group)
                )
            )
        made.append(name)
        url = urlsplit(db_url)
        return urlunsplit(url._replace(netloc=f"{name}@{url.hostname}:{url.port}"))

    yield make
    with psycopg.connect(support.ADMIN_DSN, autocommit=True) as conn:
        for name in made:
            conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(name)))


def test_every_table_of_the_schema_is_in_the_map() -> None:
    tables = set(schema.metadata.tables) | set(schema.VIEWS) | {"alembic_version"}
    assert set(roles.GRANTS["mcp_tasks_admin"]) == tables
    for grants in roles.GRANTS.values():
        assert set(grants) <= tables
    assert "mcp_principal_limits" in roles.GRANTS["mcp_tasks_worker"]  # read, for fair dispatch


def test_no_role_but_the_admin_writes_the_principal_limits(login: Login) -> None:
    limits = "INSERT INTO mcp_principal_limits (principal, max_active_tasks) VALUES ('token:x', 1)"
    for group in ("mcp_tasks_api", "mcp_tasks_worker", "mcp_tasks_maintenance"):
        dsn = login(group)
        _denied(dsn, limits)
        _denied(dsn, "DELETE FROM mcp_principal_limits")
        _allowed(dsn, "SELECT * FROM mcp_principal_limits")
    admin = WorkerStore(Settings(database_url=login("mcp_tasks_admin")))
    admin.set_principal_limits("token:x", max_active_tasks=3)
    assert [row["principal"] for row in admin.principal_limits()] == ["token:x"]
    admin.close()


async def test_the_consoles_audit_is_appended_by_the_api_but_limits_stay_the_admins(login: Login) -> None:
    from mcp_celery_tasks.store.console_calls import NotPermitted

    api = ApiStore(Settings(database_url=login("mcp_tasks_api")))
    await api.open()
    try:
        await api.record_console_action("admin:ops", "cancel", "job-1", 1)
        with pytest.raises(NotPermitted, match="tasks limits set"):
            await api.console_set_limits("token:x", "admin:ops", {"max_active_tasks": 1})
        with pytest.raises(NotPermitted, match="tasks limits tool set"):
            await api.console_set_tool_limit("train", "*", 0, None, "admin:ops")
        assert await api.console_tool_limits() == ([], [])  # read, never written
        assert (await api.console_overview())["workers"] == []  # the registry is the API's to read
        actions, changes = await api.console_audit()
        assert [a["target"] for a in actions] == ["job-1"] and changes == []
    finally:
        await api.close()
    _denied(login("mcp_tasks_api"), "DELETE FROM mcp_console_actions")


def test_a_worker_can_neither_create_nor_delete_tasks_nor_touch_sessions(login: Login) -> None:
    worker = login("mcp_tasks_worker")
    _denied(worker, "DELETE FROM mcp_tasks")
    _denied(worker, "DELETE FROM mcp_task_inputs")
    _denied(worker, "SELECT * FROM mcp_sessions")
    _denied(worker, "INSERT INTO mcp_tasks (task_id) VALUES ('t')")  # privileges are checked first
    _allowed(worker, "SELECT count(*) FROM mcp_tasks")
    _denied(login("mcp_tasks_api"), "DELETE FROM mcp_tasks")  # a session's tasks go by the foreign key


def test_migrate_roles_as_a_role_that_may_not_grant_fails_in_one_line(login: Login, db_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mcp_celery_tasks.cli",
            "migrate",
            "--roles",
            "--database-url",
            login("mcp_tasks_worker"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot grant the roles:") and "owner" in line, line


def test_a_stack_runs_a_job_that_reports_and_asks_with_each_process_on_its_own_role(
    login: Login, db_url: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    env = support.stack_env(db_url, support.REDIS_URL, suffix)
    api_env = {**env, "MCP_TASKS_DATABASE_URL": login("mcp_tasks_api")}
    worker_env = {**env, "MCP_TASKS_DATABASE_URL": login("mcp_tasks_worker")}
    worker = support.spawn(
        f"roles-worker-{suffix}",
        [
            "worker",
            "-P",
            "prefork",
            "-c",
            "1",
            "-Q",
            env["MCP_TASKS_DEFAULT_QUEUE"],
            "-n",
            f"roles-{suffix}@localhost",
        ],
        worker_env,
    )
    api: support.Proc | None = None
    try:
        api, url = support.start_api(f"roles-api-{suffix}", api_env)
        client = support.Client(url)
        capabilities: dict[str, Any] = {"elicitation": {}}
        reply = client.request(
            "tools/call",
            {
                "name": "t_two_questions",
                "arguments": {"marker": "roles"},
                "_meta": support.meta(True, **capabilities),
            },
        )
        task_id = str(reply.result["taskId"])
        for answer in (
            {"action": "accept", "content": {"value": "v"}},
            {"action": "accept", "content": {"confirm": True}},
        ):
            task = client.wait_status(task_id, ("input_required",), timeout=60)
            (key,) = task["inputRequests"]
            assert client.update(task_id, {key: answer}).status == 200
        done = client.wait_status(task_id, timeout=60)
        assert done["status"] == "completed" and done["result"]["isError"] is False, done
        assert done["result"]["structuredContent"]["first"] == {"action": "accept", "content": {"value": "v"}}
        client.close()
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)

    # The maintenance role collects what expired; the worker role may not.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE mcp_tasks SET expires_at = %s WHERE task_id = %s",
            (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1), task_id),
        )
    with pytest.raises(Exception, match="permission denied"):
        collect_garbage(WorkerStore(Settings(database_url=login("mcp_tasks_worker"))))
    maintenance = WorkerStore(Settings(database_url=login("mcp_tasks_maintenance")))
    assert collect_garbage(maintenance) == 1
    maintenance.close()
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mcp_tasks").fetchone() == (0,)


def test_a_worker_records_steps_and_replaces_checkpoints_and_a_task_deleted_takes_them_along(
    login: Login, db_url: str
) -> None:
    worker = login("mcp_tasks_worker")
    _allowed(worker, "SELECT count(*) FROM mcp_task_steps")
    _denied(worker, "DELETE FROM mcp_task_steps")  # a recorded step is never rewritten
    _denied(worker, "UPDATE mcp_task_steps SET result = '1'")
    _allowed(worker, "DELETE FROM mcp_task_checkpoint_chunks WHERE false")  # a save replaces chunks
    _allowed(worker, "DELETE FROM mcp_task_checkpoints WHERE false")
    _denied(login("mcp_tasks_api"), "SELECT count(*) FROM mcp_task_steps")
    _denied(login("mcp_tasks_api"), "SELECT count(*) FROM mcp_task_checkpoint_chunks")
    task_id = f"t-{uuid.uuid4().hex}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,"
            " poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities)"
            " VALUES (%s, %s, 'anon', 'x', '{}', 'completed', 1, 1, 'q', 1, '2026-07-28', '{}')",
            (task_id, f"j-{task_id}"),
        )
        conn.execute(
            "INSERT INTO mcp_task_steps (task_id, seq, name, result, size) VALUES (%s, 1, 'a', '1', 1)",
            (task_id,),
        )
        conn.execute(
            "INSERT INTO mcp_task_checkpoint_chunks (task_id, name, generation, seq, data)"
            " VALUES (%s, 'c', 'g', 0, 'x')",
            (task_id,),
        )
    _allowed(login("mcp_tasks_maintenance"), f"DELETE FROM mcp_tasks WHERE task_id = '{task_id}'")
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in ("mcp_task_steps", "mcp_task_checkpoint_chunks"):
            found = conn.execute(f"SELECT count(*) FROM {table} WHERE task_id = %s", (task_id,)).fetchone()
            assert found == (0,), table


def test_the_autoscaler_reads_the_demand_view_and_nothing_else(login: Login) -> None:
    dsn = login("mcp_tasks_autoscaler")
    _allowed(dsn, "SELECT COALESCE(max(demand_slots), 0) FROM mcp_queue_demand WHERE queue = 'gpu'")
    for table in (
        "mcp_tasks",
        "mcp_workers",
        "mcp_task_inputs",
        "mcp_tasks_overview",
        "mcp_workers_overview",
    ):
        _denied(dsn, f"SELECT 1 FROM {table}")


def test_the_admin_reads_the_workers_overview_and_the_processes_do_not(login: Login) -> None:
    _allowed(login("mcp_tasks_admin"), "SELECT node, devices, jobs FROM mcp_workers_overview")
    for group in ("mcp_tasks_api", "mcp_tasks_worker", "mcp_tasks_maintenance"):
        _denied(login(group), "SELECT 1 FROM mcp_workers_overview")


def test_a_worker_registers_beats_and_deregisters_its_own_row(login: Login) -> None:
    from mcp_celery_tasks.store.fleet import WorkerInfo

    store = WorkerStore(Settings(database_url=login("mcp_tasks_worker")))
    info = WorkerInfo(
        node=f"w-{uuid.uuid4().hex[:6]}@h", hostname="h", pid=1, pids=[2, 3], queues=["q"], slots=2,
        version="1", pool="prefork", instance="i", started_at=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    assert store.heartbeat(info, 30) is None
    assert store.heartbeat(info, 30) is None
    assert [row["node"] for row in store.workers()] == [info.node]
    assert store.deregister(info)
    assert store.workers() == []
    store.close()


async def test_artifacts_are_written_by_the_worker_read_by_the_api_and_swept_by_maintenance(
    login: Login, db_url: str
) -> None:
    task_id = f"t-{uuid.uuid4().hex}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,"
            " poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, worker)"
            " VALUES (%s, %s, 'anon', 'x', '{}', 'working', 1, 1, 'q', 1, '2026-07-28', '{}', 'me')",
            (task_id, f"j-{task_id}"),
        )
    worker_settings = Settings(database_url=login("mcp_tasks_worker"), max_artifact_bytes=2 * 1024 * 1024)
    worker = WorkerStore(worker_settings)
    try:
        link = JobArtifacts(worker, task_id, "me", worker_settings).publish("a.txt", "x" * 10)
        with pytest.raises(ArtifactRefused):  # its run removes a refused upload, chunks and all
            JobArtifacts(worker, task_id, "me", worker_settings).publish("big.bin", b"y" * (3 * 1024 * 1024))
    finally:
        worker.close()
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mcp_task_artifacts").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM mcp_task_artifact_chunks").fetchone() == (1,)
    api = ApiStore(Settings(database_url=login("mcp_tasks_api")))
    await api.open()
    try:
        found = await api.artifact(link["uri"].split("/")[-2], "anon")
        assert found is not None and await api.artifact_bytes(found) == b"x" * 10
    finally:
        await api.close()
    _denied(login("mcp_tasks_api"), "DELETE FROM mcp_task_artifacts WHERE false")
    maintenance = WorkerStore(Settings(database_url=login("mcp_tasks_maintenance")))
    try:
        assert maintenance.delete_orphan_artifacts(10) == 0
    finally:
        maintenance.close()
    _allowed(login("mcp_tasks_maintenance"), f"DELETE FROM mcp_tasks WHERE task_id = '{task_id}'")
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in ("mcp_task_artifacts", "mcp_task_artifact_chunks"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table


def test_the_console_edits_limits_through_its_admin_login_and_without_one_is_refused(
    login: Login, db_url: str
) -> None:
    """The ``console`` command on the API's role: limit forms refused (403, naming the CLI and
    the setting), nothing written; with ``console_database_url`` an admin login, the same forms
    change the limits and their audit rows (actor ``admin:ops``) while the pages still read
    through the API's role."""
    env = {
        **support.stack_env(db_url, support.REDIS_URL, uuid.uuid4().hex[:8]),
        "MCP_TASKS_DATABASE_URL": login("mcp_tasks_api"),
        "MCP_TASKS_CONSOLE_ADMIN_TOKENS": console_http.ADMINS,
    }
    form = {"principal": "token:alice", "max_active_tasks": "7", "note": "from the console"}
    tool = {"op": "set", "tool": "train_model", "key": "*", "concurrency": "2"}

    proc, base, _ = console_http.start_console("roles-console-api", env)
    try:
        with console_http.sign_in(base) as http:
            for path, data in (("/limits", form), ("/limits/tool", tool)):
                refused = http.post(path, data={**data, "csrf": console_http.csrf_of(http, "/limits")})
                assert refused.status_code == 403, refused.text
                assert "mcp-celery-tasks tasks limits" in refused.text
                assert "MCP_TASKS_CONSOLE_DATABASE_URL" in refused.text
    finally:
        proc.stop()
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM mcp_principal_limits").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM mcp_tool_limits").fetchone() == (0,)

    admin_dsn = login("mcp_tasks_admin")
    admin_env = {**env, "MCP_TASKS_CONSOLE_DATABASE_URL": admin_dsn}
    proc, base, _ = console_http.start_console("roles-console-admin", admin_env)
    try:
        with console_http.sign_in(base) as http:
            for path, data in (("/limits", form), ("/limits/tool", tool)):
                changed = http.post(path, data={**data, "csrf": console_http.csrf_of(http, "/limits")})
                assert changed.status_code == 303 and changed.headers["location"] == "/limits", changed.text
            page = http.get("/limits")
            assert page.status_code == 200 and "token:alice" in page.text and "from the console" in page.text
            assert "set limits" in http.get("/audit").text
    finally:
        proc.stop()
    with psycopg.connect(db_url) as conn:
        assert conn.execute(
            "SELECT max_active_tasks, note FROM mcp_principal_limits WHERE principal = 'token:alice'"
        ).fetchone() == (7, "from the console")
        assert conn.execute(
            "SELECT concurrency FROM mcp_tool_limits WHERE tool_name = 'train_model'"
        ).fetchone() == (2,)
        actors = conn.execute("SELECT DISTINCT actor FROM mcp_limit_changes").fetchall()
        assert actors == [(f"admin:ops (db role {urlsplit(admin_dsn).username})",)]
        actions = conn.execute("SELECT action FROM mcp_console_actions ORDER BY id").fetchall()
        assert actions == [("set limits",), ("set tool limit",)]
