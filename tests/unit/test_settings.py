"""Settings from the environment, and secrets from files (``MCP_TASKS_<NAME>_FILE``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_celery_tasks.settings import Settings


def test_nothing_is_served_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCP_TASKS_TOOL_MODULES", raising=False)
    assert Settings().tool_modules == []


def test_secrets_come_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keys").write_text("first-key\nsecond-key\n")
    (tmp_path / "tokens").write_text('{"alice": "s3cret"}\n')
    (tmp_path / "dsn").write_text("postgresql://mcp:pw@db:5432/mcp_tasks\n")
    monkeypatch.setenv("MCP_TASKS_SECRET_KEYS_FILE", str(tmp_path / "keys"))
    monkeypatch.setenv("MCP_TASKS_AUTH_TOKENS_FILE", str(tmp_path / "tokens"))
    monkeypatch.setenv("MCP_TASKS_DATABASE_URL_FILE", str(tmp_path / "dsn"))
    settings = Settings()
    assert settings.secret_keys == ["first-key", "second-key"]
    assert settings.auth_tokens == {"alice": "s3cret"}
    assert settings.database_url == "postgresql://mcp:pw@db:5432/mcp_tasks"


def test_a_json_list_file_works_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keys").write_text('["a", "b"]')
    monkeypatch.setenv("MCP_TASKS_SECRET_KEYS_FILE", str(tmp_path / "keys"))
    assert Settings().secret_keys == ["a", "b"]


def test_a_value_and_its_file_at_once_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dsn").write_text("postgresql://x@y/z")
    monkeypatch.setenv("MCP_TASKS_DATABASE_URL_FILE", str(tmp_path / "dsn"))
    monkeypatch.setenv("MCP_TASKS_DATABASE_URL", "postgresql://a@b/c")
    with pytest.raises(ValueError, match="MCP_TASKS_DATABASE_URL_FILE"):
        Settings()


def test_a_missing_secret_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_TASKS_AUTH_TOKENS_FILE", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="MCP_TASKS_AUTH_TOKENS_FILE"):
        Settings()


def test_a_mapping_file_must_be_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tokens").write_text("alice=s3cret")
    monkeypatch.setenv("MCP_TASKS_AUTH_TOKENS_FILE", str(tmp_path / "tokens"))
    with pytest.raises(ValueError, match="JSON object"):
        Settings()


def test_dev_serves_the_examples_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_celery_tasks.cli.dev.stack import _tool_modules

    monkeypatch.delenv("MCP_TASKS_TOOL_MODULES", raising=False)
    assert _tool_modules(None) == ["workers"]
    assert _tool_modules("a.tools, b.tools") == ["a.tools", "b.tools"]
    monkeypatch.setenv("MCP_TASKS_TOOL_MODULES", '["team.tools"]')
    assert _tool_modules(None) == ["team.tools"]
