"""Artifact bytes as files under ``artifact_dir`` (the directory storage; Postgres chunks are the
default): shared by the workers that write, the API that reads and the maintenance worker that
sweeps, mounted at the same path by each.

A file's path comes from the artifact id alone (``<root>/<id[:2]>/<id>``; ids are URL-safe
base64), never from the artifact's name, so no name can reach outside the directory. An upload is
written to ``.<id>.part`` beside it, fsynced and renamed into place before the row flips to
complete; readers only open complete artifacts, so a half-written file is never read. Files whose
row is gone (collected with their task, an interrupted upload swept) are removed by
``stale_files`` + ``remove`` (``maintenance.gc.sweep_artifact_dir``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

__all__ = ["ArtifactDirectory", "Upload"]

_ID: Final = re.compile(r"[A-Za-z0-9_-]{8,64}")
_PART: Final = ".part"


class Upload:
    """One artifact's file being written: ``write`` each chunk, then ``commit`` or ``abort``."""

    def __init__(self, final: Path) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        self._final = final
        self._part = final.with_name(f".{final.name}{_PART}")
        self._file: IO[bytes] | None = self._part.open("xb")

    def write(self, chunk: bytes) -> None:
        assert self._file is not None, "the upload is closed"
        self._file.write(chunk)

    def commit(self) -> None:
        """Flush, fsync and rename into place (the row flips to complete after this)."""
        assert self._file is not None, "the upload is closed"
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._part, self._final)
        fd = os.open(self._final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def abort(self) -> None:
        """Remove what was written (the temporary file, or the renamed one)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._part.unlink(missing_ok=True)
        self._final.unlink(missing_ok=True)


class ArtifactDirectory:
    """The files of artifacts under one root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, artifact_id: str) -> Path:
        if not _ID.fullmatch(artifact_id):
            raise ValueError(f"not an artifact id: {artifact_id!r}")
        return self.root / artifact_id[:2] / artifact_id

    def upload(self, artifact_id: str) -> Upload:
        return Upload(self.path(artifact_id))

    def read(self, artifact_id: str, offset: int, length: int, chunk_bytes: int) -> Iterator[bytes]:
        """``length`` bytes from ``offset``, ``chunk_bytes`` at a time; ``FileNotFoundError``
        when the file is gone (its task was collected meanwhile, or another mount)."""
        with self.path(artifact_id).open("rb") as source:
            source.seek(offset)
            left = length
            while left > 0:
                chunk = source.read(min(chunk_bytes, left))
                if not chunk:
                    raise EOFError(f"artifact file {artifact_id} is shorter than its recorded size")
                left -= len(chunk)
                yield chunk

    def remove(self, artifact_id: str) -> None:
        final = self.path(artifact_id)
        final.unlink(missing_ok=True)
        final.with_name(f".{final.name}{_PART}").unlink(missing_ok=True)

    def stale_files(self, older_than_s: float, limit: int) -> dict[str, Path]:
        """Up to ``limit`` artifact ids with a file (complete or partial) untouched for
        ``older_than_s``: candidates for the sweep, which keeps those that still have a row."""
        found: dict[str, Path] = {}
        if not self.root.is_dir():
            return found
        now = time.time()
        for folder in self.root.iterdir():
            if not folder.is_dir() or len(folder.name) != 2:
                continue
            for entry in folder.iterdir():
                artifact_id = entry.name.removeprefix(".").removesuffix(_PART)
                try:
                    if not _ID.fullmatch(artifact_id) or now - entry.stat().st_mtime <= older_than_s:
                        continue
                except OSError:
                    continue  # removed meanwhile
                found[artifact_id] = entry
                if len(found) >= limit:
                    return found
        return found
