"""Durable steps and checkpoints as a tool author sees them (``ctx.step``, ``ctx.checkpoint``).

A task's job may run more than once: after a crash (the process killed, the OOM killer), a
deploy that gives it back, a redelivery, or a resume after a suspend. A *step* is a piece of work
whose JSON result is recorded in Postgres before ``ctx.step`` returns; every later run of the
same task gets the recorded result without running it again. A *checkpoint* is a named blob (a
model's weights and epoch counter) that each save replaces; a re-run loads it and carries on.

The rules a step must follow: steps run in the same order on every run (a run that meets them
in another order fails with ``StepOrderError``, never reuses a result silently); a step's side
effects are idempotent (a run killed after the work but before the record runs it again); its
result is JSON, at most ``max_step_result_bytes``. The worker's implementation is
``worker.steps.JobSteps``; no SQL here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any, Protocol, TypeVar

from mcp_celery_tasks.errors import ToolError

__all__ = ["NO_STEPS", "CheckpointData", "CheckpointInfo", "Checkpoints", "TaskSteps"]

T = TypeVar("T")

CheckpointData = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]
"""What ``checkpoint.save`` takes: the bytes, a file's path, or a binary file object (read from
its current position to the end, in chunks)."""


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A saved checkpoint: its ``size`` in bytes, its ``sha256`` (hex), where it is kept
    (``storage``: ``postgres`` or ``directory``) and when it was saved."""

    name: str
    size: int
    sha256: str
    storage: str
    saved_at: datetime | None


class Checkpoints(Protocol):
    """``ctx.checkpoint``: the task's named checkpoints; the latest save of a name wins."""

    def save(self, name: str, data: CheckpointData) -> CheckpointInfo:
        """Replace checkpoint ``name`` with ``data``, atomically: until the new one is complete
        and recorded, ``load`` returns the previous one, and a failed save (``CheckpointTooLarge``
        above ``max_checkpoint_bytes``, an unreadable file) leaves it intact."""
        ...

    def load(self, name: str) -> bytes | None:
        """The bytes of checkpoint ``name``, or None when this task never saved one."""
        ...

    def load_to(self, name: str, path: str | os.PathLike[str]) -> bool:
        """Stream checkpoint ``name`` into the file ``path`` (replaced atomically, never held
        in memory whole); False, leaving ``path`` alone, when there is none."""
        ...

    def info(self, name: str) -> CheckpointInfo | None:
        """Size, digest and time of checkpoint ``name`` without reading it; None if none."""
        ...

    def delete(self, name: str) -> bool:
        """Delete checkpoint ``name``; False if there was none."""
        ...


class TaskSteps(Protocol):
    """What a context's ``step`` and ``checkpoint`` stand on (one per job run)."""

    def step(
        self, name: str, fn: Callable[..., T], args: tuple[object, ...], kwargs: Mapping[str, object]
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` and record its result as step ``name``, or return the
        result a previous run recorded (checking that the step comes at the same position)."""
        ...

    @property
    def checkpoint(self) -> Checkpoints: ...


class _NoSteps:
    """The steps of a context that runs no task (built by hand in a test): every use says so."""

    def step(
        self, name: str, fn: Callable[..., T], args: tuple[object, ...], kwargs: Mapping[str, object]
    ) -> Any:
        raise self._refusal()

    @property
    def checkpoint(self) -> Checkpoints:
        raise self._refusal()

    @staticmethod
    def _refusal() -> ToolError:
        return ToolError(
            "durable steps need a task: ctx.step and ctx.checkpoint work in a tool run by a worker "
            "(or by mcp_celery_tasks.testing.run_tool)"
        )


NO_STEPS: TaskSteps = _NoSteps()
