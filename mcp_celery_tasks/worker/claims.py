"""Pool children tell their main process which job they claimed, the moment they claim it.

The watchdog (``watchdog``) stops a child whose job another worker took over. It must know that
the child claimed the job, and as which identity, without waiting for a tick to see the row as
the child's: a child frozen (SIGSTOP, a paused VM) or cut off from the database right after its
claim is otherwise never recognised when it comes back (issue 28). So the claim itself is told:
one line per claim and per end of a job (``C <pid> <job id> <identity>``, ``E <pid> <job id>``)
written by the child to a pipe the main process made before the pool forked. Each line is one
``write`` shorter than ``PIPE_BUF``, so lines from different children never interleave; the write
end is non-blocking, so a job never waits on its main process (a line that does not fit is
dropped, and the watchdog falls back to what its ticks see). The main process drains the pipe in
a thread of its own and at the start of every watchdog tick.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time

__all__ = ["ClaimBoard", "after_fork", "claimed", "ended", "open_board"]

_BATCH_S = 0.1
"""After a line arrives, the reader waits this long so one read takes the lines of many jobs."""

_BOARD: ClaimBoard | None = None


class ClaimBoard:
    """The main process's end: which job each child claimed, as which worker identity."""

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # shared by every child: a job never blocks on it
        os.set_blocking(self._read, False)
        self._claims: dict[int, tuple[str, str]] = {}
        self._partial = b""
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    # ---- the child's side ----------------------------------------------------------------------

    def send(self, line: str) -> None:
        if os.getpid() == self._owner:
            return  # a threads or solo pool: the jobs run in the main process, nobody to tell
        with contextlib.suppress(OSError):  # full (the main process is stopped): dropped
            os.write(self._write, line.encode())

    def close_read_end(self) -> None:
        """In a child: the read end is the main process's only."""
        with contextlib.suppress(OSError):
            os.close(self._read)

    # ---- the main process's side --------------------------------------------------------------

    def start_reader(self) -> None:
        """Keep the pipe drained between ticks (a busy pool writes two lines per job)."""
        if self._reader is None:
            self._reader = threading.Thread(target=self._loop, name="mcp-claims", daemon=True)
            self._reader.start()

    def _loop(self) -> None:
        # Batched: a busy pool writes two lines per job, and a wake-up per line cost the main
        # process ~0.14 ms per job (tests/bench/worker_drain.py). Every watchdog tick drains first
        # anyway; this only keeps the pipe (64 KiB, ~600 lines) from filling between ticks.
        while True:
            select.select([self._read], [], [], 1.0)
            time.sleep(_BATCH_S)
            self.drain()

    def drain(self) -> None:
        """Read every line written so far."""
        with self._lock:
            while True:
                try:
                    chunk = os.read(self._read, 65536)
                except BlockingIOError:
                    return
                if not chunk:
                    return
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                for line in lines:
                    self._take(line.decode(errors="replace").split(" "))

    def _take(self, fields: list[str]) -> None:
        if len(fields) == 4 and fields[0] == "C" and fields[1].isdigit():
            self._claims[int(fields[1])] = (fields[2], fields[3])
        elif len(fields) == 3 and fields[0] == "E" and fields[1].isdigit():
            pid = int(fields[1])
            if self._claims.get(pid, ("",))[0] == fields[2]:
                del self._claims[pid]

    def identity(self, pid: int, job_id: str) -> str | None:
        """The worker identity child ``pid`` claimed ``job_id`` as, if it said so and is still
        running it."""
        with self._lock:
            claim = self._claims.get(pid)
        return claim[1] if claim is not None and claim[0] == job_id else None

    def forget_the_dead(self) -> None:
        """Drop what children that died in a job said (a killed child sends no end; its pid may
        come back as another process's)."""
        with self._lock:
            for pid in [pid for pid in self._claims if not os.path.exists(f"/proc/{pid}")]:
                del self._claims[pid]


def open_board() -> ClaimBoard:
    """In a worker's main process, before its pool forks: the board its children write to."""
    global _BOARD
    if _BOARD is None or _BOARD._owner != os.getpid():
        _BOARD = ClaimBoard()
    return _BOARD


def after_fork() -> None:
    """In a new pool child."""
    if _BOARD is not None:
        _BOARD.close_read_end()


def claimed(job_id: str, identity: str) -> None:
    """This child just claimed ``job_id`` as ``identity`` (committed): tell the main process."""
    if _BOARD is not None:
        _BOARD.send(f"C {os.getpid()} {job_id} {identity}\n")


def ended(job_id: str) -> None:
    """This child is done with ``job_id`` (finished, given back, or never claimed)."""
    if _BOARD is not None:
        _BOARD.send(f"E {os.getpid()} {job_id}\n")
