"""The CLI starts light: ``--help`` and ``call`` import none of the server's heavy libraries."""

from __future__ import annotations

import pytest

from tests import cliprobe
from tests.support import free_port

HEAVY = (
    "alembic",
    "sqlalchemy",
    "mcp_types",
    "celery",
    "kombu",
    "psycopg",
    "fastapi",
    "pydantic_settings",
)
"""The server's libraries (pydantic itself is not among them: typer parses options with it)."""

HELP = [("--help",), ("call", "--help"), ("tools", "--help"), ("tasks", "--help")]
# Nothing listens on the port: each call runs its whole start-up, then fails to connect.
_URL = f"http://127.0.0.1:{free_port()}/mcp"
CALLS = [("call", "noop", "--url", _URL, "--json"), ("tools", "--url", _URL)]


def _run(argv: tuple[str, ...]) -> str:
    """A step that runs the CLI the way the console script does, however the command ends (the
    modules it loaded are the point here)."""
    return (
        f"sys.argv = ['mcp-celery-tasks', *{list(argv)!r}]\ntry:\n    main()\nexcept BaseException:\n    pass"
    )


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """What each step had loaded, all in one fresh interpreter: first the import, then every
    command in turn. ``sys.modules`` only grows, so a step that shows nothing loaded nothing, and
    a heavy import is blamed on the first step that made it."""
    steps = ["import sys\nfrom mcp_celery_tasks.cli.commands import main", *map(_run, HELP + CALLS)]
    names = ["import", *(" ".join(argv) for argv in HELP + CALLS)]
    return dict(zip(names, cliprobe.loaded_after_each(steps, HEAVY), strict=True))


def test_importing_the_cli_loads_no_heavy_library(loaded: dict[str, list[str]]) -> None:
    assert loaded["import"] == []


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_help_loads_no_heavy_library(loaded: dict[str, list[str]], argv: tuple[str, ...]) -> None:
    assert loaded[" ".join(argv)] == []


def test_call_reaches_its_first_request_without_a_heavy_library(loaded: dict[str, list[str]]) -> None:
    for argv in CALLS:
        assert loaded[" ".join(argv)] == [], argv
