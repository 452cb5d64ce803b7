"""``mcp-celery-tasks tasks workers``: the workers the registry knows, what each runs now, and the
demand per queue an autoscaler sees (``mcp_queue_demand``); and the compact form ``tasks top``
shows. Every value goes through ``cell`` (``terminal.plain``): node names, devices and tool names
come from processes an operator does not control."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Column, Table
from rich.text import Text

from mcp_celery_tasks.cli.admin.connect import admin_settings, admin_store, friendly_errors
from mcp_celery_tasks.cli.admin.view import cell, fmt, print_whole

__all__ = ["list_workers", "top_tables", "workers_view"]

console = Console()

DEMAND_COLUMNS = (
    "queue", "demand_slots", "backlog", "published", "running", "waiting_resident",
    "waiting_suspended", "oldest_queued_s", "worker_slots", "slots_available", "workers",
)  # fmt: skip


def list_workers(
    include_dead: Annotated[
        bool, typer.Option("--all", help="Also the dead ones of the last hour (no heartbeat)")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts")] = False,
) -> None:
    """Live workers and beats: node, queues, slots, devices, version, heartbeat age and the jobs
    each runs now; then the demand per queue (what KEDA's trigger reads)."""
    settings = admin_settings()
    store = admin_store(settings)
    with friendly_errors(settings):
        workers = store.workers(include_dead=include_dead)
        demand = store.queue_demand()
    if as_json:
        typer.echo(json.dumps({"workers": workers, "queues": demand}, default=fmt, indent=2))
        return
    print_whole(console, workers_view(workers, demand))


def _age(seconds: object) -> str:
    value = float(seconds) if isinstance(seconds, int | float) else 0.0
    return f"{value:.0f}s ago" if value < 120 else f"{value / 60:.0f}m ago"


def _jobs(jobs: object) -> str:
    if not isinstance(jobs, list) or not jobs:
        return ""
    tools = Counter(str(job.get("tool")) for job in jobs if isinstance(job, dict))
    return f"{len(jobs)}: " + ", ".join(
        f"{tool} x{n}" if n > 1 else tool for tool, n in sorted(tools.items())
    )


def _listed(values: object) -> str:
    """Queues or devices: ``0, 1`` for a list, JSON for anything else a worker wrote."""
    if values is None:
        return ""
    if isinstance(values, list):
        return ", ".join(map(str, values))
    return json.dumps(values)


def _heartbeat(row: Mapping[str, object]) -> Text:
    heartbeat = cell(_age(row.get("heartbeat_age_s")), style="" if row.get("alive") else "red")
    if not row.get("alive"):
        heartbeat.append(" (dead)")
    return heartbeat


def _oldest(row: Mapping[str, object], unit: str = "s") -> Text:
    oldest = row.get("oldest_queued_s")
    return cell(f"{oldest:.0f}{unit}" if isinstance(oldest, int | float) else "")


def workers_view(workers: Sequence[Mapping[str, object]], demand: Sequence[Mapping[str, object]]) -> Group:
    """The two tables: workers (live first), then the demand per queue."""
    table = Table(title="workers", title_justify="left")
    for name in ("node", "kind", "host", "queues", "slots", "pool", "version", "devices", "started",
                 "heartbeat", "running now"):  # fmt: skip
        table.add_column(name)
    for row in workers:
        table.add_row(
            cell(row["node"]), cell(row["kind"]), cell(row["hostname"]), cell(_listed(row.get("queues"))),
            cell(row.get("slots")), cell(row.get("pool")), cell(row.get("version")),
            cell(_listed(row.get("devices"))), cell(row.get("started_at")), _heartbeat(row),
            cell(_jobs(row.get("jobs"))),
        )  # fmt: skip
    queues = Table(title="demand per queue (mcp_queue_demand)", title_justify="left")
    for name in DEMAND_COLUMNS:
        queues.add_column(name)
    for row in demand:
        queues.add_row(*(_oldest(row, "") if name == "oldest_queued_s" else cell(row.get(name))
                         for name in DEMAND_COLUMNS))  # fmt: skip
    return Group(table, queues)


def top_tables(
    workers: Sequence[Mapping[str, object]], demand: Sequence[Mapping[str, object]]
) -> list[RenderableType]:
    """``tasks top``'s compact fleet: the demand per queue (what an autoscaler is told), then the
    live workers with their devices and what each runs now (``tasks workers`` has every field)."""
    queues = Table(
        "queue", Column("wants slots", no_wrap=True), "backlog", "queued", "running",
        Column("waiting for input", no_wrap=True), "suspended", "oldest",
        Column("free slots", no_wrap=True), "workers",
        title="demand per queue (wants slots: what an autoscaler reads; suspended tasks do not count)",
    )  # fmt: skip
    for row in demand:
        queues.add_row(
            cell(row["queue"]), cell(row["demand_slots"]), cell(row["backlog"]), cell(row["published"]),
            cell(row["running"]), cell(row["waiting_resident"]), cell(row["waiting_suspended"]),
            _oldest(row), cell(f"{row['slots_available']} of {row['worker_slots']}"), cell(row["workers"]),
        )  # fmt: skip
    live = [row for row in workers if row.get("kind") == "worker"]
    fleet = Table(
        Column("worker", no_wrap=True), "queues", "busy", "devices", "heartbeat", "running now",
        title="workers" if live else "workers: none live (nothing consumes the queues)",
    )  # fmt: skip
    for row in live:
        jobs = row.get("jobs")
        busy = f"{len(jobs) if isinstance(jobs, list) else 0} of {fmt(row.get('slots'))}"
        fleet.add_row(
            cell(row["node"]), cell(_listed(row.get("queues"))), cell(busy),
            cell(_listed(row.get("devices"))), _heartbeat(row), cell(_jobs(jobs)),
        )  # fmt: skip
    return [queues, fleet]
