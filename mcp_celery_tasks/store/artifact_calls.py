"""Artifacts as store calls (``artifact_queries`` holds the SQL): the worker's fenced writes and
the orphan sweep (``ArtifactWrites``, mixed into ``WorkerStore``), the API's principal-scoped
reads (``ArtifactReads``, mixed into ``ApiStore``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import LiteralString

from mcp_celery_tasks.store import artifact_queries as q
from mcp_celery_tasks.store.artifact_queries import ArtifactRecord

__all__ = ["ArtifactReads", "ArtifactWrites", "HalfWritten", "NotOurs"]


class NotOurs(Exception):
    """A fenced artifact write found the task not this worker's (cancelled, finished, taken over)."""


class HalfWritten(LookupError):
    """The artifact exists but its upload has not completed (or never will)."""


class ArtifactWrites:
    """The worker's artifact calls; ``WorkerStore`` provides the connection."""

    def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # WorkerStore's

    def _execute(self, sql: LiteralString, params: Mapping[str, object]) -> int:
        raise NotImplementedError  # WorkerStore's

    def write_artifact(
        self, task_id: str, worker: str, name: str, mime_type: str, chunks: Iterable[bytes]
    ) -> tuple[str, int, str]:
        """Store ``chunks`` as a new artifact of the task, fenced by ``worker``: the row first
        (incomplete), each chunk its own statement (never the whole file in memory, never a long
        transaction), then the flip to complete with the size and sha256 computed on the way.
        Returns (artifact_id, size, sha256). ``NotOurs`` when a fence refuses: what was written
        stays incomplete (unreadable) until the orphan sweep removes it."""
        artifact_id = secrets.token_urlsafe(18)
        fence = {"task_id": task_id, "worker": worker, "artifact_id": artifact_id}
        if not self._fetch(q.CREATE_ARTIFACT, {**fence, "name": name, "mime_type": mime_type}):
            raise NotOurs(task_id)
        digest = hashlib.sha256()
        size = seq = 0
        for chunk in chunks:
            if not self._fetch(q.INSERT_CHUNK, {**fence, "seq": seq, "data": chunk}):
                raise NotOurs(task_id)
            digest.update(chunk)
            size, seq = size + len(chunk), seq + 1
        done = {**fence, "size": size, "sha256": digest.hexdigest(), "chunks": seq}
        if not self._fetch(q.COMPLETE_ARTIFACT, done):
            raise NotOurs(task_id)
        return artifact_id, size, digest.hexdigest()

    def delete_orphan_artifacts(self, limit: int) -> int:
        """Delete up to ``limit`` incomplete artifacts of terminal tasks older than
        ``artifact_queries.ORPHAN_AFTER`` (a job killed mid-upload), with their chunks."""
        return self._execute(q.DELETE_ORPHANS, {"limit": limit})


class ArtifactReads:
    """The API's artifact calls, scoped to the caller; ``ApiStore`` provides the connection."""

    async def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # ApiStore's

    async def artifact(self, artifact_id: str, owner: str) -> ArtifactRecord | None:
        """The complete artifact ``artifact_id`` of ``owner``; None when there is no such artifact
        (or it is another principal's); ``HalfWritten`` while its upload is incomplete."""
        rows = await self._fetch(q.ARTIFACT, {"artifact_id": artifact_id, "owner": owner})
        if not rows:
            return None
        row = dict(rows[0])
        if not row.pop("complete"):
            raise HalfWritten(artifact_id)
        return _record(row)

    async def artifact_bytes(self, record: ArtifactRecord) -> bytes:
        """The artifact's bytes, one chunk (one statement) at a time; the caller bounds the size."""
        parts: list[bytes] = []
        for seq in range(record.chunks):
            rows = await self._fetch(q.CHUNK, {"artifact_id": record.artifact_id, "seq": seq})
            if not rows:
                raise LookupError(f"artifact {record.artifact_id} lost chunk {seq} (its task was deleted)")
            parts.append(bytes(_as_bytes(rows[0]["data"])))
        return b"".join(parts)

    async def list_artifacts(
        self, owner: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[ArtifactRecord]:
        """``owner``'s complete artifacts, newest first, after the ``(created_at, artifact_id)`` cursor."""
        params = {"owner": owner, "limit": limit, "after_at": after[0] if after else None,
                  "after_id": after[1] if after else None}  # fmt: skip
        return [_record(dict(row)) for row in await self._fetch(q.LIST_ARTIFACTS, params)]


def _as_bytes(value: object) -> bytes | bytearray | memoryview:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"a chunk is bytea, not {type(value).__name__}")
    return value


def _record(row: Mapping[str, object]) -> ArtifactRecord:
    return ArtifactRecord(**row)  # type: ignore[arg-type]
