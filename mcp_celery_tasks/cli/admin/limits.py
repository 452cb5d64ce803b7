"""``mcp-celery-tasks tasks limits ls|set|clear``: per-principal quota overrides.

API processes re-read the overrides every few seconds; a limit left unset keeps the default
from ``MCP_TASKS_*`` (0 turns one off for that principal). Tool concurrency overrides and the
audit of every change are ``tasks limits tool …`` and ``tasks limits history`` (``tool_limits``).
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from mcp_celery_tasks.cli.admin.connect import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    admin_settings,
    admin_store,
    fail,
    friendly_errors,
)
from mcp_celery_tasks.cli.admin.view import cell, print_whole
from mcp_celery_tasks.cli.help import PlainHelpCommand, PlainHelpGroup

__all__ = ["actor", "limits_app", "with_store"]

limits_app = typer.Typer(
    cls=PlainHelpGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Quota overrides per principal and per tool, and their history.",
)
console = Console()

COLUMNS = ("max_active_tasks", "creates_per_second", "create_burst", "max_concurrent_requests",
           "max_waiting_inputs", "note")  # fmt: skip
T = TypeVar("T")


def with_store(action: Callable[[Any], T]) -> T:
    settings = admin_settings()
    store = admin_store(settings)
    with friendly_errors(settings):
        return action(store)


def actor() -> str:
    """Who the audit of limit changes names: ``MCP_TASKS_ADMIN_NAME``, else the OS user (the
    database role that ran the change is recorded beside it)."""
    name = os.environ.get("MCP_TASKS_ADMIN_NAME", "").strip()
    if not name:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
            name = f"uid {os.getuid()}"
    return name[:200]


@limits_app.command("ls", cls=PlainHelpCommand)
def list_limits(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts")] = False,
) -> None:
    """Every principal with an override (unset limits keep the defaults)."""
    rows = with_store(lambda store: store.principal_limits())
    if as_json:
        typer.echo(json.dumps(rows, default=str, indent=2))
        return
    table = Table("principal", *COLUMNS, "updated")
    for row in rows:
        cells = [cell(row[name]) for name in COLUMNS]
        table.add_row(cell(row["principal"]), *cells, cell(str(row["updated_at"])[:19]))
    print_whole(console, table)


@limits_app.command("set", cls=PlainHelpCommand)
def set_limits(
    principal: Annotated[
        str, typer.Argument(metavar="PRINCIPAL", help="e.g. token:alice or jwt:https://issuer#sub")
    ],
    max_active: Annotated[
        int | None, typer.Option(metavar="N", min=0, help="Tasks working or waiting at once")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(metavar="PER_SECOND", min=0, help="Creates per second (per API process)")
    ] = None,
    burst: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="Creates at once before the rate applies")
    ] = None,
    concurrent: Annotated[
        int | None, typer.Option(metavar="N", min=0, help="Requests in progress at once")
    ] = None,
    waiting: Annotated[
        int | None,
        typer.Option(metavar="N", min=0, help="Jobs waiting for input per queue before dispatch pauses"),
    ] = None,
    note: Annotated[str | None, typer.Option(metavar="TEXT", help="Why (shown by ls)")] = None,
) -> None:
    """Override some of a principal's limits (the others stay as they are)."""
    values = {"max_active_tasks": max_active, "creates_per_second": rate, "create_burst": burst,
              "max_concurrent_requests": concurrent, "max_waiting_inputs": waiting, "note": note}  # fmt: skip
    if all(value is None for value in values.values()):
        fail(
            "give at least one of --max-active, --rate, --burst, --concurrent, --waiting, --note", EXIT_USAGE
        )
    with_store(lambda store: store.set_principal_limits(principal, actor=actor(), **values))
    typer.echo(f"limits of {principal} set (API processes pick them up within 10 s)")


@limits_app.command("clear", cls=PlainHelpCommand)
def clear_limits(
    principal: Annotated[str, typer.Argument(metavar="PRINCIPAL", help="The principal")],
) -> None:
    """Back to the defaults."""
    if not with_store(lambda store: store.clear_principal_limits(principal, actor=actor())):
        fail(f"{principal} has no override", EXIT_NOT_FOUND)
    typer.echo(f"limits of {principal} back to the defaults")
