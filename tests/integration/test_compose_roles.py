"""docker-compose.yml's least privilege, on the machine's real Postgres: the postgres image's
init script (deploy/postgres/init-roles.sh) makes a non-superuser owner and one login per kind of
process from the DSN secrets, ``migrate --roles`` runs as that owner, and each login then has
its group's rights and no more."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests import support

SCRIPT = support.ROOT / "deploy" / "postgres" / "init-roles.sh"
KINDS = ("owner", "api", "worker", "maintenance")


def _as(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def compose_db(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A database made like the compose file's, its four DSN secrets in ``tmp_path``."""
    if not shutil.which("psql"):
        pytest.skip("the init script runs psql")
    if not urlsplit(support.ADMIN_DSN).hostname:
        pytest.skip("the compose roles log in over TCP; this Postgres is on a socket")
    tag = uuid.uuid4().hex[:8]
    name = f"mcpt_compose_{tag}"
    admin = support.create_database(name)
    dsns = {kind: _as(admin, f"mcpt_{kind}_{tag}", secrets.token_hex(16)) for kind in KINDS}
    for kind, dsn in dsns.items():  # the compose form: host "postgres"; the script reads the login only
        parts = urlsplit(dsn)
        (tmp_path / f"database_url_{kind}").write_text(
            urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@postgres:5432"))
        )
    try:
        yield name, dsns, tmp_path
    finally:
        support.drop_database(name)
        for kind in KINDS:
            support.admin_execute(f'DROP ROLE IF EXISTS "mcpt_{kind}_{tag}"')


def _init(name: str, secrets_dir: Path) -> subprocess.CompletedProcess[str]:
    admin = urlsplit(support.dsn_for(name))
    env = {
        **os.environ, "MCP_DB_SECRETS": str(secrets_dir), "POSTGRES_DB": name,
        "PGHOST": admin.hostname or "127.0.0.1", "PGPORT": str(admin.port or 5432),
        "PGUSER": admin.username or "postgres", "PGPASSWORD": admin.password or "",
    }  # fmt: skip
    return subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def _can(dsn: str, statement: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            return False
    return True


def test_each_process_logs_in_as_its_own_role_and_none_is_a_superuser(
    compose_db: tuple[str, dict[str, str], Path],
) -> None:
    name, dsns, secrets_dir = compose_db
    done = _init(name, secrets_dir)
    assert done.returncode == 0, done.stderr
    migrate = subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "migrate", "--roles"],
        env={**os.environ, "MCP_TASKS_DATABASE_URL": dsns["owner"]}, cwd=support.ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr

    with psycopg.connect(support.ADMIN_DSN) as conn:
        flags: dict[str, bool] = dict(
            conn.execute(
                "SELECT rolname, rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles"
                " WHERE rolname = ANY(%s)",
                ([urlsplit(dsn).username for dsn in dsns.values()],),
            ).fetchall()
        )
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", (name,))
        assert owner.fetchone() == (urlsplit(dsns["owner"]).username,)
    assert len(flags) == 4 and not any(flags.values()), flags

    task = (
        "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms, "
        "poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities) VALUES "
        "('t1', 'j1', 'token:x', 'noop', '{}', 'working', 60000, 500, 'mcp.default', 3, '2026-07-28', '{}')"
    )
    assert _can(dsns["api"], task)  # the API creates tasks
    assert not _can(dsns["worker"], task.replace("'t1'", "'t2'").replace("'j1'", "'j2'"))
    assert _can(dsns["worker"], "UPDATE mcp_tasks SET status_message = 'x' WHERE task_id = 't1'")
    assert not _can(dsns["api"], "DELETE FROM mcp_tasks")
    assert not _can(dsns["worker"], "DELETE FROM mcp_tasks")
    assert not _can(dsns["maintenance"], "INSERT INTO mcp_principal_limits (principal) VALUES ('token:x')")
    assert _can(dsns["maintenance"], "DELETE FROM mcp_tasks WHERE task_id = 't1'")
    for kind in ("api", "worker", "maintenance"):
        assert not _can(dsns[kind], "CREATE TABLE mcp_intruder (x int)"), kind


def test_a_secret_without_a_password_stops_the_script_before_any_role_is_made(
    compose_db: tuple[str, dict[str, str], Path],
) -> None:
    name, dsns, secrets_dir = compose_db
    (secrets_dir / "database_url_worker").write_text("postgresql://someone@postgres:5432/mcp_tasks")
    done = _init(name, secrets_dir)
    assert done.returncode != 0
    assert "database_url_worker names no user and password" in done.stderr
    with psycopg.connect(support.ADMIN_DSN) as conn:
        made = conn.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)",
            ([urlsplit(dsn).username for dsn in dsns.values()],),
        ).fetchone()
    assert made == (0,)
