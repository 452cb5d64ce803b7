"""What several bench scripts need from the machine: the shared harness's wrk scripts, and a
process's (or a process tree's) CPU time."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def lua_dir(script: str) -> Path:
    """shared/bench's wrk scripts (``../shared/bench`` beside the checkout, or ``BENCH_DIR``);
    exits with a message when ``script`` is not there."""
    lua = Path(os.environ.get("BENCH_DIR", ROOT.parent / "shared" / "bench")) / "mcpbench" / "lua"
    if not (lua / script).exists():
        raise SystemExit(f"no shared bench at {lua} (set BENCH_DIR)")
    return lua


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of one process, its threads included."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now."""
    return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
