"""``mcp-celery-tasks tasks ls|show|cancel|purge``: what an operator needs, straight from Postgres."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table

from mcp_celery_tasks.admin_limits import limits_app

if TYPE_CHECKING:
    from mcp_celery_tasks.store import WorkerStore

# Celery, psycopg and pydantic-settings are imported by the commands that use them: the CLI
# registers this sub-app at start-up, and ``mcp-celery-tasks call`` or ``--help`` need none of them.

__all__ = ["admin_app", "parse_age"]

admin_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Inspect and manage tasks.")
admin_app.add_typer(limits_app, name="limits")
console = Console()

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

StatusOpt = Annotated[str | None, typer.Option(help="working, input_required, completed, failed, cancelled")]
ToolOpt = Annotated[str | None, typer.Option(help="Tool name")]
OwnerOpt = Annotated[str | None, typer.Option(help="Principal, e.g. token:alice or anon")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts")]


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w`` (or plain seconds) → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if match is None:
        raise typer.BadParameter(f"not an age: {text!r} (try 90s, 15m, 2h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _store() -> WorkerStore:
    from mcp_celery_tasks.settings import Settings
    from mcp_celery_tasks.store import WorkerStore

    return WorkerStore(Settings(), application_name="mcp-celery-tasks-admin")


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds}s"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return str(value)


@admin_app.command("ls")
def list_tasks(
    status: StatusOpt = None,
    tool: ToolOpt = None,
    owner: OwnerOpt = None,
    older_than: Annotated[str | None, typer.Option(help="Created more than this long ago (2h, 7d)")] = None,
    newer_than: Annotated[str | None, typer.Option(help="Created within this long (15m, 1d)")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List tasks, newest first (status 'stopping' = cancelled but the job still winding down)."""
    rows = _store().admin_list(
        status=status,
        tool=tool,
        owner=owner,
        older_than_s=parse_age(older_than) if older_than else None,
        newer_than_s=parse_age(newer_than) if newer_than else None,
        limit=limit,
    )
    if as_json:
        typer.echo(json.dumps(rows, default=_fmt, indent=2))
        return
    table = Table("task", "job", "status", "tool", "owner", "age", "runtime", "tries", "inputs", "message")
    for row in rows:
        message = row["last_error"] or row["status_message"] or ""
        table.add_row(
            row["task_id"][:10] + "…",
            row["job_id"][:8],
            row["status"],
            row["tool"],
            row["owner"],
            _fmt(row["age"]),
            _fmt(row["runtime"]),
            str(row["attempts"]),
            str(row["outstanding_inputs"] or ""),
            message[:60],
        )
    console.print(table)


def summary_view(store: WorkerStore) -> Group:
    """The ``top`` screen: active tasks per queue and tool, then the latest failures."""
    active, failures = store.admin_summary()
    table = Table(
        "queue", "tool", "running", "queued", "backlog", Column("waiting for input", no_wrap=True),
        "stopping", "longest", title="active tasks (queued: in the broker; backlog: waiting its turn)",
    )  # fmt: skip
    for row in active:
        table.add_row(
            row["queue"], row["tool"], str(row["running"]), str(row["queued"]), str(row["backlog"]),
            str(row["waiting_for_input"]), str(row["stopping"]), _fmt(row["longest"]),
        )  # fmt: skip
    shares = Table(
        "queue", Column("principal", no_wrap=True, min_width=11), "running", "queued", "backlog",
        Column("waiting for input", no_wrap=True), "waited",
        title="per principal (fair dispatch)",
    )  # fmt: skip
    for row in store.admin_principals():
        shares.add_row(
            row["queue"], row["owner"], str(row["running"]), str(row["queued"]), str(row["backlog"]),
            str(row["waiting_for_input"]), _fmt(row["oldest_waiting"]),
        )  # fmt: skip
    failed = Table("job", "tool", "when", "error", title="recent failures")
    for row in failures:
        failed.add_row(
            row["job_id"][:8], row["tool"], _fmt(row["created_at"]), (row["last_error"] or "")[:70]
        )
    return Group(table, shares, failed)


