"""The ``tasks ls`` layout: ids whole at any width, columns left out least useful first, a
``device`` column only when a row ran on a GPU; and ``tasks top``'s fleet tables."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console

from mcp_celery_tasks.cli.admin.connect import redact
from mcp_celery_tasks.cli.admin.view import OPTIONAL_COLUMNS, ls_table, natural_width, status_cell
from mcp_celery_tasks.cli.admin.workers import top_tables, workers_view


def _row(**overrides: Any) -> dict[str, Any]:
    row = {
        "task_id": "T" * 32, "job_id": str(uuid.uuid4()), "status": "working", "tool": "train_model",
        "owner": "jwt:https://issuer.example#alice", "age": timedelta(seconds=75),
        "runtime": timedelta(seconds=70), "attempts": 1, "outstanding_inputs": 0,
        "last_error": None, "status_message": "epoch 3 of 30, loss 0.41", "error_kind": None,
    }  # fmt: skip
    return row | overrides


def _render(
    width: int, *, terminal: bool = True, wide: bool = False, device: str | None = None
) -> tuple[str, tuple[str, ...]]:
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=terminal, color_system=None)
    rows = [_row(), _row(task_id="U" * 32, device=device)]
    table, layout = ls_table(rows, console, wide=wide)
    console.width = max(console.width, natural_width(console, table))
    console.print(table, crop=False)
    out = screen.getvalue()
    for row in rows:
        assert row["task_id"] in out and row["job_id"] in out
    return out, layout.dropped


def test_a_wide_terminal_shows_every_column() -> None:
    out, dropped = _render(250)
    assert dropped == () and "epoch 3 of 30" in out


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120])
def test_a_narrow_terminal_leaves_out_the_least_useful_columns_first(width: int) -> None:
    out, dropped = _render(width)
    without_device = tuple(name for name in OPTIONAL_COLUMNS if name != "device")
    assert dropped == without_device[: len(dropped)]
    assert max(len(line) for line in out.splitlines()) <= width
    out, dropped = _render(width, device="GPU-8f3c")
    assert dropped == OPTIONAL_COLUMNS[: len(dropped)]
    assert max(len(line) for line in out.splitlines()) <= width


def test_the_device_column_shows_only_when_a_row_ran_on_a_gpu() -> None:
    header = next(line for line in _render(250)[0].splitlines() if "task" in line and "status" in line)
    assert "device" not in header
    out, _ = _render(250, device="GPU-8f3c")
    header = next(line for line in out.splitlines() if "task" in line and "status" in line)
    assert header.index("tool") < header.index("device") < header.index("owner")
    assert "GPU-8f3c" in out


def test_piped_output_and_wide_are_never_narrowed() -> None:
    for out, dropped in (_render(40, terminal=False), _render(40, wide=True)):
        assert dropped == () and "epoch 3 of 30" in out


def test_a_task_that_completed_with_an_error_shows_as_errored() -> None:
    assert str(status_cell(_row(status="completed", error_kind="crash"))) == "errored"
    assert str(status_cell(_row(status="completed"))) == "completed"
    assert str(status_cell(_row(status="failed", error_kind="mcp_error"))) == "failed"


def test_passwords_are_hidden_in_messages() -> None:
    assert redact("postgresql://u:s3cret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact("postgresql://u@db/x") == "postgresql://u@db/x"
    assert redact("postgresql://postgres:@/x?host=/tmp") == "postgresql://postgres:@/x?host=/tmp"


def _fleet_text(workers: list[dict[str, Any]], demand: list[dict[str, Any]]) -> str:
    console = Console(record=True, width=250, color_system=None)
    for table in top_tables(workers, demand):
        console.print(table)
    return console.export_text()


def _demand(queue: str, **counts: Any) -> dict[str, Any]:
    row = {"queue": queue, "demand_slots": 0, "backlog": 0, "published": 0, "running": 0,
           "waiting_resident": 0, "waiting_suspended": 0, "oldest_queued_s": 0.0, "worker_slots": 0,
           "slots_available": 0, "workers": 0}  # fmt: skip
    return row | counts


def test_top_shows_the_demand_per_queue_and_each_live_worker_with_its_devices() -> None:
    jobs = [
        {"job_id": "j1", "tool": "train", "device": "0"},
        {"job_id": "j2", "tool": "train", "device": "1"},
    ]
    gpu = {"node": "gpu@pod-a", "kind": "worker", "queues": ["gpu", "mcp.maintenance"], "slots": 4,
           "devices": ["0", "1"], "alive": True, "heartbeat_age_s": 3.2, "jobs": jobs}  # fmt: skip
    beat = {"node": "gen7@pod-b", "kind": "beat", "alive": True, "heartbeat_age_s": 1.0, "jobs": []}
    demand = [_demand("gpu", demand_slots=5, backlog=3, running=2, waiting_suspended=4,
                      oldest_queued_s=42.4, worker_slots=4, slots_available=2, workers=1)]  # fmt: skip
    text = _fleet_text([gpu, beat], demand)
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if "│" in line]
    assert ["gpu", "5", "3", "0", "2", "0", "4", "42s", "2 of 4", "1"] in rows
    worker = next(line for line in text.splitlines() if "gpu@pod-a" in line)
    assert "gpu, mcp.maintenance" in worker and "2 of 4" in worker and "0, 1" in worker
    assert "3s ago" in worker and "2: train x2" in worker
    assert "gen7@pod-b" not in text  # a beat consumes no queue: tasks workers lists it, top does not


def test_top_says_when_no_worker_is_live() -> None:
    text = _fleet_text([], [_demand("mcp.default", demand_slots=2, backlog=2)])
    assert "workers: none live (nothing consumes the queues)" in text


def test_worker_fields_are_shown_inert() -> None:
    evil = {"node": "w\x1b]0;pwned\x07@host", "kind": "worker", "hostname": "h\x1b[H",
            "queues": ["q\x1b[2J"], "slots": 1, "devices": ["GPU-\u202e1"],
            "alive": True, "heartbeat_age_s": 1.0, "jobs": [{"tool": "t\x9b31m[bold]x[/bold]"}]}  # fmt: skip
    text = _fleet_text([evil], [_demand("q\x1b[2J")])
    console = Console(record=True, width=250, color_system=None)
    console.print(workers_view([evil], [_demand("q\x1b[2J")]))
    for shown in (text, console.export_text()):
        for control in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert control not in shown, (control, shown)
        assert "[bold]x[/bold]" in shown  # markup stays literal text
