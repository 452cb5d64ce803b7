"""The ``tasks ls`` layout: ids whole at any width, columns left out least useful first."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console

from mcp_celery_tasks.cli.admin.connect import redact
from mcp_celery_tasks.cli.admin.view import OPTIONAL_COLUMNS, ls_table, natural_width, status_cell


def _row(**overrides: Any) -> dict[str, Any]:
    row = {
        "task_id": "T" * 32, "job_id": str(uuid.uuid4()), "status": "working", "tool": "train_model",
        "owner": "jwt:https://issuer.example#alice", "age": timedelta(seconds=75),
        "runtime": timedelta(seconds=70), "attempts": 1, "outstanding_inputs": 0,
        "last_error": None, "status_message": "epoch 3 of 30, loss 0.41", "error_kind": None,
    }  # fmt: skip
    return row | overrides


def _render(width: int, *, terminal: bool = True, wide: bool = False) -> tuple[str, tuple[str, ...]]:
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=terminal, color_system=None)
    rows = [_row(), _row(task_id="U" * 32)]
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
    assert dropped == OPTIONAL_COLUMNS[: len(dropped)]
    assert max(len(line) for line in out.splitlines()) <= width


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
