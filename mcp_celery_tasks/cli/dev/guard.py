"""The dev stack's keeper: stops what ``dev`` leaves behind if ``dev`` itself is killed.

``dev``'s children die with it (the kernel sends each its stop signal, ``PR_SET_PDEATHSIG``),
but the embedded Redis and Postgres are servers in sessions of their own, and ``kill -9 dev``
runs none of its clean-up. So ``dev`` starts this small process in a session of its own and
holds the write end of a pipe to it; when the pipe closes (``dev`` exited, however) the keeper
waits for the children's process groups to end, then stops Redis, then Postgres, and deletes
``dev.json``. After a clean stop there is nothing left for it to do.

What it is told goes through the pipe as JSON lines: ``{"groups": [pgid, ...]}`` and
``{"service": name, "pid": pid, "started": ticks, "signal": signum, "force": signum}``. A process
is stopped only if its pid still has the start time it had when announced (pids are reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict

from mcp_celery_tasks.cli.dev import record as devrecord

__all__ = ["Guard", "start_guard"]

GROUP_GRACE_S = 15.0
SERVICE_GRACE_S = 20.0


class GroupsMessage(TypedDict):
    """``dev``'s process groups (its workers, beat, the API): killed if ``dev`` dies."""

    groups: list[int]


class ServiceMessage(TypedDict):
    """One service ``dev`` started (Postgres, Redis): stopped with ``signal``, then ``force``."""

    service: str
    pid: int
    started: str
    """The process's start time (``record.process_start``): a reused pid is not it."""
    signal: int
    force: int


@dataclass
class Guard:
    """``dev``'s end of the pipe."""

    proc: subprocess.Popen[bytes]
    pipe: IO[bytes]

    def tell(self, message: GroupsMessage | ServiceMessage) -> None:
        with contextlib.suppress(OSError):
            self.pipe.write(json.dumps(message).encode() + b"\n")
            self.pipe.flush()

    def service(self, name: str, pid: int | None, stop_signal: int, force_signal: int) -> None:
        started = devrecord.process_start(pid) if pid else None
        if pid and started:
            self.tell(
                {
                    "service": name,
                    "pid": pid,
                    "started": started,
                    "signal": stop_signal,
                    "force": force_signal,
                }
            )

    def groups(self, pgids: list[int]) -> None:
        self.tell({"groups": pgids})

    def release(self) -> None:
        """Everything is stopped: close the pipe and let the keeper exit."""
        with contextlib.suppress(OSError):
            self.pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def start_guard(data_dir: Path, log: Path, lock_fd: int) -> Guard:
    """Start the keeper; it keeps ``lock_fd`` (the data dir's flock) open until it exits."""
    read_end, write_end = os.pipe()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcp_celery_tasks.cli.dev.guard", str(data_dir), str(os.getpid())],
            stdin=read_end,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no terminal's SIGHUP or Ctrl-C reaches it
            pass_fds=(lock_fd,),
        )
    os.close(read_end)
    return Guard(proc, os.fdopen(write_end, "wb"))


def _alive(pid: int, started: str) -> bool:
    return devrecord.process_start(pid) == started


def _wait_gone(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return True
        time.sleep(0.1)
    return not check()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} devguard: {message}", flush=True)


def keep(data_dir: Path, dev_pid: int, messages: IO[bytes]) -> None:
    groups: list[int] = []
    services: list[ServiceMessage] = []
    for line in messages:  # until dev exits and the pipe closes
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if "groups" in message:
                groups = [int(g) for g in message["groups"]]
            elif "service" in message:
                services.append(message)
    left = [g for g in groups if _group_alive(g)]
    live = [s for s in services if _alive(s["pid"], s["started"])]
    if not left and not live:
        return  # dev stopped everything itself
    _say(f"dev (pid {dev_pid}) is gone; stopping what it left")
    if left and not _wait_gone(lambda: any(_group_alive(g) for g in left), GROUP_GRACE_S):
        for pgid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
    # Redis first: workers are gone, nothing writes to it; then Postgres.
    for service in sorted(live, key=lambda s: s["service"] != "redis"):
        pid, started = service["pid"], service["started"]
        _say(f"stopping {service['service']} (pid {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, service["signal"])
        if not _wait_gone(lambda pid=pid, started=started: _alive(pid, started), SERVICE_GRACE_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, service["force"])
    devrecord.remove(data_dir, dev_pid)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    keep(Path(sys.argv[1]), int(sys.argv[2]), sys.stdin.buffer)


if __name__ == "__main__":
    main()
