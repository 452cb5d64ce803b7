"""Artifacts as store calls (``artifact_queries`` holds the SQL): the worker's fenced writes and
the orphan sweep (``ArtifactWrites``, mixed into ``WorkerStore``), the API's principal-scoped
reads (``ArtifactReads``, mixed into ``ApiStore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, LiteralString, Protocol

from mcp_celery_tasks.errors import ArtifactRefused, InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import artifact_queries as q
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory, Upload
from mcp_celery_tasks.store.artifact_queries import ArtifactRecord

__all__ = [
    "CHUNK_BYTES",
    "NO_LIMITS",
    "ArtifactLimits",
    "ArtifactReads",
    "ArtifactWrites",
    "ChunkSink",
    "HalfWritten",
    "NotOurs",
    "exact_chunks",
]

CHUNK_BYTES: Final = 1024 * 1024
"""Every chunk row but an artifact's last holds exactly this many bytes."""


class NotOurs(Exception):
    """A fenced artifact write found the task not this worker's (cancelled, finished, taken over)."""


class HalfWritten(LookupError):
    """The artifact exists but its upload has not completed (or never will)."""


@dataclass(frozen=True, slots=True)
class ArtifactLimits:
    """What one upload may use (``Settings``): its own cap, and the principal's quota (0: none)."""

    max_bytes: int = 1 << 62
    quota_bytes: int = 0

    @classmethod
    def of(cls, settings: Settings) -> ArtifactLimits:
        return cls(settings.max_artifact_bytes, settings.artifact_quota_bytes)


NO_LIMITS: Final = ArtifactLimits()
"""No cap to speak of, no quota (a store call made without settings)."""


class ArtifactWrites:
    """The worker's artifact calls; ``WorkerStore`` provides the connection."""

    def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # WorkerStore's

    def _execute(self, sql: LiteralString, params: Mapping[str, object]) -> int:
        raise NotImplementedError  # WorkerStore's

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
        """Store ``chunks`` as a new artifact of the task, fenced by ``worker``: the row first
        (incomplete), each 1 MiB chunk its own statement that also grows the row's size within
        ``limits`` (never the whole file in memory, never a long transaction), then the flip to
        complete with the size and sha256 computed on the way. The bytes go to chunk rows, or to
        a file under ``directory``. Returns (artifact_id, size, sha256).

        ``ArtifactRefused`` at the chunk that would pass a limit, ``NotOurs`` when a fence
        refuses. Refused, or its source raised: the upload is removed at once. Not ours: what
        was written stays incomplete (unreadable) until the orphan sweep removes it."""
        artifact_id = secrets.token_urlsafe(18)
        fence = {"task_id": task_id, "worker": worker, "artifact_id": artifact_id}
        storage = _File.storage if directory is not None else _Rows.storage
        created = {**fence, "name": name, "mime_type": mime_type, "storage": storage}
        if not self._fetch(q.CREATE_ARTIFACT, created):
            raise NotOurs(task_id)
        digest = hashlib.sha256()
        size = seq = 0
        sink: ChunkSink | None = None
        try:
            # The file is opened after the row exists: the directory sweep keeps what has a row.
            sink = (
                _Rows(self._fetch) if directory is None else _File(self._fetch, directory.upload(artifact_id))
            )
            for chunk in exact_chunks(chunks, CHUNK_BYTES):
                grow = {**fence, "n": len(chunk), "max_bytes": limits.max_bytes, "quota": limits.quota_bytes}
                if not sink.put(grow, seq, chunk):
                    raise self._refusal(task_id, worker, name, size + len(chunk), limits)
                digest.update(chunk)
                size, seq = size + len(chunk), seq + 1
            done = {
                **fence,
                "size": size,
                "sha256": digest.hexdigest(),
                "chunks": seq,
                "rows": sink.commit(seq),
            }
            if not self._fetch(q.COMPLETE_ARTIFACT, done):
                raise NotOurs(task_id)
        except NotOurs:
            if sink is not None:
                sink.abort()
            raise
        except BaseException:
            if sink is not None:
                sink.abort()
            with contextlib.suppress(InfrastructureError):  # else the orphan sweep removes it
                self._execute(q.DISCARD_ARTIFACT, fence)
            raise
        return artifact_id, size, digest.hexdigest()

    def _refusal(self, task_id: str, worker: str, name: str, size: int, limits: ArtifactLimits) -> Exception:
        """Why a chunk was refused: the run lost the task, or a limit (named in the error)."""
        rows = self._fetch(q.REFUSAL, {"task_id": task_id, "worker": worker})
        if not rows:
            return NotOurs(task_id)
        if size > limits.max_bytes:
            return ArtifactRefused(
                f"artifact {name!r} is larger than the limit of {limits.max_bytes} bytes per artifact "
                "(max_artifact_bytes): nothing of it was kept",
                "max_artifact_bytes",
            )
        used = int(str(rows[0]["used"]))
        return ArtifactRefused(
            f"artifact {name!r} does not fit in this principal's artifact storage quota of "
            f"{limits.quota_bytes} bytes (artifact_quota_bytes; {used} bytes stored): nothing of it was "
            "kept; stored artifacts are freed when their tasks expire",
            "artifact_quota_bytes",
        )

    def delete_orphan_artifacts(self, limit: int) -> int:
        """Delete up to ``limit`` incomplete artifacts of terminal tasks older than
        ``artifact_queries.ORPHAN_AFTER`` (a job killed mid-upload), with their chunks."""
        return self._execute(q.DELETE_ORPHANS, {"limit": limit})

    def known_artifacts(self, artifact_ids: Sequence[str]) -> set[str]:
        """Which of ``artifact_ids`` still have a row (the artifact directory's sweep)."""
        rows = self._fetch(q.KNOWN_ARTIFACTS, {"ids": list(artifact_ids)})
        return {str(row["artifact_id"]) for row in rows}


