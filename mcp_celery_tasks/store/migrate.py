"""Run Alembic migrations programmatically (used by the CLI and the tests).

Alembic and SQLAlchemy load only when a migration command runs: the API imports this module for
``head_revision`` alone, and the two cost an API process about 24 MiB of memory.
"""

from __future__ import annotations

import ast
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings

__all__ = ["UnknownRevision", "alembic_config", "check", "downgrade", "head_revision", "upgrade"]

if TYPE_CHECKING:
    from alembic.config import Config


class UnknownRevision(ValueError):
    """The target revision is not one this code ships."""


def _scripts() -> str:
    # The checkout's top-level ``migrations/`` when running from one (next to this package), else
    # the copy the wheel installs as ``mcp_celery_tasks._migrations``.
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return str(checkout)
    return str(files("mcp_celery_tasks._migrations"))


def alembic_config(settings: Settings) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", _scripts())
    config.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    """Raises InfrastructureError (the driver's error on ``__cause__``) if the database cannot
    be reached, UnknownRevision for a revision this code does not have."""
    from alembic import command
    from alembic.util import CommandError
    from sqlalchemy.exc import OperationalError

    try:
        command.upgrade(alembic_config(settings), revision)
    except OperationalError as exc:
        raise InfrastructureError("the task database is unavailable") from exc.orig
    except CommandError as exc:
        raise UnknownRevision(str(exc)) from None


def downgrade(settings: Settings, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(settings), revision)


def head_revision() -> str | None:
    """The newest migration shipped with this code: the one revision no other revision follows.

    Read from the migration files' ``revision``/``down_revision`` literals, without Alembic (a
    unit test pins it to Alembic's own answer).
    """
    revisions: set[str] = set()
    followed: set[str] = set()
    for path in Path(_scripts(), "versions").glob("*.py"):
        values = _literals(path)
        revision, down = values.get("revision"), values.get("down_revision")
        if isinstance(revision, str):
            revisions.add(revision)
            if isinstance(down, str):
                followed.add(down)
            elif isinstance(down, tuple | list):
                followed.update(str(d) for d in down)
    heads = revisions - followed
    if len(heads) > 1:
        raise ValueError(f"the migrations have several heads: {sorted(heads)}")
    return next(iter(heads), None)


def _literals(path: Path) -> dict[str, object]:
    """Module-level ``name = <literal>`` assignments of one migration file."""
    out: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                out[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return out


def check(settings: Settings) -> None:
    """Raise if the database schema differs from ``db.metadata``."""
    from alembic import command

    command.check(alembic_config(settings))
