"""The ``console`` command's app, without a server: what it refuses to start with, and when it
warns that it listens beyond this machine."""

from __future__ import annotations

import hashlib

import pytest

from mcp_celery_tasks.api.consoleserver import NoAdmins, create_console_server, exposure_warning
from mcp_celery_tasks.settings import Settings, api_only_variables

ADMINS = {"ops": hashlib.sha256(b"token").hexdigest()}


def test_a_console_nobody_can_sign_in_to_is_refused() -> None:
    with pytest.raises(NoAdmins, match="nobody could sign in"):
        create_console_server(Settings())
    with pytest.raises(ValueError, match="SHA-256 hex digest"):
        create_console_server(Settings(console_admin_tokens={"ops": "the-token-itself"}))
    with pytest.raises(ValueError, match="console path"):
        create_console_server(Settings(console_admin_tokens=ADMINS), path="/a/../b")


def test_the_app_serves_the_console_at_its_path_and_nothing_else() -> None:
    app = create_console_server(Settings(console_admin_tokens=ADMINS), path="/ops")
    paths = {getattr(route, "path", "") for route in app.routes}
    assert {"/ops", "/ops/", "/ops/login", "/ops/tasks/{job_id}/cancel"} <= paths
    assert all(path.startswith("/ops") for path in paths)


def test_listening_beyond_loopback_warns_to_put_tls_in_front() -> None:
    plain = Settings()
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert exposure_warning(loopback, plain) is None
    for exposed in ("0.0.0.0", "::", "10.0.0.5", "console.internal"):
        warning = exposure_warning(exposed, plain)
        assert warning is not None and "TLS" in warning and "MCP_TASKS_RESOURCE_URL" in warning
    behind_tls = exposure_warning("0.0.0.0", Settings(resource_url="https://ops.example/mcp"))
    assert behind_tls is not None and "TLS" in behind_tls and "RESOURCE_URL" not in behind_tls


def test_the_consoles_admin_dsn_is_a_secret_workers_never_get() -> None:
    environ = {"MCP_TASKS_CONSOLE_DATABASE_URL_FILE": "/run/secrets/x", "MCP_TASKS_DATABASE_URL": "y"}
    assert api_only_variables(environ) == ["MCP_TASKS_CONSOLE_DATABASE_URL_FILE"]
    spelled = Settings(console_database_url="postgresql+psycopg://admin:pw@db/tasks")
    assert spelled.console_database_url == "postgresql://admin:pw@db/tasks"  # libpq's spelling
