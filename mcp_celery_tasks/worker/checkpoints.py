"""A job run's checkpoints (``ctx.checkpoint``): named blobs, the latest save of a name wins.

Checkpoint bytes go to one of two storages behind ``CheckpointStore`` (Postgres chunks by
default; files under ``checkpoint_dir`` when set); the checkpoint row (size, sha256, storage,
generation) is in Postgres either way, and a load goes by the row's storage, so a task saved
under one setting still loads under the other. A save writes a new generation and flips the row
to it: the previous checkpoint stays whole until the new one is complete and recorded. Bytes
are streamed in 1 MiB chunks, in and out: a file is never held in memory whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol, cast

from mcp_celery_tasks.errors import CheckpointTooLarge, TaskCancelled, ToolError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.step_queries import CHUNK_BYTES, CheckpointRecord
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.tools.steps import CheckpointData, CheckpointInfo

__all__ = [
    "CheckpointRows",
    "CheckpointStore",
    "DirectoryCheckpoints",
    "JobCheckpoints",
    "PostgresCheckpoints",
]

MAX_NAME_CHARS = 200


class CheckpointRows(Protocol):
    """The store calls of checkpoints (``WorkerStore``, ``MemoryStore``)."""

    def save_checkpoint(
        self, task_id: str, worker: str, name: str, generation: str, chunks: Iterable[bytes]
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None: ...

    def record_checkpoint(
        self, task_id: str, worker: str, record: CheckpointRecord
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None: ...

    def checkpoint(self, task_id: str, name: str) -> CheckpointRecord | None: ...

    def checkpoint_chunks(self, task_id: str, record: CheckpointRecord) -> Iterator[bytes]: ...

    def delete_checkpoint(self, task_id: str, worker: str, name: str) -> CheckpointRecord | bool | None: ...


def checked_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a {what} name is a non-empty string of at most {MAX_NAME_CHARS} characters")
    return name


def not_ours() -> TaskCancelled:
    return TaskCancelled("the task was cancelled or taken over by another worker")


class CheckpointStore(Protocol):
    """Where checkpoint bytes are kept: save a new generation (and flip the row), read one."""

    def save(
        self, name: str, generation: str, chunks: Iterable[bytes]
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None: ...

    def chunks(self, record: CheckpointRecord) -> Iterator[bytes]: ...

    def discard(self, record: CheckpointRecord) -> None: ...


StoreCall = Callable[[Callable[[], Any], str], Any]


class PostgresCheckpoints:
    """Checkpoint bytes in ``mcp_task_checkpoint_chunks``, 1 MiB a row, in the flip's transaction."""

    def __init__(self, store: CheckpointRows, task_id: str, worker: str) -> None:
        self._store, self._task_id, self._worker = store, task_id, worker

    def save(
        self, name: str, generation: str, chunks: Iterable[bytes]
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        return self._store.save_checkpoint(self._task_id, self._worker, name, generation, chunks)

    def chunks(self, record: CheckpointRecord) -> Iterator[bytes]:
        return self._store.checkpoint_chunks(self._task_id, record)

    def discard(self, record: CheckpointRecord) -> None:
        pass  # the chunks went with the row's flip (or its deletion)


class DirectoryCheckpoints:
    """Checkpoint bytes as files under ``root/<job_id>/``: each generation written to a temporary
    file, fsynced and renamed into place before the row flips to it; the previous generation's
    file is removed after the flip (the orphan sweep of ``maintenance.gc`` removes what a crash
    leaves behind, with the task)."""

    def __init__(self, store: CheckpointRows, root: Path, task_id: str, job_id: str, worker: str) -> None:
        self._store, self._root, self._task_id, self._job_id, self._worker = (
            store,
            root,
            task_id,
            job_id,
            worker,
        )

    def save(
        self, name: str, generation: str, chunks: Iterable[bytes]
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        folder = self._root / self._job_id
        folder.mkdir(parents=True, exist_ok=True)
        relative = f"{self._job_id}/{_file_stem(name)}.{generation}.ckpt"
        digest, size, count = hashlib.sha256(), 0, 0
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".saving-", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    size, count = size + len(chunk), count + 1
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self._root / relative)
            _fsync_dir(folder)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        record = CheckpointRecord(name, generation, "directory", size, digest.hexdigest(), count, relative)
        try:
            flipped = self._store.record_checkpoint(self._task_id, self._worker, record)
        except BaseException:
            (self._root / relative).unlink(missing_ok=True)
            raise
        if flipped is None:
            (self._root / relative).unlink(missing_ok=True)
        else:
            self._sweep(folder, name, keep=Path(relative).name)
        return flipped

    @staticmethod
    def _sweep(folder: Path, name: str, keep: str) -> None:
        """What an earlier run of this job killed mid-save left in its folder: a temporary file,
        or a generation renamed into place but never recorded. Only this job's run (it holds the
        lease) writes here, so anything of this name but the new file is stale."""
        for stale in [*folder.glob(f"{_file_stem(name)}.*.ckpt"), *folder.glob(".saving-*.tmp")]:
            if stale.name != keep:
                stale.unlink(missing_ok=True)

    def chunks(self, record: CheckpointRecord) -> Iterator[bytes]:
        path = self._root / (record.path or "")
        try:
            source = path.open("rb")
        except FileNotFoundError:
            raise ToolError(
                f"checkpoint {record.name!r} is recorded as the file {path}, which this worker cannot "
                "find: every worker needs the same checkpoint_dir"
            ) from None
        with source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk

    def discard(self, record: CheckpointRecord) -> None:
        if record.path:
            (self._root / record.path).unlink(missing_ok=True)


class JobCheckpoints:
    """``ctx.checkpoint`` of one job run (``tools.steps.Checkpoints``)."""

    def __init__(
        self,
        call: StoreCall,
        store: CheckpointRows,
        settings: Settings,
        *,
        task_id: str,
        job_id: str,
        tool_name: str,
        worker: str,
    ) -> None:
        self._call = call
        self._store = store
        self._task_id = task_id
        self._worker = worker
        self._tool = tool_name
        self._max_bytes = settings.max_checkpoint_bytes
        postgres = PostgresCheckpoints(store, task_id, worker)
        self._storages: dict[str, CheckpointStore] = {"postgres": postgres}
        self._saving: CheckpointStore = postgres
        if settings.checkpoint_dir:
            directory = DirectoryCheckpoints(store, Path(settings.checkpoint_dir), task_id, job_id, worker)
            self._storages["directory"] = self._saving = directory

    def save(self, name: str, data: CheckpointData) -> CheckpointInfo:
        checked_name(name, "checkpoint")
        generation = secrets.token_hex(8)

        rewind = _rewinder(data)

        def save() -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
            rewind()
            with _opened(data) as source:
                return self._saving.save(name, generation, self._capped(name, source))

        # A file object that cannot seek back is read once: no retry after an outage.
        flipped = self._call(save, f"saving checkpoint {name!r}") if rewind is not _once else save()
        if flipped is None:
            raise not_ours()
        saved, previous = flipped
        if previous is not None:
            self._storage(previous).discard(previous)
        metrics.checkpoint_bytes_saved.labels(self._tool).inc(saved.size)
        return _info(saved)

    def load(self, name: str) -> bytes | None:
        record = self._record(name)
        if record is None:
            return None
        return b"".join(self._verified(record))

    def load_to(self, name: str, path: str | os.PathLike[str]) -> bool:
        record = self._record(name)
        if record is None:
            return False
        target = Path(path)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                for chunk in self._verified(record):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return True

    def info(self, name: str) -> CheckpointInfo | None:
        record = self._record(name)
        return None if record is None else _info(record)

    def delete(self, name: str) -> bool:
        checked_name(name, "checkpoint")
        gone = self._call(
            lambda: self._store.delete_checkpoint(self._task_id, self._worker, name),
            f"deleting checkpoint {name!r}",
        )
        if gone is False:
            raise not_ours()
        if gone is None or gone is True:
            return False
        self._storage(gone).discard(gone)
        return True

    def _record(self, name: str) -> CheckpointRecord | None:
        checked_name(name, "checkpoint")
        found = self._call(
            lambda: self._store.checkpoint(self._task_id, name), f"reading checkpoint {name!r}"
        )
        return cast(CheckpointRecord | None, found)

    def _storage(self, record: CheckpointRecord) -> CheckpointStore:
        storage = self._storages.get(record.storage)
        if storage is None:
            raise ToolError(
                f"checkpoint {record.name!r} is kept in a directory, and this worker has no checkpoint_dir"
            )
        return storage

    def _verified(self, record: CheckpointRecord) -> Iterator[bytes]:
        digest = hashlib.sha256()
        for chunk in self._storage(record).chunks(record):
            digest.update(chunk)
            yield chunk
        if digest.hexdigest() != record.sha256:
            raise ToolError(f"checkpoint {record.name!r} does not match its recorded sha256: it was damaged")

    def _capped(self, name: str, source: Iterable[bytes]) -> Iterator[bytes]:
        size = 0
        for chunk in source:
            size += len(chunk)
            if size > self._max_bytes:
                raise CheckpointTooLarge(
                    f"checkpoint {name!r} is larger than the limit of {self._max_bytes} bytes "
                    f"(max_checkpoint_bytes; {size} read so far): nothing was saved, the previous "
                    "checkpoint stays"
                )
            yield chunk


class _opened:
    """``data`` as 1 MiB chunks: bytes sliced, a path opened (and closed), a file object read."""

    def __init__(self, data: CheckpointData) -> None:
        self._data = data
        self._file: IO[bytes] | None = None

    def __enter__(self) -> Iterator[bytes]:
        data = self._data
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data).cast("B")
            return (bytes(view[at : at + CHUNK_BYTES]) for at in range(0, len(view), CHUNK_BYTES))
        if isinstance(data, str | os.PathLike):
            try:
                self._file = open(data, "rb")  # closed by __exit__
            except OSError as exc:
                raise ToolError(
                    f"cannot read the checkpoint file {os.fspath(data)}: {exc.strerror}"
                ) from None
            return _read(self._file)
        if hasattr(data, "read"):
            return _read(data)
        raise TypeError("checkpoint data is bytes, a path (str or PathLike) or a binary file object")

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()


def _once() -> None:
    pass


def _rewinder(data: CheckpointData) -> Callable[[], None]:
    """What puts a file object back where a save found it, before each try of the save."""
    if isinstance(data, bytes | bytearray | memoryview | str | os.PathLike):
        return lambda: None
    if data.seekable():
        start = data.tell()

        def rewind() -> None:
            data.seek(start)

        return rewind
    return _once


def _read(source: IO[bytes]) -> Iterator[bytes]:
    while chunk := source.read(CHUNK_BYTES):
        if not isinstance(chunk, bytes | bytearray):
            raise TypeError("checkpoint data must be a binary file object (opened with 'rb')")
        yield bytes(chunk)


def _info(record: CheckpointRecord) -> CheckpointInfo:
    return CheckpointInfo(record.name, record.size, record.sha256, record.storage, record.saved_at)


def _file_stem(name: str) -> str:
    """A file-name-safe stem for a checkpoint name, one per name: a name that had to be changed to
    fit (``a.b``, a long one) gets a digest of itself, so it never shares a stem with another
    (``a_b``); the generation keeps each file unique."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "checkpoint"
    return safe if safe == name else f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
