"""``mcp-celery-tasks tasks ls|show|cancel|purge|top``: what an operator needs, straight from Postgres.

Without ``MCP_TASKS_DATABASE_URL`` the commands use the running dev stack of this checkout
(``admincommon``); every expected failure is one ``error: …`` line and an exit code.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from mcp_celery_tasks.cli.admin.connect import (
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    admin_settings,
    admin_store,
    fail,
    friendly_errors,
)
from mcp_celery_tasks.cli.admin.console import console_app
from mcp_celery_tasks.cli.admin.limits import limits_app
from mcp_celery_tasks.cli.admin.tool_limits import history, tool_app
from mcp_celery_tasks.cli.admin.view import (
    cell,
    fmt,
    ls_table,
    natural_width,
    print_whole,
    show_table,
    summary_view,
)
from mcp_celery_tasks.cli.admin.workers import list_workers, top_tables
from mcp_celery_tasks.cli.help import PlainHelpCommand, PlainHelpGroup
from mcp_celery_tasks.client.terminal import plain

if TYPE_CHECKING:
    from mcp_celery_tasks.settings import Settings
    from mcp_celery_tasks.store import WorkerStore

# Celery, psycopg and pydantic-settings are imported by the commands that use them: the CLI
# registers this sub-app at start-up, and ``mcp-celery-tasks call`` or ``--help`` need none of them.

__all__ = ["admin_app", "parse_age"]

admin_app = typer.Typer(
    cls=PlainHelpGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Inspect and manage tasks (the running dev stack's, unless MCP_TASKS_DATABASE_URL is set)."
    f"\n\n{EXIT_CODES_HELP}",
)
admin_app.add_typer(limits_app, name="limits")
admin_app.add_typer(console_app, name="console")
limits_app.add_typer(tool_app, name="tool")
limits_app.command("history", cls=PlainHelpCommand)(history)
admin_app.command("workers", cls=PlainHelpCommand)(list_workers)
console = Console()

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
STATUSES = (
    "working", "input_required", "suspended", "completed", "failed", "cancelled", "stopping", "errored"
)  # fmt: skip
"""``mcp_tasks_overview``'s statuses: the spec's five plus ``suspended`` (input_required with no
process: the job gave its slot back) and ``stopping`` (cancelled, job winding down); and for
``ls``, ``errored``: completed with a tool error, crash or limit (``input_required`` lists the
suspended ones too)."""
PURGEABLE = ("completed", "failed", "cancelled")
MIN_PREFIX = 6

StatusOpt = Annotated[str | None, typer.Option(metavar="STATUS", help=", ".join(STATUSES))]
ToolOpt = Annotated[str | None, typer.Option(metavar="NAME", help="Tool name")]
OwnerOpt = Annotated[
    str | None, typer.Option(metavar="PRINCIPAL", help="Principal, e.g. token:alice or anon")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts")]
RefArg = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help=f"Task id, job id, or a unique prefix of either ({MIN_PREFIX}+ characters); "
        "an id starting with '-' goes after '--'",
    ),
]


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w`` (or plain seconds) → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if match is None:
        fail(f"not an age: {text!r} (try 90s, 15m, 2h, 7d)", EXIT_USAGE)
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _check_status(status: str | None, allowed: tuple[str, ...]) -> None:
    if status is not None and status not in allowed:
        fail(f"unknown status {status!r}; valid: {', '.join(allowed)}", EXIT_USAGE)


def _open() -> tuple[Settings, WorkerStore]:
    settings = admin_settings()
    return settings, admin_store(settings)


def _resolve(store: WorkerStore, ref: str) -> Mapping[str, object]:
    """The one task ``ref`` names: an exact task or job id, else a unique prefix (its
    ``admin_match`` row: task_id, job_id, tool, status)."""
    matches = store.admin_match(ref)
    if matches and matches[0]["exact"]:
        return matches[0]
    if not matches:
        hint = f" (a prefix needs {MIN_PREFIX}+ characters)" if len(ref) < MIN_PREFIX else ""
        fail(f"no task or job {ref!r}{hint}", EXIT_NOT_FOUND)
    if len(matches) > 1:
        lines = [f"{ref!r} matches several tasks; give more characters:"]
        lines += [plain(f"  {m['task_id']}  job {m['job_id']}  {m['tool']}  {m['status']}") for m in matches]
        typer.echo("\n".join(lines), err=True)
        raise typer.Exit(EXIT_USAGE)
    return matches[0]


@admin_app.command("ls", cls=PlainHelpCommand)
def list_tasks(
    status: StatusOpt = None,
    tool: ToolOpt = None,
    owner: OwnerOpt = None,
    older_than: Annotated[
        str | None, typer.Option(metavar="AGE", help="Created more than this long ago (2h, 7d)")
    ] = None,
    newer_than: Annotated[
        str | None, typer.Option(metavar="AGE", help="Created within this long (15m, 1d)")
    ] = None,
    limit: Annotated[int, typer.Option(metavar="N", min=1, help="At most this many rows")] = 50,
    wide: Annotated[bool, typer.Option("--wide", help="Every column, however narrow the terminal")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List tasks, newest first, with whole ids ('stopping' = cancelled, job still winding down;
    'errored' = completed with a tool error or crash)."""
    _check_status(status, STATUSES)
    older = parse_age(older_than) if older_than else None
    newer = parse_age(newer_than) if newer_than else None
    settings, store = _open()
    with friendly_errors(settings):
        rows = store.admin_list(
            status=status, tool=tool, owner=owner, older_than_s=older, newer_than_s=newer, limit=limit
        )
    if as_json:
        typer.echo(json.dumps(rows, default=fmt, indent=2))
        return
    table, layout = ls_table(rows, console, wide=wide)
    if layout.dropped:
        typer.echo(f"narrow terminal: left out {', '.join(layout.dropped)} (--wide shows them)", err=True)
    # Never narrower than the table: a pipe or --wide gets it whole, and an id is never cut.
    console.width = max(console.width, natural_width(console, table))
    console.print(table, crop=False)


