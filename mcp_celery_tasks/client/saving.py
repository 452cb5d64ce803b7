"""``call --save-artifacts DIR``: every artifact a result links, read with ``resources/read`` and
written into DIR.

The links and their names are the server's, so they are hostile: a name is cut to one plain file
name before it touches the disk (``safe_file_name``: no separators, no leading dot, no control
characters, at most ``MAX_NAME_CHARS``), the file is created inside DIR's own descriptor with
``O_EXCL | O_NOFOLLOW`` (never through a symlink, never outside DIR), and an existing file is
never replaced: a taken name gets ``-1``, ``-2`` … before its extension. A read that fails
leaves no file behind.

A ``blob`` is base64, a ``text`` is written as UTF-8. An artifact larger than one read carries
(``MAX_READ_BYTES``, the server's limit) is read in parts with the ranged form of its uri,
``<uri>?offset=N&length=M``, for servers that serve it (``mcp-tasks://artifacts/{id}/{name}{?offset,length}``).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.markup import escape

from mcp_celery_tasks.client.protocol import ClientError, TasksClient
from mcp_celery_tasks.client.terminal import plain
from mcp_celery_tasks.client.view import size_text
from mcp_celery_tasks.json_types import JSONObject, as_array, as_object

__all__ = [
    "ARTIFACT_URI_PREFIX",
    "MAX_READ_BYTES",
    "SaveError",
    "SavedArtifact",
    "artifact_links",
    "link_size",
    "part_uris",
    "safe_file_name",
    "save_artifacts",
    "save_reported",
]

ARTIFACT_URI_PREFIX: Final = "mcp-tasks://artifacts/"
"""Our server's artifact uris (``tools.artifacts.ARTIFACT_URI_PREFIX``; spelled out here so the
client starts without the server's modules)."""
MAX_READ_BYTES: Final = 16 * 1024 * 1024
"""The most one ``resources/read`` of our server returns; a larger artifact is read in parts."""
PART_BYTES: Final = 8 * 1024 * 1024
MAX_NAME_CHARS: Final = 200
MAX_TAKEN: Final = 1000
"""Names tried (``name-1`` … ``name-999``) before a save gives up."""

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._ +=@,-]")


class SaveError(ClientError):
    """An artifact could not be saved (what the server sent, or the disk, said no)."""


@dataclass(frozen=True)
class SavedArtifact:
    name: str
    """The link's name as the server gave it."""
    path: Path
    size: int


def artifact_links(result: JSONObject) -> list[JSONObject]:
    """The ``resource_link`` blocks of a ``CallToolResult`` that name one of our artifacts."""
    return [
        block
        for block in (as_object(b) for b in as_array(result.get("content")))
        if block.get("type") == "resource_link" and str(block.get("uri", "")).startswith(ARTIFACT_URI_PREFIX)
    ]