Fetch = Callable[[LiteralString, Mapping[str, object]], list[Mapping[str, object]]]


class ChunkSink(Protocol):
    """Where one upload's bytes go (``storage``, the row's column): ``put`` grows the row by the
    chunk within the limits (``_GROWN``) and keeps the chunk, False when the row refused;
    ``commit`` makes the bytes durable and says how many chunk rows the row must count;
    ``abort`` removes what the sink holds (the row is the caller's)."""

    storage: str

    def put(self, grow: Mapping[str, object], seq: int, chunk: bytes) -> bool: ...

    def commit(self, chunks: int) -> int: ...

    def abort(self) -> None: ...


class _Rows:
    """Postgres: each chunk a row, inserted by the statement that grows the artifact."""

    storage = "postgres"

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch

    def put(self, grow: Mapping[str, object], seq: int, chunk: bytes) -> bool:
        return bool(self._fetch(q.INSERT_CHUNK, {**grow, "seq": seq, "data": chunk}))

    def commit(self, chunks: int) -> int:
        return chunks

    def abort(self) -> None:
        pass  # the rows go with the artifact's row (cascade)


class _File:
    """A directory: the row grows first, then the chunk is appended to the upload's file."""

    storage = "directory"

    def __init__(self, fetch: Fetch, upload: Upload) -> None:
        self._fetch, self._upload = fetch, upload

    def put(self, grow: Mapping[str, object], seq: int, chunk: bytes) -> bool:
        if not self._fetch(q.GROW, grow):
            return False
        self._upload.write(chunk)
        return True

    def commit(self, chunks: int) -> int:
        self._upload.commit()
        return 0

    def abort(self) -> None:
        self._upload.abort()


def exact_chunks(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``chunks`` regrouped into pieces of exactly ``size`` bytes but the last, so that a byte
    range maps to chunk numbers (a file object may return short reads)."""
    pending = bytearray()
    for chunk in chunks:
        if not pending and len(chunk) == size:
            yield chunk
            continue
        pending += chunk
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)


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

    async def artifact_bytes(
        self,
        record: ArtifactRecord,
        offset: int = 0,
        length: int | None = None,
        directory: ArtifactDirectory | None = None,
    ) -> bytes:
        """``length`` bytes of the artifact from ``offset`` (all by default), one chunk (one
        statement, or one file read) at a time; the caller bounds the length. ``LookupError``
        when the bytes are gone (the task was collected meanwhile)."""
        length = record.size - offset if length is None else length
        if record.storage == "directory":
            if directory is None:
                raise LookupError(
                    f"artifact {record.artifact_id} is a file, and this API has no artifact_dir"
                )
            return await asyncio.to_thread(_read_file, directory, record.artifact_id, offset, length)
        parts: list[bytes] = []
        end = offset + length
        for seq in range(offset // CHUNK_BYTES, (end + CHUNK_BYTES - 1) // CHUNK_BYTES):
            rows = await self._fetch(q.CHUNK, {"artifact_id": record.artifact_id, "seq": seq})
            if not rows:
                raise LookupError(f"artifact {record.artifact_id} lost chunk {seq} (its task was deleted)")
            data = _as_bytes(rows[0]["data"])
            base = seq * CHUNK_BYTES
            parts.append(bytes(data[max(offset - base, 0) : end - base]))
        return b"".join(parts)

    async def list_artifacts(
        self, owner: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[ArtifactRecord]:
        """``owner``'s complete artifacts, newest first, after the ``(created_at, artifact_id)`` cursor."""
        params = {"owner": owner, "limit": limit, "after_at": after[0] if after else None,
                  "after_id": after[1] if after else None}  # fmt: skip
        return [_record(dict(row)) for row in await self._fetch(q.LIST_ARTIFACTS, params)]


def _read_file(directory: ArtifactDirectory, artifact_id: str, offset: int, length: int) -> bytes:
    try:
        return b"".join(directory.read(artifact_id, offset, length, CHUNK_BYTES))
    except (OSError, EOFError) as exc:
        raise LookupError(f"artifact {artifact_id}'s file cannot be read: {exc}") from exc


def _as_bytes(value: object) -> bytes | bytearray | memoryview:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"a chunk is bytea, not {type(value).__name__}")
    return value


def _record(row: Mapping[str, object]) -> ArtifactRecord:
    return ArtifactRecord(**row)  # type: ignore[arg-type]
