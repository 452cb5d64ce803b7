"""Help screens say what to type (metavars), never Python type tags such as ``<bool>``."""

from __future__ import annotations

import os
import re

import pytest

from tests import cliprobe

SCREENS = [
    ("tasks",), ("tasks", "ls"), ("tasks", "show"), ("tasks", "cancel"), ("tasks", "purge"), ("tasks", "top"),
    ("tasks", "limits"), ("tasks", "limits", "ls"), ("tasks", "limits", "set"), ("tasks", "limits", "clear"),
    ("tasks", "limits", "history"), ("tasks", "limits", "tool"), ("tasks", "limits", "tool", "set"),
]  # fmt: skip


@pytest.fixture(scope="module")
def shown() -> dict[tuple[str, ...], cliprobe.Screen]:
    """Every screen here, rendered in one interpreter (120 columns; the exit codes at 200)."""
    wide = [*SCREENS, ("tasks",)]
    envs = [{**os.environ, "COLUMNS": "120"}] * len(SCREENS) + [{**os.environ, "COLUMNS": "200"}]
    screens = cliprobe.help_screens([((*argv, "--help"), env) for argv, env in zip(wide, envs, strict=True)])
    return {**dict(zip(SCREENS, screens[:-1], strict=True)), ("tasks", "@200"): screens[-1]}


@pytest.mark.parametrize("argv", SCREENS, ids=" ".join)
def test_admin_help_screens_have_no_type_tags(
    shown: dict[tuple[str, ...], cliprobe.Screen], argv: tuple[str, ...]
) -> None:
    screen = shown[argv]
    assert screen.code == 0, screen.stderr
    assert re.search(r"<(bool|str|int|float|text|integer|list\[str\])>", screen.stdout) is None, screen.stdout


def test_tasks_help_gives_the_exit_codes(shown: dict[tuple[str, ...], cliprobe.Screen]) -> None:
    text = " ".join(shown["tasks", "@200"].stdout.split())
    assert "Exit codes: 0 done; 1 no such task" in text and "3 the database cannot be used" in text
