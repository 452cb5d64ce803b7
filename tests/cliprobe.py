"""One fresh interpreter for several checks that would each start one: help screens rendered in a
row, or the modules loaded after each of several steps. Starting the package costs about a second
of CPU per interpreter; the checks themselves cost milliseconds."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tests.support import ROOT

_SCREENS = """
import contextlib, io, json, os, sys
from mcp_celery_tasks.cli.commands import main
shown = []
for argv, env in json.loads(sys.stdin.read()):
    os.environ.clear()
    os.environ.update(env)  # read per screen: rich sizes each help console from COLUMNS
    sys.argv = ["mcp-celery-tasks", *argv]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    shown.append([code, out.getvalue(), err.getvalue()])
print("\\nSCREENS=" + json.dumps(shown))
"""

_STEPS = """
import json, sys
watched = set(json.loads(sys.argv[1]))
namespace = {"__name__": "__probe__"}
loaded = []
for step in json.loads(sys.stdin.read()):
    exec(step, namespace)
    loaded.append(sorted({m.split(".")[0] for m in sys.modules} & watched))
print("\\nLOADED=" + json.dumps(loaded))
"""


@dataclass(frozen=True)
class Screen:
    code: int
    stdout: str
    stderr: str


def help_screens(screens: Sequence[tuple[Sequence[str], Mapping[str, str]]]) -> list[Screen]:
    """Run ``mcp-celery-tasks ARGV`` for each (argv, environment) in one interpreter, as the
    console script does, and return each run's exit code and output."""
    ran = subprocess.run(
        [sys.executable, "-c", _SCREENS],
        input=json.dumps([[list(argv), dict(env)] for argv, env in screens]),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    marker = ran.stdout.rsplit("SCREENS=", 1)
    assert len(marker) == 2, ran.stdout + ran.stderr
    return [Screen(code, out, err) for code, out, err in json.loads(marker[1])]


def loaded_after_each(steps: Sequence[str], watched: Sequence[str]) -> list[list[str]]:
    """Run the Python ``steps`` one after another in one fresh interpreter (sharing one namespace;
    an exception fails the run); after each, the
    ``watched`` top-level packages loaded so far (so far: ``sys.modules`` only grows, so the list
    after step N is what steps 1..N loaded together)."""
    ran = subprocess.run(
        [sys.executable, "-c", _STEPS, json.dumps(list(watched))],
        input=json.dumps(list(steps)),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    marker = ran.stdout.rsplit("LOADED=", 1)
    assert len(marker) == 2, ran.stdout + ran.stderr
    loaded: list[list[str]] = json.loads(marker[1])
    assert len(loaded) == len(steps), ran.stdout + ran.stderr
    return loaded
