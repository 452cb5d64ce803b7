"""The CLI starts light: ``--help`` and ``call`` import none of the server's heavy libraries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT, free_port

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

# Runs the CLI in a fresh interpreter the way the console script does, then reports which heavy
# modules that run imported.
PROBE = """
import json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["mcp-celery-tasks", *json.loads(sys.argv[1])]
from mcp_celery_tasks.cli.commands import main
try:
    main()
except BaseException:  # the modules loaded are the point here, not how the command ended
    pass
print("\\nLOADED=" + json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(heavy))))
"""


def _loaded(*argv: str) -> list[str]:
    ran = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    marker = ran.stdout.rsplit("LOADED=", 1)
    assert len(marker) == 2, ran.stdout + ran.stderr
    return list(json.loads(marker[1]))


def test_importing_the_cli_loads_no_heavy_library() -> None:
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; import mcp_celery_tasks.cli.commands; "
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []


@pytest.mark.parametrize(
    "argv", [("--help",), ("call", "--help"), ("tools", "--help"), ("tasks", "--help")], ids=" ".join
)
def test_help_loads_no_heavy_library(argv: tuple[str, ...]) -> None:
    assert _loaded(*argv) == []


def test_call_reaches_its_first_request_without_a_heavy_library() -> None:
    # Nothing listens on the port: the call runs its whole start-up, then fails to connect.
    url = f"http://127.0.0.1:{free_port()}/mcp"
    assert _loaded("call", "noop", "--url", url, "--json") == []
    assert _loaded("tools", "--url", url) == []
