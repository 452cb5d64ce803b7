"""``mcp-celery-tasks tasks console revoke NAME|--all`` and ``tasks console revocations``: end
console sessions server-side (a lost laptop), from the command line.

A revocation refuses every console session of the admin (or of every admin) issued before now,
on every API replica within about a second (the statement NOTIFYs their event hubs); it is
audited in the console's audit as ``cli:<who>``. An admin signs in again with their token; a
token that may have leaked is removed from ``MCP_TASKS_CONSOLE_ADMIN_TOKENS`` instead.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mcp_celery_tasks.cli.admin.connect import EXIT_USAGE, fail
from mcp_celery_tasks.cli.admin.limits import actor, with_store
from mcp_celery_tasks.cli.admin.view import cell, print_whole
from mcp_celery_tasks.cli.help import PlainHelpCommand, PlainHelpGroup

__all__ = ["console_app"]

console_app = typer.Typer(
    cls=PlainHelpGroup,
    add_completion=False,
    no_args_is_help=True,
    help="The web console's sessions: revoke them server-side.",
)
console = Console()

SESSION_S = 8 * 3600  # console.security's, not imported: the CLI starts without the console
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,200}")


@console_app.command("revoke", cls=PlainHelpCommand)
def revoke(
    name: Annotated[
        str | None, typer.Argument(metavar="NAME", help="The admin (a key of MCP_TASKS_CONSOLE_ADMIN_TOKENS)")
    ] = None,
    everyone: Annotated[bool, typer.Option("--all", help="Every admin's sessions")] = False,
    reason: Annotated[str | None, typer.Option(metavar="TEXT", help="Why (kept in the audit)")] = None,
) -> None:
    """Sign an admin (or, with --all, every admin) out of every console session."""
    from mcp_celery_tasks.store.revocation_calls import ALL_ADMINS, admin_subject

    if everyone == (name is not None):
        fail("give an admin's NAME or --all (not both)", EXIT_USAGE)
    if name is not None and not _NAME.fullmatch(name):
        fail("NAME: 1 to 200 characters, no control characters", EXIT_USAGE)
    subject = ALL_ADMINS if name is None else admin_subject(name)
    detail = {"from": "cli"} | ({"reason": reason[:500]} if reason else {})
    who = f"cli:{actor()}"
    with_store(lambda store: store.revoke_console_sessions(subject, who, SESSION_S, detail))
    whose = "every admin" if name is None else f"admin:{name}"
    typer.echo(f"revoked every console session of {whose} (API replicas refuse them within about 1 s)")


@console_app.command("revocations", cls=PlainHelpCommand)
def revocations(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts")] = False,
) -> None:
    """Revocations in force (each until the last session it refuses would have expired)."""
    rows = with_store(lambda store: store.console_revocations())
    found = [{"subject": row.subject, "not_before": row.not_before} for row in rows]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    table = Table("subject", "sessions issued before (epoch s)", title="console revocations")
    for row in found:
        table.add_row(cell(row["subject"]), cell(f"{row['not_before']:.3f}"))
    print_whole(console, table)
