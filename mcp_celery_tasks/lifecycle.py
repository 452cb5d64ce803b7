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
nothing and is never rewritten.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "Status",
    "allowed_from",
    "is_terminal",
]

Status = Literal["working", "input_required", "completed", "failed", "cancelled"]

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