@admin_app.command("top")
def top(
    interval: Annotated[float, typer.Option(help="Seconds between refreshes")] = 2.0,
    once: Annotated[bool, typer.Option(help="Print one screen and exit")] = False,
) -> None:
    """A live view for admins without Grafana: running, waiting for input, queued, failures."""
    store = _store()
    if once:
        console.print(summary_view(store))
        return
    with Live(summary_view(store), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(summary_view(store))


@admin_app.command("show")
def show_task(
    ref: Annotated[str, typer.Argument(help="Task id or job id")],
    as_json: JsonOpt = False,
) -> None:
    """Everything about one task: inputs, attempts, worker, timings, error, input requests."""
    found = _store().admin_show(ref)
    if found is None:
        typer.echo(f"no task or job {ref!r}", err=True)
        raise typer.Exit(1)
    row, inputs = found
    if row["status"] == "working" and row.get("dispatched_at") is None:
        position = _store().queue_position(row["task_id"])
        if position is not None:
            row["place_in_line"] = f"{position[0]}{'+' if position[1] else ''} jobs ahead (fair backlog)"
    if as_json:
        typer.echo(json.dumps({"task": row, "inputs": inputs}, default=_fmt, indent=2))
        return
    table = Table("field", "value", show_header=False)
    for name in (
        "task_id", "job_id", "display_status", "tool_name", "owner", "queue", "status_message",
        "place_in_line", "created_at", "dispatched_at", "started_at", "finished_at", "wait_before_start",
        "runtime", "attempts", "max_attempts", "worker", "lease_until", "expires_at", "arguments",
        "preflight", "result", "error", "error_kind", "error_message", "stop_reason",
    ):  # fmt: skip
        value = row.get(name)
        table.add_row(name, json.dumps(value) if isinstance(value, dict | list) else _fmt(value))
    console.print(table)
    for item in inputs:
        state = (
            "superseded"
            if item["superseded"]
            else ("answered" if item["response"] is not None else "waiting")
        )
        console.print(f"input {item['key']} ({item['method']}, {state}): {json.dumps(item['params'])[:200]}")


@admin_app.command("cancel")
def cancel_task(
    ref: Annotated[str, typer.Argument(help="Task id or job id")],
    reason: Annotated[str, typer.Option(help="Recorded as the status message")] = "cancelled by an operator",
) -> None:
    """Cancel a task the way tasks/cancel does (the job stops at its next checkpoint)."""
    from mcp_celery_tasks.celery_app import load_app
    from mcp_celery_tasks.channel import send_wake
    from mcp_celery_tasks.settings import Settings

    cancelled = _store().admin_cancel(ref, reason)
    if not cancelled.cancelled_now or cancelled.task_id is None or cancelled.job_id is None:
        typer.echo(f"{ref!r} is unknown or already finished")
        raise typer.Exit(1)
    app = load_app(Settings())
    # The same wake-up rules as tasks/cancel (CancelOutcome.wake_inbox), then revoke.
    if cancelled.wake_inbox:
        send_wake(app, cancelled.wake_inbox, cancelled.task_id)
    app.control.revoke(cancelled.job_id)
    typer.echo(f"cancelled job {cancelled.job_id}")


@admin_app.command("purge")
def purge_tasks(
    older_than: Annotated[str, typer.Option(help="Only tasks created before this age (2h, 7d)")],
    status: StatusOpt = None,
    tool: ToolOpt = None,
    owner: OwnerOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask")] = False,
) -> None:
    """Delete finished tasks now, ahead of their expiry. Running tasks are never purged."""
    if status in ("working", "input_required"):
        raise typer.BadParameter("running tasks are never purged; cancel them first")
    if not yes:
        typer.confirm(f"Delete finished tasks older than {older_than}?", abort=True)
    deleted = _store().admin_purge(older_than_s=parse_age(older_than), status=status, tool=tool, owner=owner)
    typer.echo(f"deleted {deleted} tasks")
