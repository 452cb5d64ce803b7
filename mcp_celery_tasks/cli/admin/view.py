"""The admin commands' screens: the ``ls`` table fitted to the terminal, ``top`` and ``show``.

Ids are never cut: an operator copies them into ``show`` and ``cancel``. Piped output is never
narrowed (``ls``, ``top``, ``show``, ``limits ls``: the natural width, or ``COLUMNS``). On a
narrow terminal the job id goes under the task id, then the least useful columns are left out
(and named on stderr) until the table fits; ``--wide`` shows everything.

Every value in a cell came from a caller, a tool or the database: it is shown through
``cell`` (``terminal.plain`` in a Rich ``Text``), never as markup and never with its escapes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from mcp_celery_tasks.client.terminal import plain

__all__ = [
    "LsLayout",
    "cell",
    "fmt",
    "ls_table",
    "natural_width",
    "print_whole",
    "show_table",
    "status_cell",
    "summary_view",
]


def fmt(value: object) -> str:
    """A value of an admin row as text: nothing for None, ``1h05m`` for a duration, ISO 8601 for
    a moment, else ``str()``."""
    if value is None:
        return ""
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds}s"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return str(value)


def cell(value: object, style: str = "") -> Text:
    """A value shown as inert text: ``fmt``, control characters stripped, no markup."""
    return Text(plain(fmt(value)), style=style)


def status_cell(row: Mapping[str, object]) -> Text:
    """``failed`` in red; a task that completed with ``isError`` (a tool error, a crash, a limit)
    is ``errored`` in red too: for an operator it is a failure, whatever the wire status."""
    status = row["status"]
    if status == "failed":
        return Text("failed", style="red")
    if status == "completed" and row.get("error_kind"):
        return Text("errored", style="red")
    return cell(status)


def _message(row: Mapping[str, object]) -> str:
    if row.get("error_kind") and row.get("last_error"):
        return f"{row['error_kind']}: {row['last_error']}"[:80]
    return str(row.get("last_error") or row.get("status_message") or "")[:80]


# Left out first on a narrow terminal, in this order; ids and status always stay. ``device`` (the
# GPU of the latest run) is a column only when a listed row has one: a CPU-only fleet never sees it.
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "message", "inputs", "tries", "device", "runtime", "owner", "age", "tool"
)  # fmt: skip
COLUMN_ORDER: tuple[str, ...] = ("tool", "device", "owner", "age", "runtime", "tries", "inputs", "message")
# A place for a dispatch position ("queued #3") is the status column: the fair-dispatch work may
# fill it in through status_cell without changing the layout.


@dataclass(frozen=True)
class LsLayout:
    stacked: bool
    """The job id under the task id (one column) instead of beside it."""
    status_in_id: bool
    """At the narrowest, the status goes under the ids too."""
    columns: tuple[str, ...]
    dropped: tuple[str, ...]


def _cells(row: Mapping[str, object]) -> dict[str, Text]:
    return {
        "tool": cell(row["tool"]),
        "device": cell(row.get("device")),
        "owner": cell(row["owner"]),
        "age": cell(row["age"]),
        "runtime": cell(row["runtime"]),
        "tries": cell(row["attempts"]),
        "inputs": cell(row["outstanding_inputs"] or ""),
        "message": cell(_message(row)),
    }


def _build(rows: Sequence[Mapping[str, object]], layout: LsLayout, narrow_box: bool) -> Table:
    table = Table(box=box.SIMPLE_HEAD if narrow_box else box.HEAVY_HEAD, show_edge=not narrow_box)
    id_headers = (
        ["task / job" + (" / status" if layout.status_in_id else "")] if layout.stacked else ["task", "job"]
    )
    for header in id_headers:
        table.add_column(header, no_wrap=True, overflow="ignore")  # an id is never cut
    if not layout.status_in_id:
        table.add_column("status", no_wrap=True)
    for name in layout.columns:
        table.add_column(name, no_wrap=name != "message")
    for row in rows:
        cells = _cells(row)
        status = status_cell(row)
        if layout.stacked:
            first: list[RenderableType] = [
                Text("\n").join(
                    [cell(row["task_id"]), cell(row["job_id"], style="dim")]
                    + ([status] if layout.status_in_id else [])
                )
            ]
        else:
            first = [cell(row["task_id"]), cell(row["job_id"])]
        table.add_row(*first, *([] if layout.status_in_id else [status]), *(cells[n] for n in layout.columns))
    return table


def natural_width(console: Console, table: RenderableType) -> int:
    """The width ``table`` takes when nothing limits it."""
    return Measurement.get(console, console.options.update(max_width=100_000), table).maximum


def print_whole(console: Console, renderable: RenderableType) -> None:
    """Print at the terminal's width; piped, at the natural width (rich would otherwise assume 80
    columns and cut every cell to fit), or at ``COLUMNS`` when it is set."""
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        console.width = max(console.width, natural_width(console, renderable))
    console.print(renderable, crop=False)


def ls_table(rows: Sequence[Mapping[str, object]], console: Console, *, wide: bool) -> tuple[Table, LsLayout]:
    """The widest layout that fits the console without cutting an id."""
    shown = tuple(n for n in COLUMN_ORDER if n != "device" or any(row.get("device") for row in rows))
    layout = LsLayout(False, False, shown, ())
    table = _build(rows, layout, narrow_box=False)
    if wide or not console.is_terminal or natural_width(console, table) <= console.width:
        return table, layout
    columns = list(shown)
    dropped: list[str] = []
    candidates = [LsLayout(True, False, tuple(columns), ())]
    for name in (n for n in OPTIONAL_COLUMNS if n in shown):
        columns.remove(name)
        dropped.append(name)
        candidates.append(LsLayout(True, False, tuple(columns), tuple(dropped)))
    candidates.append(LsLayout(True, True, (), tuple(dropped)))
    for layout in candidates:
        table = _build(rows, layout, narrow_box=True)
        if natural_width(console, table) <= console.width:
            return table, layout
    return table, layout  # narrower than an id: the terminal wraps it, rich never cuts it


def summary_view(
    active: Sequence[Mapping[str, object]],
    failures: Sequence[Mapping[str, object]],
    caption: str,
    principals: Sequence[Mapping[str, object]] | None = None,
    fleet: Sequence[RenderableType] = (),
) -> Group:
    """The ``top`` screen: active tasks per queue and tool, fair dispatch per principal, the
    ``fleet`` (the demand per queue and the live workers, ``workers.top_tables``), then the
    latest failures."""
    table = Table(
        "queue", "tool", "running", "queued", "backlog", Column("waiting for input", no_wrap=True),
        "suspended", "stopping", "longest",
        title="active tasks (queued: in the broker; backlog: waiting its turn; suspended: waiting, no slot)",
    )  # fmt: skip
    for row in active:
        table.add_row(
            cell(row["queue"]), cell(row["tool"]), cell(row["running"]), cell(row["queued"]),
            cell(row.get("backlog", 0)), cell(row["waiting_for_input"]), cell(row.get("suspended", 0)),
            cell(row["stopping"]),
            cell(row["longest"]),
        )  # fmt: skip
    shares = Table(
        "queue", Column("principal", no_wrap=True, min_width=11), "running", "queued", "backlog",
        Column("waiting for input", no_wrap=True), "suspended", "waited",
        title="per principal (fair dispatch)",
    )  # fmt: skip
    for row in principals or []:
        shares.add_row(
            cell(row["queue"]), cell(row["owner"]), cell(row["running"]), cell(row["queued"]),
            cell(row["backlog"]), cell(row["waiting_for_input"]), cell(row.get("suspended", 0)),
            cell(row["oldest_waiting"]),
        )  # fmt: skip
    failed = Table("job", "tool", "when", "kind", "error", title="recent failures")
    for row in failures:
        job = cell(row["job_id"])
        job.no_wrap = True
        failed.add_row(
            job,
            cell(row["tool"]),
            cell(row["created_at"]),
            cell(row.get("error_kind")),
            cell(plain(row["last_error"])[:70]),
        )
    return Group(table, shares, *fleet, failed, Text(caption, style="dim"))


SHOW_FIELDS = (
    "task_id", "job_id", "display_status", "tool_name", "owner", "queue", "status_message",
    "place_in_line", "created_at", "dispatched_at", "started_at", "finished_at", "wait_before_start",
    "runtime", "attempts", "max_attempts", "redeliveries", "suspensions", "suspended_at", "resumed_at",
    "worker", "device", "lease_until", "expires_at", "arguments",
    "preflight", "result", "error", "error_kind", "error_message", "stop_reason",
)  # fmt: skip


def show_table(row: Mapping[str, object]) -> Table:
    table = Table("field", "value", show_header=False)
    for name in SHOW_FIELDS:
        value = row.get(name)
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
        if name == "display_status":
            status = status_cell({"status": value, "error_kind": row.get("error_kind")})
            table.add_row(name, status)
            continue
        table.add_row(name, cell(shown))
    return table
