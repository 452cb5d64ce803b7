"""What a pool child knows about itself: its worker identity, the job it runs right now, and the
signals it gets from outside the job (no Celery here).

- SIGUSR2 from the main process's watchdog: the running job passed its soft time limit
  (``SOFT_LIMIT_SIGNAL``; billiard keeps SIGUSR1 for Celery's own soft time limits). The child
  listens from its fork on (``after_fork``); the main process sends it with
  ``signal_soft_limit``.
- The pool's termination signal from a cold shutdown (a deploy): SIGTERM, or SIGQUIT under
  ``REMAP_SIGTERM=SIGQUIT``. The running tool gets ``WorkerStopping`` so the runner can give its
  job back; then the handler the pool had installed for that signal runs, and the process ends
  exactly as it would have (see ``runner`` on what an attempt is).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final

from mcp_celery_tasks.worker.runtime import Runtime

__all__ = [
    "SOFT_LIMIT_SIGNAL",
    "after_fork",
    "catch_stop_signal",
    "die_as_told",
    "in_job",
    "running_tool",
    "signal_soft_limit",
    "soft_limit_signal",
    "stop_requested",
    "stop_signal",
    "worker_identity",
]

SOFT_LIMIT_SIGNAL: Final = signal.SIGUSR2
"""From the main process's watchdog to a child: its job passed its soft time limit."""

_IDENTITY: str | None = None
_IDENTITY_PID: int | None = None

_CURRENT: Runtime | None = None
"""The runtime of the tool this process is running right now (one at a time in a pool child)."""
_IN_JOB = False
"""``JobRunner.run`` is under way in this process (claim, tool or outcome write)."""
_STOP_REQUESTED = False
"""This process was told to stop (its pool's termination signal, a cold shutdown)."""
_STOP_SIGNUM: int | None = None
_HANDED_OVER: dict[int, Any] = {}
"""The handler each caught signal had before ours (the pool's): it runs once the job is given back."""
_CAUGHT_IN: int | None = None  # the pid whose handlers these are


def catch_stop_signal(signum: int) -> None:
    """Install ``stop_signal`` for ``signum`` in this process, once; the handler it replaces runs
    after it. Called when a job starts: the pool sets its own handlers after the child's
    initializers run, so an earlier install would be overwritten."""
    global _CAUGHT_IN
    if os.getpid() == _CAUGHT_IN and signum in _HANDED_OVER:
        return
    if os.getpid() != _CAUGHT_IN:
        _HANDED_OVER.clear()
        _CAUGHT_IN = os.getpid()
    previous = signal.getsignal(signum)
    if previous == signal.SIG_IGN or previous is stop_signal:
        return  # ignored on purpose (REMAP_SIGTERM) or ours already
    _HANDED_OVER[signum] = previous
    signal.signal(signum, stop_signal)


def worker_identity() -> str:
    """``host:pid:nonce`` for this process; a new nonce after a fork."""
    global _IDENTITY, _IDENTITY_PID
    if _IDENTITY is None or os.getpid() != _IDENTITY_PID:
        _IDENTITY_PID = os.getpid()
        _IDENTITY = f"{socket.gethostname()}:{_IDENTITY_PID}:{uuid.uuid4().hex[:8]}"
    return _IDENTITY


@contextlib.contextmanager
def in_job() -> Iterator[None]:
    """Around a whole job: a stop signalled meanwhile waits for it to end."""
    global _IN_JOB
    _IN_JOB = True
    try:
        yield
    finally:
        _IN_JOB = False


@contextlib.contextmanager
def running_tool(runtime: Runtime) -> Iterator[None]:
    """Around the tool call: signals reach ``runtime``. A stop that came before the tool began
    is raised at once (``WorkerStopping``)."""
    global _CURRENT
    _CURRENT = runtime
    try:
        if _STOP_REQUESTED:
            runtime.stop_signalled()
        yield
    finally:
        _CURRENT = None
        runtime.tool_done()


def stop_requested() -> bool:
    """Whether this process was told to stop while (or before) it ran a job."""
    return _STOP_REQUESTED


def stop_signal(signum: int, frame: Any) -> None:
    """A pool child's termination handler: the worker is stopping (a deploy). A running tool gets
    ``WorkerStopping`` at once (or right after our own store call) so the runner can give its job
    back; during a claim or an outcome write the flag is enough (the caller ends the process once
    the job returns); with no job at all the process ends at once, as it would have."""
    global _STOP_REQUESTED, _STOP_SIGNUM
    _STOP_REQUESTED = True
    _STOP_SIGNUM = signum
    runtime = _CURRENT
    if runtime is not None:
        runtime.stop_signalled()
    elif not _IN_JOB:
        die_as_told(frame)


def die_as_told(frame: Any = None) -> None:
    """End this process the way the signal it was sent would have: the pool's own handler (it
    marks the exit as the worker's, not the job's), or the default action."""
    signum = _STOP_SIGNUM or signal.SIGTERM
    previous: Callable[[int, Any], Any] | int | None = _HANDED_OVER.get(signum)
    if callable(previous):
        previous(signum, frame)  # billiard's: raises SystemExit after marking the shutdown
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(60)  # the signal is delivered on the way out of os.kill; never reached
    os._exit(1)


def soft_limit_signal(signum: int, frame: object) -> None:
    """The SIGUSR2 handler of a pool child: the main process says the running job passed its soft
    time limit (the tool may never reach a ``ctx`` checkpoint)."""
    runtime = _CURRENT
    if runtime is not None:
        runtime.soft_limit_signalled()


def after_fork() -> None:
    """In a new pool child: listen for the watchdog's soft-limit signal. (The stop signal is
    caught per job, ``catch_stop_signal``: the pool sets its handlers after this runs.)"""
    signal.signal(SOFT_LIMIT_SIGNAL, soft_limit_signal)


def signal_soft_limit(pid: int) -> None:
    """From the main process: tell child ``pid`` its job passed its soft time limit (a child
    already gone is no one to tell)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, SOFT_LIMIT_SIGNAL)
