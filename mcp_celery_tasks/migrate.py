"""Run Alembic migrations programmatically (used by the CLI and the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from mcp_celery_tasks.settings import Settings

__all__ = ["alembic_config", "check", "downgrade", "head_revision", "upgrade"]

_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(settings: Settings) -> Config:
    config = Config(str(_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(_ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)


def head_revision() -> str | None:
    """The newest migration shipped with this code."""
    script = ScriptDirectory(str(_ROOT / "migrations"))
    return script.get_current_head()


def check(settings: Settings) -> None:
    """Raise if the database schema differs from ``db.metadata``."""
    command.check(alembic_config(settings))
