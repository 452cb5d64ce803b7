"""Files a tool may touch: a few configured directories, and nothing outside them.

A path argument comes from a model, and a model does what the last text it read tells it: the
path may be ``/etc/passwd``, ``../../x``, a symlink planted in the directory, ``/proc/self/environ``,
``/dev/zero`` (endless), a FIFO (blocks forever), or a file swapped for a symlink between the
check and the open. ``FileRoot`` follows every symlink and reads only regular files that lie
inside its directories, checks the file it actually opened rather than the name it was given,
caps what it reads, and writes only by atomic replacement under the root, through no symlink,
never replacing a file unless the caller says so. Every refusal is a ``ToolError`` that tells
the model what is allowed. Hard links are out of scope: whoever can create files in a root
already decides what it holds.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from mcp_celery_tasks.errors import ToolError

__all__ = ["DEFAULT_MAX_LINE_BYTES", "DEFAULT_MAX_READ_BYTES", "FileRoot"]

DEFAULT_MAX_READ_BYTES = 16 << 20
"""Largest file ``read_bytes`` and ``read_text`` return whole."""
DEFAULT_MAX_LINE_BYTES = 1 << 20
"""Longer lines are cut to this many bytes by ``iter_lines`` (and by tools that read lines)."""

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRoot:
    """One or more directories a tool may read under (and, as an output root, write under).

    A caller's path may be relative (to the first directory), absolute, or a local ``file://``
    URL; once every symlink is followed it must lie inside one of the directories.

    Args:
        directories: absolute paths; ``/`` is refused.
        variable: the environment variable they came from, named in refusals.
        max_read_bytes: the largest file ``read_bytes``/``read_text`` return.
        max_line_bytes: ``iter_lines`` cuts longer lines to this many bytes.
    """

    def __init__(
        self,
        *directories: str | os.PathLike[str],
        variable: str | None = None,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        self.variable = variable
        source = f" ({variable})" if variable else ""
        if not directories:
            raise ToolError(f"no directory configured{source}")
        resolved = []
        for directory in directories:
            if not os.path.isabs(directory):
                raise ToolError(f"the allowed directory {os.fspath(directory)!r}{source} must be absolute")
            real = Path(os.path.realpath(directory))
            if real == Path(real.anchor):
                raise ToolError(f"the allowed directory{source} may not be the filesystem root {real}")
            resolved.append(real)
        self.directories: tuple[Path, ...] = tuple(resolved)
        self.max_read_bytes = max_read_bytes
        self.max_line_bytes = max_line_bytes

    @classmethod
    def from_env(cls, variable: str, **limits: int) -> FileRoot | None:
        """The directories listed in ``variable`` (separated by ``os.pathsep``), or None if unset."""
        directories = [d for d in os.environ.get(variable, "").split(os.pathsep) if d]
        return cls(*directories, variable=variable, **limits) if directories else None

    @classmethod
    def require_env(cls, variable: str, **limits: int) -> FileRoot:
        """Like ``from_env``, but a missing variable is a ``ToolError`` that names it."""
        root = cls.from_env(variable, **limits)
        if root is None:
            raise ToolError(f"this tool touches no files until {variable} names the directories it may use")
        return root

    # ---- reading ------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` (every symlink followed); a ``ToolError`` unless it lies inside."""
        real = Path(os.path.realpath(self._absolute(path)))
        if not self._contains(real):
            raise ToolError(
                f"{path!r} is outside {self._where()}; give a path relative to {self.directories[0]}"
            )
        return real

    def open(self, path: str) -> io.FileIO:
        """``path`` opened for reading: a regular file inside the root (checked after the open)."""
        real = self.resolve(path)
        try:
            # Refuse devices and FIFOs before opening them (opening may have side effects).
            self._require_regular(path, os.stat(real).st_mode)
            fd = os.open(real, _READ_FLAGS)  # O_NOFOLLOW: the last component was resolved above
        except OSError as exc:
            raise ToolError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
        try:
            # The checks that count: on what was opened, not on the name.
            self._require_regular(path, os.fstat(fd).st_mode)
            if not self._contains(_opened_path(fd)):
                raise ToolError(f"{path!r} is outside {self._where()} (it changed while being opened)")
            return io.FileIO(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def read_prefix(self, path: str, max_bytes: int) -> tuple[bytes, bool]:
        """The first ``max_bytes`` bytes of the file, and whether more followed."""
        with self.open(path) as raw, io.BufferedReader(raw) as reader:
            data = reader.read(max_bytes + 1)
        return data[:max_bytes], len(data) > max_bytes

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        """The whole file; a ``ToolError`` if it is larger than ``max_bytes`` (``max_read_bytes``)."""
        limit = self.max_read_bytes if max_bytes is None else max_bytes
        data, more = self.read_prefix(path, limit)
        if more:
            raise ToolError(f"{path!r} is larger than the {limit}-byte limit for one file")
        return data

    def read_text(self, path: str, max_bytes: int | None = None) -> str:
        """``read_bytes`` decoded as UTF-8 (undecodable bytes become U+FFFD)."""
        return self.read_bytes(path, max_bytes).decode("utf-8", "replace")

    def iter_lines(self, path: str) -> Iterator[str]:
        """The file's lines without line breaks, each cut to ``max_line_bytes``, in bounded memory."""
        limit = self.max_line_bytes
        with self.open(path) as raw, io.BufferedReader(raw) as reader:
            while line := reader.readline(limit):
                if len(line) == limit and not line.endswith(b"\n"):
                    while (rest := reader.readline(limit)) and not rest.endswith(b"\n"):
                        pass  # the rest of a line cut at ``limit``: read, never kept
                yield line.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8", "replace")

    # ---- writing ------------------------------------------------------------------------------

    def output_path(self, path: str) -> Path:
        """Where ``atomic_write(path)`` writes: under a root, with no ``..`` (symlinks not followed)."""
        root, parts = self._output_parts(path)
        return root.joinpath(*parts)

    @contextlib.contextmanager
    def atomic_write(self, path: str, *, overwrite: bool = False) -> Iterator[BinaryIO]:
        """A file to write, which replaces ``path`` at once when the block ends without error.

        Missing directories are created under the root; a symlink anywhere below the root is
        refused. An existing file is replaced only with ``overwrite=True``; without it, a file
        that appears meanwhile is left alone (the new one is linked in, never renamed over it).
        """
        root, parts = self._output_parts(path)
        *directories, name = parts
        try:
            os.makedirs(root, exist_ok=True)
            dir_fd = os.open(root, _DIR_FLAGS)
        except OSError as exc:
            raise ToolError(f"cannot write under {root}: {exc.strerror or exc}") from exc
        try:
            for part in directories:
                child = self._enter(dir_fd, part, path)
                os.close(dir_fd)
                dir_fd = child
            self._check_target(dir_fd, name, path, overwrite)
            temp = f".{name}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(temp, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
            except OSError as exc:
                raise ToolError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
            try:
                with os.fdopen(fd, "wb") as handle:
                    yield handle
                    handle.flush()
                    os.fsync(handle.fileno())
                self._commit(dir_fd, temp, name, path, overwrite)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    # ---- helpers ------------------------------------------------------------------------------

    def _where(self) -> str:
        listed = ", ".join(str(d) for d in self.directories)
        source = f" ({self.variable})" if self.variable else ""
        return f"the allowed {'directory' if len(self.directories) == 1 else 'directories'} {listed}{source}"

    def _contains(self, real: Path) -> bool:
        return any(real.is_relative_to(directory) for directory in self.directories)

    def _absolute(self, path: str) -> str:
        """``path`` as an absolute path (a relative one is under the first root), not resolved."""
        given = path
        if path.startswith("file:"):
            url = urlsplit(path)
            if url.netloc not in ("", "localhost") or url.query or url.fragment:
                raise ToolError(f"{given!r}: only local file:// URLs are supported")
            path = unquote(url.path)
        elif "://" in path:
            raise ToolError(f"{given!r}: only paths and file:// URLs are supported")
        if not path or "\0" in path:
            raise ToolError(f"{given!r} is not a valid path")
        return path if os.path.isabs(path) else os.path.join(self.directories[0], path)

    def _require_regular(self, path: str, mode: int) -> None:
        if not stat.S_ISREG(mode):
            raise ToolError(f"{path!r} is {_kind(mode)}, not a regular file")

    def _output_parts(self, path: str) -> tuple[Path, list[str]]:
        """The root and the components below it where ``path`` is written (no symlink followed)."""
        absolute = self._absolute(path)
        if ".." not in absolute.split(os.sep):
            for root in self.directories:
                parts = [p for p in os.path.relpath(absolute, root).split(os.sep) if p != "."]
                if parts and ".." not in parts:
                    return root, parts
        raise ToolError(
            f"cannot write {path!r}: give a path relative to {self.directories[0]} without '..'"
            f" ({self._where()})"
        )

    def _enter(self, dir_fd: int, part: str, path: str) -> int:
        """The directory ``part`` inside ``dir_fd``, created if missing, opened without following."""
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=dir_fd)
            return os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise ToolError(
                f"cannot write {path!r}: {part!r} is not a directory under {self._where()}"
                f" (symbolic links are not followed when writing): {exc.strerror or exc}"
            ) from exc

    def _check_target(self, dir_fd: int, name: str, path: str, overwrite: bool) -> None:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise ToolError(f"cannot write {path!r}: it is a symbolic link (never written through)")
        self._require_regular(path, mode)
        if not overwrite:
            raise ToolError(f"{path!r} already exists; it is replaced only when the caller agrees")

    def _commit(self, dir_fd: int, temp: str, name: str, path: str, overwrite: bool) -> None:
        try:
            if overwrite:
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            os.fsync(dir_fd)
        except FileExistsError as exc:
            raise ToolError(f"{path!r} appeared while it was being written; it was left alone") from exc
        except OSError as exc:
            raise ToolError(f"cannot write {path!r}: {exc.strerror or exc}") from exc


def _opened_path(fd: int) -> Path:
    """The path the kernel holds for an open file descriptor (Linux: /proc/self/fd)."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError as exc:
        raise ToolError("cannot check which file was opened: /proc/self/fd is unavailable") from exc


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")