@admin_app.command("top", cls=PlainHelpCommand)
def top(
    interval: Annotated[
        float, typer.Option(metavar="SECONDS", min=0.2, help="Seconds between refreshes")
    ] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one screen and exit")] = False,
) -> None:
    """A live view for admins without Grafana: running, waiting for input, queued, the demand per
    queue, the live workers and their devices, failures."""
    from rich.live import Live

    from mcp_celery_tasks.errors import InfrastructureError

    settings, store = _open()

    def screen(caption: str) -> Any:
        with friendly_errors(settings):
            active, failures = store.admin_summary()
            principals = store.admin_principals()
        try:
            fleet: list[RenderableType] = top_tables(store.workers(), store.queue_demand())
        except InfrastructureError as exc:  # a registry not migrated or granted: the rest still shows
            fleet = [Text(f"workers: {exc}", style="yellow")]
        return summary_view(active, failures, caption, principals, fleet)

    if once:
        print_whole(console, screen(""))
        return
    caption = f"refreshed every {interval:g} s · Ctrl-C to quit"
    try:
        with Live(screen(caption), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(screen(caption))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@admin_app.command("show", cls=PlainHelpCommand)
def show_task(ref: RefArg, as_json: JsonOpt = False) -> None:
    """Everything about one task: inputs, attempts, worker, timings, error kind and message."""
    settings, store = _open()
    with friendly_errors(settings):
        task_id = str(_resolve(store, ref)["task_id"])
        found = store.admin_show(task_id)
        steps, checkpoints = store.admin_durables(task_id)
    if found is None:  # purged in between
        fail(f"no task or job {ref!r}", EXIT_NOT_FOUND)
    row, inputs = dict(found[0]), found[1]
    if row["status"] == "working" and row.get("dispatched_at") is None:
        with friendly_errors(settings):
            position = store.queue_position(str(row["task_id"]))
        if position is not None:
            row["place_in_line"] = f"{position[0]}{'+' if position[1] else ''} jobs ahead (fair backlog)"
    if as_json:
        shown = {"task": row, "inputs": inputs, "steps": steps, "checkpoints": checkpoints}
        typer.echo(json.dumps(shown, default=fmt, indent=2))
        return
    print_whole(console, show_table(row))
    for item in inputs:
        state = (
            "superseded"
            if item["superseded"]
            else ("answered" if item["response"] is not None else "waiting")
        )
        params = json.dumps(item["params"], ensure_ascii=False)[:200]
        console.print(cell(f"input {item['key']} ({item['method']}, {state}): {params}"))
    for step in steps:
        recorded = fmt(step["recorded_at"])
        console.print(
            cell(f"step {step['seq']} {step['name']!r} ({step['size']} bytes, recorded {recorded})")
        )
    for saved in checkpoints:
        console.print(
            cell(
                f"checkpoint {saved['name']!r} ({saved['size']} bytes in {saved['storage']}, "
                f"sha256 {str(saved['sha256'])[:12]}…, saved {fmt(saved['saved_at'])})"
            )
        )


@admin_app.command("cancel", cls=PlainHelpCommand)
def cancel_task(
    ref: RefArg,
    reason: Annotated[
        str, typer.Option(metavar="TEXT", help="Recorded as the status message")
    ] = "cancelled by an operator",
) -> None:
    """Cancel a task the way tasks/cancel does (the job stops at its next checkpoint)."""
    from mcp_celery_tasks.broker.operator import notify_cancelled

    settings, store = _open()
    with friendly_errors(settings):
        match = _resolve(store, ref)
        cancelled = store.admin_cancel(str(match["task_id"]), reason)
    if not cancelled.cancelled_now or cancelled.task_id is None or cancelled.job_id is None:
        fail(f"task {match['task_id']} is already {match['status']}: nothing to cancel", EXIT_NOT_FOUND)
    problem = notify_cancelled(settings, cancelled.job_id, cancelled.wake_inbox)
    typer.echo(f"cancelled task {cancelled.task_id} (job {cancelled.job_id})")
    if problem:
        typer.echo(
            f"warning: the broker is unreachable ({problem}); the task is cancelled and the job "
            "stops at its next checkpoint",
            err=True,
        )


@admin_app.command("purge", cls=PlainHelpCommand)
def purge_tasks(
    older_than: Annotated[
        str, typer.Option(metavar="AGE", help="Only tasks created before this age (2h, 7d)")
    ],
    status: Annotated[str | None, typer.Option(metavar="STATUS", help=", ".join(PURGEABLE))] = None,
    tool: ToolOpt = None,
    owner: OwnerOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask")] = False,
) -> None:
    """Delete finished tasks now, ahead of their expiry. Running tasks are never purged."""
    if status in ("working", "input_required", "suspended", "stopping"):
        fail(
            f"{status} tasks are still running and are never purged; cancel them first "
            f"(purge takes --status {', '.join(PURGEABLE)})",
            EXIT_USAGE,
        )
    _check_status(status, PURGEABLE)
    age = parse_age(older_than)
    settings, store = _open()
    if not yes:
        typer.confirm(f"Delete finished tasks older than {older_than}?", abort=True)
    with friendly_errors(settings):
        deleted = store.admin_purge(older_than_s=age, status=status, tool=tool, owner=owner)
    typer.echo(f"deleted {deleted} tasks")
