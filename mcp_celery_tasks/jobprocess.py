"""What a pool child knows about itself: its worker identity, the job it runs right now, and the
signals it gets from outside the job (no Celery here).

- SIGUSR2 from the main process's watchdog: the running job passed its soft time limit.
- SIGTERM from a cold shutdown (a deploy): the running tool gets ``WorkerStopping`` so the runner
  can give its job back before the process dies as told (see ``runner`` on what an attempt is).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator

from mcp_celery_tasks.runtime import Runtime

__all__ = [
    "die_as_told",
    "in_job",
    "running_tool",
    "soft_limit_signal",
    "stop_requested",
    "stop_signal",
    "worker_identity",
]

_IDENTITY: str | None = None
_IDENTITY_PID: int | None = None

_CURRENT: Runtime | None = None
"""The runtime of the tool this process is running right now (one at a time in a pool child)."""
_IN_JOB = False
"""``JobRunner.run`` is under way in this process (claim, tool or outcome write)."""
_STOP_REQUESTED = False
"""This process was told to stop (SIGTERM from a cold shutdown)."""


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


def stop_requested() -> bool:
    """Whether this process was told to stop while (or before) it ran a job."""
    return _STOP_REQUESTED


def stop_signal(signum: int, frame: object) -> None:
    """The SIGTERM handler of a pool child: the worker is stopping (a deploy). A running tool gets
    ``WorkerStopping`` at once (or right after our own store call) so the runner can give its job
    back; during a claim or an outcome write the flag is enough (the caller dies once the job
    returns); with no job at all the process dies at once, as it would have."""
    global _STOP_REQUESTED
    _STOP_REQUESTED = True
    runtime = _CURRENT
    if runtime is not None:
        runtime.stop_signalled()
    elif not _IN_JOB:
        die_as_told()


def die_as_told() -> None:
    """End this process by the SIGTERM it was sent (the default action, as if never caught)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # the signal is delivered on the way out of os.kill; never reached
    os._exit(1)


def soft_limit_signal(signum: int, frame: object) -> None:
    """The SIGUSR2 handler of a pool child: the main process says the running job passed its soft
    time limit (the tool may never reach a ``ctx`` checkpoint)."""
    runtime = _CURRENT
    if runtime is not None:
        runtime.soft_limit_signalled()
