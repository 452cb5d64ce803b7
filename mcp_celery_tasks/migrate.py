"""Run Alembic migrations programmatically (used by the CLI and the tests)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.exc import OperationalError

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings

__all__ = ["UnknownRevision", "alembic_config", "check", "downgrade", "head_revision", "upgrade"]


class UnknownRevision(ValueError):
    """The target revision is not one this code ships."""


def _scripts() -> str:
    # The checkout's top-level ``migrations/`` when running from one (next to this package), else
    # the copy the wheel installs as ``mcp_celery_tasks._migrations``.
    checkout = Path(__file__).resolve().parent.parent / "migrations"
    if (checkout / "env.py").is_file():
        return str(checkout)
    return str(files("mcp_celery_tasks._migrations"))


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", _scripts())
    config.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    """Raises InfrastructureError (the driver's error on ``__cause__``) if the database cannot
    be reached, UnknownRevision for a revision this code does not have."""
    try:
        command.upgrade(alembic_config(settings), revision)
    except OperationalError as exc:
        raise InfrastructureError("the task database is unavailable") from exc.orig
    except CommandError as exc:
        raise UnknownRevision(str(exc)) from None


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)


def head_revision() -> str | None:
    """The newest migration shipped with this code."""
    script = ScriptDirectory(_scripts())
    return script.get_current_head()


def check(settings: Settings) -> None:
    """Raise if the database schema differs from ``db.metadata``."""
    command.check(alembic_config(settings))