def link_size(link: JSONObject) -> int | None:
    """The link's ``size`` when it is a whole number of bytes (a bool or a negative is no size)."""
    size = link.get("size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def safe_file_name(name: object, fallback: str = "artifact") -> str:
    """``name`` as one plain file name: its last path segment, unsafe characters as ``_``, no
    leading dots, spaces or dashes (no hidden file, no ``..``, no ``-rf``), at most
    ``MAX_NAME_CHARS`` characters (the extension kept); ``fallback`` when nothing is left."""
    text = str(name) if isinstance(name, str) else ""
    text = re.split(r"[/\\]", text)[-1]
    text = _UNSAFE.sub("_", text).lstrip(". -").rstrip(" ")
    if len(text) > MAX_NAME_CHARS:
        ext = text.rpartition(".")[2] if "." in text else ""
        keep = ext if 0 < len(ext) <= 16 else ""
        text = f"{text[: MAX_NAME_CHARS - len(keep) - 1]}.{keep}" if keep else text[:MAX_NAME_CHARS]
    return text or fallback


def _candidates(name: str) -> Iterator[str]:
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    yield name
    for n in range(1, MAX_TAKEN):
        yield f"{stem}-{n}.{ext}" if ext else f"{stem}-{n}"


def part_uris(uri: str, size: int | None, part_bytes: int = PART_BYTES) -> Iterator[tuple[str, int | None]]:
    """The reads that fetch an artifact of ``size`` bytes, each with the bytes it must return: the
    uri itself when one read carries it (or the size is unknown), else ranges of ``part_bytes``
    (``?offset=N&length=M``), made one at a time (a size a server made up costs nothing here)."""
    if size is None or size <= MAX_READ_BYTES:
        yield uri, size
        return
    for offset in range(0, size, part_bytes):
        length = min(part_bytes, size - offset)
        yield f"{uri}?offset={offset}&length={length}", length


def _content_bytes(result: JSONObject, uri: str) -> bytes:
    contents = [as_object(c) for c in as_array(result.get("contents"))]
    if len(contents) != 1:
        raise SaveError(f"resources/read of {uri} answered {len(contents)} contents, not one")
    content = contents[0]
    blob, text = content.get("blob"), content.get("text")
    if isinstance(blob, str):
        try:
            return base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise SaveError(f"resources/read of {uri} answered a blob that is not base64") from None
    if isinstance(text, str):
        return text.encode()
    raise SaveError(f"resources/read of {uri} answered neither text nor blob")


def _create(directory: int, name: str) -> tuple[str, int]:
    """A new file in ``directory`` (a descriptor) named ``name`` or the first free variant."""
    for candidate in _candidates(name):
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            return candidate, os.open(candidate, flags, 0o644, dir_fd=directory)
        except FileExistsError:
            continue
    raise SaveError(f"{name} and {MAX_TAKEN - 1} variants of it already exist; not replacing any")


def save_artifact(client: TasksClient, link: JSONObject, directory: Path) -> SavedArtifact:
    """One linked artifact read and written under ``directory`` (see the module docstring)."""
    uri = str(link["uri"])
    size = link_size(link)
    fallback = safe_file_name(uri.rsplit("/", 1)[-1])
    name = safe_file_name(link.get("name"), fallback)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise SaveError(f"cannot open {directory}: {exc.strerror or exc}") from None
    try:
        written_name, total = _write(client, dir_fd, name, uri, size)
    except OSError as exc:
        raise SaveError(f"cannot save {name} in {directory}: {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)
    return SavedArtifact(str(link.get("name", "")), directory / written_name, total)


def _write(client: TasksClient, dir_fd: int, name: str, uri: str, size: int | None) -> tuple[str, int]:
    """The name written and the bytes it holds; on any failure the new file is removed."""
    written_name, fd = _create(dir_fd, name)
    total = 0
    try:
        with os.fdopen(fd, "wb") as handle:
            for part, expected in part_uris(uri, size):
                data = _content_bytes(client.request("resources/read", {"uri": part}, name=part), part)
                if expected is not None and len(data) != expected:
                    raise SaveError(
                        f"{part}: read {len(data)} bytes, not the {expected} the link's size says"
                    )
                handle.write(data)
                total += len(data)
    except BaseException:
        os.unlink(written_name, dir_fd=dir_fd)
        raise
    return written_name, total


def save_artifacts(client: TasksClient, result: JSONObject, directory: Path) -> Iterator[SavedArtifact]:
    """Every artifact ``result`` links, saved in order (``directory`` is created if missing)."""
    links = artifact_links(result)
    if links:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SaveError(f"cannot create {directory}: {exc.strerror or exc}") from None
    for link in links:
        yield save_artifact(client, link, directory)


def save_reported(err: Console, client: TasksClient, result: JSONObject, directory: Path) -> bool:
    """Save every linked artifact, one line each on ``err`` (``saved NAME (SIZE) to PATH``);
    False, after one error line, when one could not be saved (the ones before it stay)."""
    try:
        for saved in save_artifacts(client, result, directory):
            line = f"saved {plain(saved.name)} ({size_text(saved.size)}) to {plain(str(saved.path))}"
            err.print(escape(line), soft_wrap=True)
    except ClientError as exc:
        err.print(f"[red]error[/red]: {escape(plain(f'saving artifacts: {exc}'))}", soft_wrap=True)
        return False
    return True
