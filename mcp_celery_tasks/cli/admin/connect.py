"""What every admin command shares: where the database is, and one line per expected failure.

Exit codes (``tasks --help`` and the README say the same):

- 0: done.
- 1: no such task, or nothing to do (already finished, no override to clear).
- 2: a usage or configuration mistake (a bad option value, an invalid ``MCP_TASKS_*`` variable,
  no database given: neither ``MCP_TASKS_DATABASE_URL`` nor a running dev stack).
- 3: the database cannot be used: nothing listening, no such database, or its tables not created
  yet (then it says to run ``mcp-celery-tasks migrate``).

Imports stay light at module level: the CLI registers the admin commands at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit, urlunsplit

import typer

from mcp_celery_tasks.cli.dev import record as devrecord
from mcp_celery_tasks.client.terminal import plain

if TYPE_CHECKING:
    from mcp_celery_tasks.settings import Settings
    from mcp_celery_tasks.store import WorkerStore

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_DATABASE",
    "EXIT_NOT_FOUND",
    "EXIT_USAGE",
    "admin_settings",
    "admin_store",
    "config_error_line",
    "driver_reason",
    "fail",
    "friendly_errors",
    "redact",
]

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3

EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 no such task or nothing to do; 2 a usage or configuration mistake; "
    "3 the database cannot be used (down, missing, or not migrated: run `mcp-celery-tasks migrate`)."
)

_UNDEFINED_TABLE = "42P01"

DATABASE_VARIABLES = ("MCP_TASKS_DATABASE_URL", "MCP_TASKS_DATABASE_URL_FILE")
"""What says where the database is; without either, the running dev stack's, or nothing."""


def fail(message: str, code: int) -> NoReturn:
    """One ``error: …`` line on stderr, then exit with ``code``."""
    typer.echo(f"error: {plain(message, newlines=True)}", err=True)  # may quote a database value
    raise typer.Exit(code)


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if not parts.password:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def config_error_line(exc: ValueError) -> str:
    """``MCP_TASKS_LEASE_SECONDS='abc': Input should be a valid number`` (one clause per error of
    a pydantic ValidationError; other errors, such as an unreadable ``*_FILE``, as they say)."""
    if not hasattr(exc, "errors"):
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    clauses = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error.get("loc") else ""
        name = f"MCP_TASKS_{field.upper()}" if field else "settings"
        given = error.get("input")
        shown = f"={given!r}" if isinstance(given, str | int | float | bool) else ""
        if any(word in field for word in ("token", "key", "secret", "password")):
            shown = ""  # never echo a secret
        elif "url" in field and isinstance(given, str):
            shown = f"={redact(given)!r}"
        clauses.append(f"{name}{shown}: {error['msg']}")
    return "; ".join(clauses) or str(exc)


def _settings(**overrides: object) -> Settings:
    from mcp_celery_tasks.settings import Settings

    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValueError as exc:  # pydantic's ValidationError, or a *_FILE that cannot be read
        fail(f"configuration: {config_error_line(exc)}", EXIT_USAGE)


def admin_settings() -> Settings:
    """Settings from ``MCP_TASKS_*``; without ``MCP_TASKS_DATABASE_URL`` (or its ``_FILE``), those
    of the running dev stack of this checkout (``.mcp-tasks/dev.json`` here or in a parent folder).

    Which database it is goes to stderr in one line (``--json`` keeps stdout clean); with neither,
    exit 2 rather than guess: the built-in default (a Postgres on 127.0.0.1:5432) is for the
    servers, and an admin command run against it by accident shows some other machine's tasks.
    """
    overrides: dict[str, object] = {}
    explicit = next((name for name in DATABASE_VARIABLES if name in os.environ), None)
    record = None
    if explicit is None:
        record = devrecord.find()
        if record is None:
            fail(
                "no database given: start the dev stack (`./scripts/dev`) and run this in its "
                "checkout, or set MCP_TASKS_DATABASE_URL",
                EXIT_USAGE,
            )
        overrides["database_url"] = record.database_url
        if "MCP_TASKS_BROKER_URL" not in os.environ:
            overrides["broker_url"] = record.broker_url
    settings = _settings(**overrides)
    typer.echo(f"database: {_where(settings, record)}", err=True)
    return settings


def _where(settings: Settings, record: devrecord.DevRecord | None) -> str:
    if record is not None:
        return f"the dev stack's ({record.data_dir}, pid {record.pid})"
    url = redact(settings.database_url)
    path = os.environ.get("MCP_TASKS_DATABASE_URL_FILE")
    return f"MCP_TASKS_DATABASE_URL_FILE={path} ({url})" if path else f"MCP_TASKS_DATABASE_URL={url}"


def admin_store(settings: Settings) -> WorkerStore:
    from mcp_celery_tasks.store import WorkerStore

    return WorkerStore(settings, application_name="mcp-celery-tasks-admin")


def driver_reason(exc: BaseException) -> str:
    """The useful part of a driver's connection error: after the last ``failed:``, first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.rsplit("failed: ", 1)[-1]
    return text.replace("FATAL:  ", "").strip()


@contextmanager
def friendly_errors(settings: Settings) -> Iterator[None]:
    """Turn the database's expected failures into one line and exit code 3."""
    from mcp_celery_tasks.errors import InfrastructureError

    where = redact(settings.database_url)
    try:
        yield
    except InfrastructureError as exc:
        cause = exc.__cause__ or exc
        if getattr(cause, "sqlstate", None) == _UNDEFINED_TABLE:
            fail(f"{where} has no task tables yet: run `mcp-celery-tasks migrate`", EXIT_DATABASE)
        fail(f"cannot use the task database {where}: {driver_reason(cause)}", EXIT_DATABASE)
    except Exception as exc:
        # The store wraps connection errors; a missing table arrives as the driver's own
        # error (a programming error for the driver), recognised by its SQLSTATE alone.
        if getattr(exc, "sqlstate", None) == _UNDEFINED_TABLE:
            fail(f"{where} has no task tables yet: run `mcp-celery-tasks migrate`", EXIT_DATABASE)
        raise
