"""The task state machine, drawn once.

::

                 ┌──────────── working ◄──────────┐
                 │               │  ▲              │ last answer (tasks/update)
                 │     ask input │  │              │
                 │               ▼  │              │
                 │          input_required ────────┘
                 │               │
                 ▼               ▼
     completed | failed | cancelled        (terminal: never change again)

SEP-2663's state diagram has no edge out of a terminal state, so every write is a guarded
``UPDATE … WHERE status IN (<allowed from>)`` in SQL (see ``store``); a terminal row matches
nothing and is never rewritten. The SQL guards (``guard``), the table's CHECK constraint
(``CHECK``) and the Python checks (``is_terminal``, ``allowed_from``) all come from the edges
below; the in-memory store of the unit tests uses the same ones.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = [
    "ACTIVE",
    "ALL_GROUPS",
    "CANCELLED",
    "CHECK",
    "COMPLETED",
    "FAILED",
    "INPUT_REQUIRED",
    "TERMINAL",
    "WORKING",
    "Status",
    "allowed_from",
    "guard",
    "is_terminal",
    "sql_list",
]

Status = Literal["working", "input_required", "completed", "failed", "cancelled"]

WORKING: Final = "working"
INPUT_REQUIRED: Final = "input_required"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"

ALL: Final[tuple[Status, ...]] = get_args(Status)
ACTIVE: Final[tuple[Status, ...]] = ("working", "input_required")
TERMINAL: Final[tuple[Status, ...]] = ("completed", "failed", "cancelled")

_EDGES: Final[dict[Status, tuple[Status, ...]]] = {
    "working": ("input_required", "completed", "failed", "cancelled"),
    "input_required": ("working", "completed", "failed", "cancelled"),
    "completed": (),
    "failed": (),
    "cancelled": (),
}


def is_terminal(status: str) -> bool:
    return status in TERMINAL


def allowed_from(target: Status) -> tuple[Status, ...]:
    """The statuses a row may be in for a transition to ``target``."""
    return tuple(source for source, targets in _EDGES.items() if target in targets)


def sql_list(statuses: tuple[Status, ...]) -> str:
    """``('working', 'input_required')``: a SQL list of status literals."""
    return "(" + ", ".join(f"'{status}'" for status in statuses) + ")"


def guard(target: Status, column: str = "status") -> str:
    """The SQL condition a row must meet to move to ``target``: ``status IN (<allowed from>)``."""
    return f"{column} IN {sql_list(allowed_from(target))}"


CHECK: Final = f"status IN {sql_list(ALL)}"
"""The table's CHECK constraint: a status is one of the five."""


ALL_GROUPS: Final = "*"
"""``mcp_tool_limits.concurrency_group`` of an admin's override for every concurrency group of a
tool (``tools.concurrency``); a group's own label is never ``*``."""
