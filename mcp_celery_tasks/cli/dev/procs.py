"""``dev``'s child processes: started so they die with ``dev``, stopped group by group.

Each child runs in a process group of its own (a worker's pool processes with it), so a
terminal's Ctrl-C reaches ``dev`` only and ``dev`` decides the order. Each also asks the kernel
for its own stop signal should ``dev`` die without stopping it (``PR_SET_PDEATHSIG``): a worker
gets SIGQUIT like on a normal stop, the others SIGTERM.

The stop signal goes to a child's own process, never to its group: a worker's main process
stops its pool children itself, after the soft-shutdown window, with the pool's termination
signal, which is what lets a child give its running job back (``worker.child``). A SIGQUIT sent
to the pool children as well would end them at once through billiard's handler, the job's
lease still held and its attempt counted. The group is what ``dev`` waits for, and what it
kills when the grace period is over.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["Child", "DataDirBusy", "hold_data_dir", "spawn", "stop_all", "to_log_file"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent(stop_signal: int) -> Callable[[], None]:
    def preexec() -> None:
        with contextlib.suppress(Exception):  # Linux only; elsewhere the keeper still stops services
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, stop_signal)

    return preexec


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    stop_signal: int

    @property
    def pgid(self) -> int:
        return self.proc.pid  # the leader of its own session

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if self.proc.poll() is None:
            return True
        # The leader is reaped; the group lives while any member is not a zombie.
        return any(_in_group(pid, self.pgid) for pid in _pids())


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _in_group(pid: int, pgid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


def spawn(name: str, args: list[str], env: dict[str, str], log_dir: Path, stop_signal: int) -> Child:
    with (log_dir / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(stop_signal),
        )
    return Child(name, proc, stop_signal)


def stop_all(children: list[Child], grace: float, say: Callable[[str], None]) -> None:
    """Send each child (its own process only) its stop signal, then wait for every process of its
    group; SIGKILL the groups still there after ``grace`` seconds."""
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            child.proc.send_signal(child.stop_signal)  # not to a pid already reaped
    deadline = time.monotonic() + grace
    waiting = list(children)
    announced = False
    while waiting and time.monotonic() < deadline:
        for child in children:
            child.proc.poll()
        waiting = [child for child in waiting if child.group_alive()]
        if waiting and not announced and time.monotonic() > deadline - grace + 2:
            say(f"waiting for {', '.join(child.name for child in waiting)} to stop")
            announced = True
        time.sleep(0.1)
    for child in waiting:
        say(f"{child.name} did not stop within {grace:g} s: killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pgid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(5)


class DataDirBusy(Exception):
    """Another ``dev`` holds this data dir."""


def hold_data_dir(data_dir: Path) -> IO[str]:
    """Lock ``data_dir`` for this process's lifetime (the kernel drops the lock when it exits,
    however); raise DataDirBusy if another ``dev`` holds it."""
    lock = (data_dir / "dev.lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise DataDirBusy(str(data_dir)) from None
    return lock


def to_log_file(path: Path) -> None:
    """Send this process's remaining output to ``path`` (its terminal is gone after a SIGHUP;
    writing there would fail)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
