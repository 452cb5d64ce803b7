"""``mcp-celery-tasks tasks workers``: the workers the registry knows, what each runs now, and the
demand per queue an autoscaler sees (``mcp_queue_demand``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from mcp_celery_tasks.cli.admin.connect import admin_settings, admin_store, friendly_errors
from mcp_celery_tasks.cli.admin.view import fmt, print_whole

__all__ = ["list_workers", "workers_view"]

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


def workers_view(workers: Sequence[Mapping[str, object]], demand: Sequence[Mapping[str, object]]) -> Group:
    """The two tables: workers (live first), then the demand per queue."""
    table = Table(title="workers", title_justify="left")
    for name in ("node", "kind", "host", "queues", "slots", "pool", "version", "devices", "started",
                 "heartbeat", "running now"):  # fmt: skip
        table.add_column(name)
    for row in workers:
        queues = row.get("queues")
        devices = row.get("devices")
        heartbeat = Text(_age(row.get("heartbeat_age_s")), style="" if row.get("alive") else "red")
        if not row.get("alive"):
            heartbeat.append(" (dead)")
        table.add_row(
            fmt(row["node"]), fmt(row["kind"]), fmt(row["hostname"]),
            ", ".join(map(str, queues)) if isinstance(queues, list) else "", fmt(row.get("slots")),
            fmt(row.get("pool")), fmt(row.get("version")),
            "" if devices is None else json.dumps(devices), fmt(row.get("started_at")), heartbeat,
            _jobs(row.get("jobs")),
        )  # fmt: skip
    queues = Table(title="demand per queue (mcp_queue_demand)", title_justify="left")
    columns = DEMAND_COLUMNS
    for name in columns:
        queues.add_column(name)
    for row in demand:
        oldest = row.get("oldest_queued_s")
        queues.add_row(*(f"{oldest:.0f}" if name == "oldest_queued_s" and isinstance(oldest, float)
                         else fmt(row.get(name)) for name in columns))  # fmt: skip
    return Group(table, queues)
