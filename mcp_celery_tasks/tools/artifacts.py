"""Artifacts as a tool author sees them (``ctx.artifact``): a file published from a job, handed
to the client as a ``resource_link`` it reads with ``resources/read``.

What may be published: ``bytes`` (or ``bytearray``/``memoryview``), ``str`` (stored as UTF-8),
or a binary file object, read from its position to the end in 1 MiB chunks (never whole in
memory). A path is refused on purpose: a path argument may come from a model, and only a
``FileRoot`` knows which files a tool may read; open it there (``root.open(path)``) and pass the
file object. The name becomes the last segment of the link's URI, so it is one plain segment:
no ``/``, ``\\``, ``..``, ``?``, ``#``, control characters, at most 200 characters. The worker's side is
``worker.artifacts``; no SQL here.
"""

from __future__ import annotations

import mimetypes
import os
import re
from collections.abc import Iterator
from typing import IO, Final, Protocol, TypedDict

from mcp_celery_tasks.errors import ToolError

__all__ = [
    "ARTIFACT_URI_PREFIX",
    "MAX_ARTIFACT_NAME_CHARS",
    "NO_ARTIFACTS",
    "ArtifactData",
    "ResourceLink",
    "TaskArtifacts",
    "artifact_chunks",
    "artifact_uri",
    "checked_artifact_name",
    "checked_mime_type",
]

ARTIFACT_URI_PREFIX: Final = "mcp-tasks://artifacts/"
MAX_ARTIFACT_NAME_CHARS: Final = 200
CHUNK_BYTES: Final = 1024 * 1024

ArtifactData = bytes | bytearray | memoryview | str | IO[bytes]
"""What ``ctx.artifact`` takes: the bytes, text (UTF-8), or a binary file object."""

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MIME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$")
_MIME_PARAMS: Final = re.compile(
    r"^\s*;\s*[A-Za-z0-9!#$&^_.+-]+=[^;\x00-\x1f]+(\s*;\s*[A-Za-z0-9!#$&^_.+-]+=[^;\x00-\x1f]+)*$"
)


class ResourceLink(TypedDict):
    """The ``resource_link`` content block ``ctx.artifact`` returns (MCP ``ResourceLink``)."""

    type: str
    uri: str
    name: str
    mimeType: str
    size: int


class TaskArtifacts(Protocol):
    """What ``ctx.artifact`` stands on (one per job run)."""

    def publish(self, name: str, data: ArtifactData, mime_type: str | None) -> ResourceLink: ...


def checked_artifact_name(name: object) -> str:
    """``name`` if it is one plain URI segment; ``ToolError`` saying what is allowed otherwise."""
    if not isinstance(name, str) or not name:
        raise ToolError("an artifact name is a non-empty string")
    if len(name) > MAX_ARTIFACT_NAME_CHARS:
        raise ToolError(f"an artifact name is at most {MAX_ARTIFACT_NAME_CHARS} characters, not {len(name)}")
    if "/" in name or "\\" in name:
        raise ToolError(f"artifact name {name!r} contains a path separator: give a plain file name")
    if "?" in name or "#" in name:
        raise ToolError(f"artifact name {name!r} contains '?' or '#', which end a URI's path")
    if name in (".", "..") or ".." in name:
        raise ToolError(f"artifact name {name!r} contains '..': give a plain file name")
    if _CONTROL.search(name):
        raise ToolError(f"artifact name {name!r} contains a control character")
    return name


def checked_mime_type(mime_type: str | None, name: str) -> str:
    """``mime_type`` if it reads ``type/subtype`` (parameters allowed); guessed from ``name``
    when None, else ``application/octet-stream``."""
    if mime_type is None:
        return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"
    if not isinstance(mime_type, str):
        raise ToolError("an artifact's mime type is a string like 'text/csv'")
    base, sep, params = mime_type.partition(";")
    if not _MIME.match(base.strip()) or (sep and not _MIME_PARAMS.match(sep + params)):
        raise ToolError(f"artifact mime type {mime_type!r} is not of the form type/subtype (like 'text/csv')")
    return mime_type


def artifact_uri(artifact_id: str, name: str) -> str:
    return f"{ARTIFACT_URI_PREFIX}{artifact_id}/{name}"


def artifact_chunks(data: ArtifactData, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """``data`` in chunks of ``chunk_bytes`` (a file object is read as it goes)."""
    if isinstance(data, os.PathLike):
        raise ToolError(
            "ctx.artifact takes bytes, text or a binary file object, not a path: open the file "
            "through a FileRoot (root.open(path)) and pass the file object"
        )
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data).cast("B")
        for start in range(0, len(view), chunk_bytes):
            yield bytes(view[start : start + chunk_bytes])
        return
    read = getattr(data, "read", None)
    if read is None:
        raise ToolError(f"ctx.artifact takes bytes, text or a binary file object, not {type(data).__name__}")
    while True:
        chunk = read(chunk_bytes)
        if isinstance(chunk, str):
            raise ToolError("ctx.artifact needs a file opened in binary mode ('rb')")
        if not chunk:
            return
        yield bytes(chunk)


class _NoArtifacts:
    """The artifacts of a context that runs no task (built by hand in a test)."""

    def publish(self, name: str, data: ArtifactData, mime_type: str | None) -> ResourceLink:
        raise ToolError("artifacts need a task: ctx.artifact works in a tool run by a worker")


NO_ARTIFACTS: TaskArtifacts = _NoArtifacts()
