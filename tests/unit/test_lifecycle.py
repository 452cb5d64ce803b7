"""The state machine: which statuses a transition may start from, and that terminal is final."""

from __future__ import annotations

import re
from typing import get_args

import pytest

from mcp_celery_tasks.lifecycle import ACTIVE, TERMINAL, Status, allowed_from, is_terminal
from mcp_celery_tasks.store.schema import STATUS_CHECK

STATUSES: tuple[Status, ...] = get_args(Status)


def test_statuses_split_into_active_and_terminal() -> None:
    assert set(ACTIVE) == {"working", "input_required"}
    assert set(TERMINAL) == {"completed", "failed", "cancelled"}
    assert set(ACTIVE) | set(TERMINAL) == set(STATUSES)
    assert not set(ACTIVE) & set(TERMINAL)


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_terminal_statuses_are_terminal(status: str) -> None:
    assert is_terminal(status)


@pytest.mark.parametrize("status", ["working", "input_required", "bogus", ""])
def test_other_statuses_are_not_terminal(status: str) -> None:
    assert not is_terminal(status)


@pytest.mark.parametrize("target", ["completed", "failed", "cancelled"])
def test_every_terminal_status_is_reached_only_from_active_ones(target: Status) -> None:
    assert set(allowed_from(target)) == {"working", "input_required"}


def test_input_required_is_reached_only_from_working() -> None:
    assert allowed_from("input_required") == ("working",)


def test_working_is_reached_again_only_from_input_required() -> None:
    assert allowed_from("working") == ("input_required",)


@pytest.mark.parametrize("target", STATUSES)
def test_no_edge_leaves_a_terminal_state(target: Status) -> None:
    assert not set(allowed_from(target)) & set(TERMINAL)


@pytest.mark.parametrize("target", STATUSES)
def test_no_status_transitions_to_itself(target: Status) -> None:
    assert target not in allowed_from(target)


def test_database_check_constraint_names_exactly_the_lifecycle_statuses() -> None:
    assert set(re.findall(r"'([a-z_]+)'", STATUS_CHECK)) == set(STATUSES)


def test_sql_guards_come_from_the_edges() -> None:
    from mcp_celery_tasks.lifecycle import guard, sql_list

    assert sql_list(("working", "input_required")) == "('working', 'input_required')"
    assert guard("cancelled") == "status IN ('working', 'input_required')"
    assert guard("working", column="t.status") == "t.status IN ('input_required')"


def test_store_queries_use_the_lifecycle_guards() -> None:
    from mcp_celery_tasks.store import queries

    assert "status IN ('working', 'input_required')" in queries.CANCEL
    assert queries.TERMINAL_SQL == "('completed', 'failed', 'cancelled')"
    # No hand-written list of every status anywhere in the SQL: they come from lifecycle.
    for name in dir(queries):
        text = getattr(queries, name)
        if isinstance(text, str) and name.isupper():
            assert "'working', 'input_required', 'completed'" not in text
