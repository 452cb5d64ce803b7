"""Durable steps and checkpoints in memory: the ``MemoryStore`` half of ``store.step_queries``.

Same guards as the SQL: every write is fenced by the task being active and held by the writer;
a checkpoint save consumes its chunks first and changes nothing when they fail (a size cap) or
the task is not ours. Held to ``WorkerStore`` by the contract suite.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from mcp_celery_tasks.errors import ArtifactRefused
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.store.artifact_calls import NO_LIMITS, ArtifactLimits, NotOurs
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from mcp_celery_tasks.store.step_queries import CHUNK_BYTES, CheckpointRecord, StepWrite

__all__ = ["MemorySteps", "TaskDurables"]


@dataclass
class TaskDurables:
    """One task's recorded steps (``seq -> (name, JSON text)``) and checkpoints."""

    steps: dict[int, tuple[str, str]] = field(default_factory=dict)
    checkpoints: dict[str, CheckpointRecord] = field(default_factory=dict)
    chunks: dict[tuple[str, str], list[bytes]] = field(default_factory=dict)
    """(name, generation) -> the bytes of a checkpoint kept in "Postgres"."""
    artifacts: dict[str, tuple[str, str, bytes]] = field(default_factory=dict)
    """artifact_id -> (name, mime type, bytes) of the task's complete artifacts."""


class MemorySteps:
    """The step and checkpoint methods of ``MemoryStore`` (a base class of it)."""

    durables: dict[str, TaskDurables]

    def _call(self, method: str) -> None:
        raise NotImplementedError

    def _mine(self, task_id: str, worker: str) -> Any:
        raise NotImplementedError

    def _durables(self, task_id: str) -> TaskDurables:
        return self.durables.setdefault(task_id, TaskDurables())

    def step_index(self, task_id: str) -> list[tuple[int, str]]:
        self._call("step_index")
        steps = self._durables(task_id).steps
        return [(seq, steps[seq][0]) for seq in sorted(steps)]

    def step_result(self, task_id: str, seq: int) -> JSONValue:
        self._call("step_result")
        found = self._durables(task_id).steps.get(seq)
        if found is None:
            raise LookupError(f"no step {seq} is recorded")
        decoded: JSONValue = json.loads(found[1])
        return decoded

    def record_step(self, task_id: str, worker: str, seq: int, name: str, result: str) -> StepWrite:
        self._call("record_step")
        if self._mine(task_id, worker) is None:
            return False
        steps = self._durables(task_id).steps
        if seq in steps or any(recorded == name for recorded, _ in steps.values()):
            return None  # ON CONFLICT DO NOTHING
        steps[seq] = (name, result)
        return True

    def write_artifact(
        self,
        task_id: str,
        worker: str,
        name: str,
        mime_type: str,
        chunks: Iterable[bytes],
        *,
        limits: ArtifactLimits = NO_LIMITS,
        directory: ArtifactDirectory | None = None,
    ) -> tuple[str, int, str]:
        """In memory whatever ``directory`` says; ``limits.max_bytes`` holds (no quota here)."""
        self._call("write_artifact")
        if self._mine(task_id, worker) is None:
            raise NotOurs(task_id)
        data = b"".join(bytes(chunk) for chunk in chunks)
        if len(data) > limits.max_bytes:
            raise ArtifactRefused(
                f"artifact {name!r} is larger than the limit of {limits.max_bytes} bytes per artifact "
                "(max_artifact_bytes): nothing of it was kept",
                "max_artifact_bytes",
            )
        artifact_id = secrets.token_urlsafe(18)
        self._durables(task_id).artifacts[artifact_id] = (name, mime_type, data)
        return artifact_id, len(data), hashlib.sha256(data).hexdigest()

    def save_checkpoint(
        self, task_id: str, worker: str, name: str, generation: str, chunks: Iterable[bytes]
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        self._call("save_checkpoint")
        kept = [bytes(chunk) for chunk in chunks]  # a failing source raises here: nothing changed
        data = b"".join(kept)
        record = CheckpointRecord(
            name, generation, "postgres", len(data), hashlib.sha256(data).hexdigest(), len(kept), None
        )
        flipped = self._flip(task_id, worker, record)
        if flipped is not None:
            self._durables(task_id).chunks[(name, generation)] = kept
        return flipped

    def record_checkpoint(
        self, task_id: str, worker: str, record: CheckpointRecord
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        self._call("record_checkpoint")
        return self._flip(task_id, worker, record)

    def checkpoint(self, task_id: str, name: str) -> CheckpointRecord | None:
        self._call("checkpoint")
        return self._durables(task_id).checkpoints.get(name)

    def checkpoint_chunks(self, task_id: str, record: CheckpointRecord) -> Iterator[bytes]:
        kept = self._durables(task_id).chunks.get((record.name, record.generation))
        if kept is None:
            raise LookupError(f"checkpoint {record.name!r} lost its chunks (it was replaced meanwhile)")
        for chunk in kept:
            yield from (chunk[at : at + CHUNK_BYTES] for at in range(0, len(chunk), CHUNK_BYTES))

    def delete_checkpoint(self, task_id: str, worker: str, name: str) -> CheckpointRecord | bool | None:
        self._call("delete_checkpoint")
        if self._mine(task_id, worker) is None:
            return False
        durables = self._durables(task_id)
        gone = durables.checkpoints.pop(name, None)
        durables.chunks = {key: kept for key, kept in durables.chunks.items() if key[0] != name}
        return gone

    def _flip(
        self, task_id: str, worker: str, record: CheckpointRecord
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        if self._mine(task_id, worker) is None:
            return None
        durables = self._durables(task_id)
        previous = durables.checkpoints.get(record.name)
        saved = replace(record, saved_at=datetime.now(UTC))
        durables.checkpoints[record.name] = saved
        durables.chunks = {
            key: kept
            for key, kept in durables.chunks.items()
            if key[0] != record.name or key[1] == record.generation
        }
        return saved, previous
