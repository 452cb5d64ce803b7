"""A job run's durable steps and checkpoints (``ctx.step``, ``ctx.checkpoint``). No Celery here.

``JobSteps`` is made per job run. Steps are numbered in call order; the first ``ctx.step`` reads
the task's recorded index (seq, name) once, and each step then either replays its recorded
result (one query) or runs and records it, fenced by the lease (``store.step_queries``). A name
met at another position than recorded, or another name at a recorded position, fails the run
with ``StepOrderError``: reusing a result for different code would be silent corruption.

Checkpoints (``ctx.checkpoint``) are ``worker.checkpoints``; they share the store calls' rules.

Store calls ride out an outage for the outage budget (``transient.ride_out``); a write the fence
refuses means the task is no longer ours: ``TaskCancelled``, as the runtime says it elsewhere.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from mcp_celery_tasks.errors import (
    StepOrderError,
    StepResultError,
    WorkerStopping,
)
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.step_queries import StepWrite
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.tools.steps import Checkpoints
from mcp_celery_tasks.transient import OutageTooLong, ride_out
from mcp_celery_tasks.worker.checkpoints import CheckpointRows, JobCheckpoints, checked_name, not_ours

__all__ = ["JobSteps", "StepStore"]

logger = logging.getLogger("mcp_celery_tasks.steps")

T = TypeVar("T")


class StepStore(CheckpointRows, Protocol):
    """The store calls of steps and checkpoints (``WorkerStore``, ``MemoryStore``)."""

    def step_index(self, task_id: str) -> list[tuple[int, str]]: ...

    def step_result(self, task_id: str, seq: int) -> JSONValue: ...

    def record_step(self, task_id: str, worker: str, seq: int, name: str, result: str) -> StepWrite: ...


class JobSteps:
    """One job run's steps and checkpoints (``tools.steps.TaskSteps``)."""

    def __init__(
        self,
        store: StepStore,
        settings: Settings,
        *,
        task_id: str,
        job_id: str,
        tool_name: str,
        worker: str,
        stopping: Callable[[], bool] = lambda: False,
        replayed: Callable[[], None] = lambda: None,
        new_work: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._replayed = replayed  # a re-run passed recorded work (the runtime times the redo)
        self._new_work = new_work  # a re-run reached work no earlier run recorded
        self._task_id = task_id
        self._tool = tool_name
        self._worker = worker
        self._max_result = settings.max_step_result_bytes
        self._budget_s = settings.outage_budget_seconds
        self._stopping = stopping
        self._index: dict[str, int] | None = None
        self._names: dict[int, str] = {}
        self._seq = 0
        self._inside: str | None = None
        self._checkpoints = JobCheckpoints(
            self._call, store, settings, task_id=task_id, job_id=job_id, tool_name=tool_name, worker=worker
        )

    @property
    def checkpoint(self) -> Checkpoints:
        return self._checkpoints

    def step(
        self, name: str, fn: Callable[..., T], args: tuple[object, ...], kwargs: Mapping[str, object]
    ) -> Any:
        checked_name(name, "step")
        if self._inside is not None:
            raise ValueError(
                f"step {name!r} was started inside step {self._inside!r}: steps cannot be nested"
            )
        self._seq += 1
        seq = self._seq
        index = self._recorded()
        recorded_at = index.get(name)
        if recorded_at is not None and recorded_at != seq:
            raise StepOrderError(
                f"step {name!r} was recorded as step {recorded_at} but this run reached it as step {seq}: "
                "steps must run in the same order on every run"
            )
        if recorded_at is None and seq in self._names:
            raise StepOrderError(
                f"step {seq} was recorded as {self._names[seq]!r} but this run reached {name!r} there: "
                "steps must run in the same order on every run"
            )
        if recorded_at is not None:
            recorded = self._call(
                lambda: self._store.step_result(self._task_id, seq), f"replaying step {name!r}"
            )
            metrics.steps_replayed.labels(self._tool).inc()
            self._replayed()
            return recorded
        self._new_work()
        self._inside = name
        try:
            value = fn(*args, **kwargs)
        finally:
            self._inside = None
        text = self._encoded(name, value)
        written = self._call(
            lambda: self._store.record_step(self._task_id, self._worker, seq, name, text),
            f"recording step {name!r}",
        )
        if written is False:
            raise not_ours()
        if written is None:
            raise StepOrderError(f"step {seq} ({name!r}) was recorded by another run meanwhile")
        index[name], self._names[seq] = seq, name
        metrics.steps_run.labels(self._tool).inc()
        return json.loads(text)

    def _recorded(self) -> dict[str, int]:
        if self._index is None:
            rows = self._call(lambda: self._store.step_index(self._task_id), "reading the recorded steps")
            self._index = {name: seq for seq, name in rows}
            self._names = {seq: name for seq, name in rows}
        return self._index

    def _encoded(self, name: str, value: Any) -> str:
        try:
            text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise StepResultError(
                f"step {name!r} returned a result that is not JSON ({exc}): return plain data "
                "(dicts, lists, strings, numbers, booleans, None), or save bytes with ctx.checkpoint"
            ) from None
        size = len(text.encode())
        if size > self._max_result:
            raise StepResultError(
                f"step {name!r} returned {size} bytes of JSON, more than the limit of {self._max_result} "
                "(max_step_result_bytes): save large data with ctx.checkpoint"
            )
        return text

    def _call(self, call: Callable[[], T], what: str) -> T:
        try:
            return ride_out(call, budget_s=self._budget_s, what=what, stop=self._stopping)
        except OutageTooLong:
            if self._stopping():
                raise WorkerStopping("the worker is stopping") from None
            raise
