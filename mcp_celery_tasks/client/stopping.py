"""SIGTERM and SIGHUP stop ``mcp-celery-tasks call`` the way Ctrl-C does.

Without this a ``call`` killed by a service manager, a CI runner's timeout or a closed terminal
dies at once and its task runs on for nobody, holding a worker slot.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["Stopped", "signals_stop"]


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (the terminal closed): handled exactly as Ctrl-C is."""


@contextmanager
def signals_stop() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``Stopped`` while ``call`` runs, so its task is cancelled (or,
    with ``--detach``, left running on purpose) rather than orphaned on a worker slot.

    A signal ignored when the process started (``nohup``) stays ignored. On SIGHUP the terminal
    is gone: what was written to it goes to /dev/null from then on, so the cancel still happens
    (a write to a hung-up terminal fails).
    """
    ttys = [fd for fd in (1, 2) if os.isatty(fd)]

    def stop(signum: int, frame: FrameType | None) -> None:
        if signum == getattr(signal, "SIGHUP", None):
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in ttys:
                os.dup2(devnull, fd)
            os.close(devnull)
        raise Stopped(signal.Signals(signum).name)

    installed: dict[int, Any] = {}
    for name in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
            installed[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in installed.items():
            signal.signal(signum, handler)
