"""``tasks limits tool ls|set|clear`` and ``tasks limits history``: tool concurrency overrides
and the audit of every limit change.

A tool declared with ``@tool(concurrency=N)`` (optionally per ``concurrency_key``) runs at most N
jobs at once; an override replaces N for every group of the tool or for one group (its label as
``tasks limits tool ls`` shows it, e.g. ``model=moons``); 0 pauses it. The fair release pass reads
overrides on every pass: a change applies at the next job that finishes or is created.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mcp_celery_tasks.cli.admin.connect import EXIT_NOT_FOUND, fail
from mcp_celery_tasks.cli.admin.limits import actor, with_store
from mcp_celery_tasks.cli.admin.view import cell, print_whole
from mcp_celery_tasks.cli.help import PlainHelpCommand, PlainHelpGroup
from mcp_celery_tasks.lifecycle import ALL_GROUPS
from mcp_celery_tasks.tools.concurrency import MAX_CONCURRENCY

__all__ = ["history", "tool_app"]

tool_app = typer.Typer(
    cls=PlainHelpGroup, add_completion=False, no_args_is_help=True, help="Concurrency overrides per tool."
)
console = Console()

KeyOption = Annotated[
    str | None,
    typer.Option(
        "--key", metavar="LABEL", help="One group of the tool (e.g. model=moons); default: all of them"
    ),
]


@tool_app.command("ls", cls=PlainHelpCommand)
def list_tool_limits(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts")] = False,
) -> None:
    """Overrides, and the concurrency groups with active jobs (in flight, waiting, limit in force)."""
    overrides, groups = with_store(lambda store: (store.tool_limits(), store.concurrency_groups()))
    if as_json:
        typer.echo(json.dumps({"overrides": overrides, "groups": groups}, default=str, indent=2))
        return
    table = Table("tool", "group", "concurrency", "note", "updated", "by", title="overrides")
    for row in overrides:
        group = "(all)" if row["concurrency_group"] == ALL_GROUPS else row["concurrency_group"] or "(tool)"
        table.add_row(cell(row["tool_name"]), cell(group), cell(row["concurrency"]), cell(row["note"]),
                      cell(str(row["updated_at"])[:19]), cell(row["updated_by"]))  # fmt: skip
    print_whole(console, table)
    table = Table("tool", "group", "in flight", "waiting", "declared", "in force", title="groups in use")
    for row in groups:
        group = row["concurrency_group"] or "(tool)"
        table.add_row(cell(row["tool_name"]), cell(group), cell(row["in_flight"]), cell(row["waiting"]),
                      cell(row["declared"]), cell(row["in_force"]))  # fmt: skip
    print_whole(console, table)


@tool_app.command("set", cls=PlainHelpCommand)
def set_tool_limit(
    tool: Annotated[str, typer.Argument(metavar="TOOL", help="The tool's name")],
    concurrency: Annotated[
        int, typer.Argument(metavar="N", min=0, max=MAX_CONCURRENCY, help="Runs at once (0: paused)")
    ],
    key: KeyOption = None,
    note: Annotated[str | None, typer.Option(metavar="TEXT", help="Why (shown by ls)")] = None,
) -> None:
    """Replace a tool's concurrency limit, for all its groups or one (only tools declared with
    ``concurrency=`` are limited)."""
    group = ALL_GROUPS if key is None else key
    with_store(lambda store: store.set_tool_limit(tool, concurrency, group=group, note=note, actor=actor()))
    where = tool if key is None else f"{tool} for {key}"
    state = "paused" if concurrency == 0 else f"at most {concurrency} at once"
    typer.echo(f"{where}: {state} (applies at the next release pass)")


@tool_app.command("clear", cls=PlainHelpCommand)
def clear_tool_limit(
    tool: Annotated[str, typer.Argument(metavar="TOOL", help="The tool's name")],
    key: KeyOption = None,
) -> None:
    """Back to the limit the tool declares."""
    group = ALL_GROUPS if key is None else key
    if not with_store(lambda store: store.clear_tool_limit(tool, group=group, actor=actor())):
        fail(f"{tool} has no override{'' if key is None else f' for {key}'}", EXIT_NOT_FOUND)
    typer.echo(f"{tool}{'' if key is None else f' for {key}'}: back to its declared limit")


def history(
    limit: Annotated[int, typer.Option(metavar="N", min=1, max=10_000, help="Changes to show")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts")] = False,
) -> None:
    """Every change to a principal's or a tool's limits, newest first: who, when, old -> new."""
    rows = with_store(lambda store: store.limit_changes(limit))
    if as_json:
        typer.echo(json.dumps(rows, default=str, indent=2))
        return
    table = Table("when", "who", "target", "field", "old", "new")
    for row in rows:
        table.add_row(cell(str(row["changed_at"])[:19]), cell(row["actor"]), cell(row["target"]),
                      cell(row["field"]), cell(row["old_value"]), cell(row["new_value"]))  # fmt: skip
    print_whole(console, table)
