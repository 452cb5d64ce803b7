"""``<data dir>/dev.json``: how other commands find the running ``mcp-celery-tasks dev`` stack.

``dev`` writes the record (its pid and start time, the database, broker and API URLs; readable
by the owner only) once Postgres and Redis are up, and removes it when it stops. The admin
commands, ``call`` and ``tools`` look for ``.mcp-tasks/dev.json`` in the current directory and
its parents when nothing else says where to connect. A record whose process is gone, or whose
pid now belongs to another program, is stale: it is ignored and deleted.

Standard library only: ``call`` and ``--help`` import this and must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "RECORD_NAME",
    "DevRecord",
    "alive",
    "announce",
    "find",
    "process_start",
    "read",
    "remove",
    "write",
]

RECORD_NAME = "dev.json"
DEFAULT_DATA_DIR = ".mcp-tasks"


@dataclass(frozen=True)
class DevRecord:
    pid: int
    started: str
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``), so a pid that
    was reused by another process after ``dev`` died is never mistaken for it."""
    data_dir: str
    database_url: str
    broker_url: str
    api_url: str

    @property
    def mcp_url(self) -> str:
        return self.api_url.rstrip("/") + "/mcp"


def process_start(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot), or None if there is no such
    process or it has exited (a zombie waiting to be reaped). The command name in field 2 may
    hold spaces and parentheses: split after the last ')'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _is_dev_process(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [arg.decode(errors="replace") for arg in argv]
    return "dev" in words and any("mcp_celery_tasks" in w or "mcp-celery-tasks" in w for w in words)


def alive(record: DevRecord) -> bool:
    """The process that wrote the record still runs (same pid, same start time, still ``dev``)."""
    return process_start(record.pid) == record.started and _is_dev_process(record.pid)


def write(data_dir: Path, record: DevRecord) -> Path:
    """Write the record atomically, readable by its owner only (it holds database credentials)."""
    path = data_dir / RECORD_NAME
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(record), out, indent=2)
    os.replace(tmp, path)
    return path


def remove(data_dir: Path, pid: int) -> None:
    """Delete the record if it is this process's (a newer ``dev`` may have replaced it)."""
    path = data_dir / RECORD_NAME
    with contextlib.suppress(OSError, ValueError, TypeError):
        if json.loads(path.read_text())["pid"] == pid:
            path.unlink()


def _ours(path: Path) -> bool:
    """Written by this user and writable by nobody else: a record planted in a shared parent
    folder (``/tmp/.mcp-tasks/dev.json``) must never send our commands, or our token, elsewhere."""
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _owned_by_us(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}").stat().st_uid == os.getuid()
    except OSError:
        return False


def read(path: Path) -> DevRecord | None:
    """The record at ``path`` if it is this user's and its ``dev`` still runs (as this user,
    serving on loopback); a stale record is deleted."""
    if not _ours(path):
        return None
    try:
        record = DevRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        return None  # unreadable or of another version: not ours to delete
    if not record.api_url.startswith("http://127.0.0.1:"):
        return None  # dev only ever binds loopback
    if alive(record) and _owned_by_us(record.pid):
        return record
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def find(start: Path | None = None) -> DevRecord | None:
    """The running dev stack's record in ``.mcp-tasks/`` of ``start`` (default: the current
    directory) or of its nearest parent that has one."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / DEFAULT_DATA_DIR / RECORD_NAME
        if candidate.exists():
            found = read(candidate)
            if found is not None:
                return found
    return None


def announce(record: DevRecord, what: str) -> None:
    """Say on stderr which stack a command uses, so nobody wonders which database they see."""
    print(f"using the dev stack of {record.data_dir} (pid {record.pid}) for {what}", file=sys.stderr)
