"""The ``TaskContext`` a tool's isolated body gets: every operation crosses the pipe. No Celery here.

``BodyContext`` is a ``TaskContext`` whose operations are requests to the pool child
(``worker.isolation``), which performs them on the job's real context: status, logs, the cancel
flag, the soft limit, input requests (key choice, capability checks and waits happen there),
steps, checkpoints and artifacts. What the body keeps is its own: the function a step runs,
and the bytes it publishes, pulled by the pool child a chunk at a time (``Streams``), never whole.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, ParamSpec

from mcp_celery_tasks.errors import StepResultError
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.tools.artifacts import CHUNK_BYTES, ArtifactData, ResourceLink, artifact_chunks
from mcp_celery_tasks.tools.context import Ask, TaskContext
from mcp_celery_tasks.tools.steps import CheckpointData, CheckpointInfo, Checkpoints
from mcp_celery_tasks.worker.body_wire import Peer

__all__ = ["BodyContext", "Streams"]

P = ParamSpec("P")


class Streams:
    """The body's outgoing byte streams, by token: the pool child reads them with ``read``."""

    def __init__(self) -> None:
        self._open: dict[int, Iterator[bytes]] = {}
        self._tokens = itertools.count(1)
        self._buffers: dict[int, bytes] = {}

    @contextlib.contextmanager
    def opened(self, chunks: Iterator[bytes]) -> Iterator[int]:
        token = next(self._tokens)
        self._open[token] = chunks
        try:
            yield token
        finally:
            self._open.pop(token, None)
            self._buffers.pop(token, None)

    def read(self, token: int, size: int) -> bytes:
        """At most ``size`` bytes of stream ``token`` (empty at its end)."""
        chunks = self._open.get(token)
        if chunks is None:
            raise KeyError(f"no open stream {token}")
        buffered = self._buffers.pop(token, b"")
        while len(buffered) < size:
            chunk = next(chunks, None)
            if chunk is None:
                break
            buffered += chunk
        out, rest = buffered[:size], buffered[size:]
        if rest:
            self._buffers[token] = rest
        return out


def _file_chunks(data: CheckpointData) -> Iterator[bytes]:
    """Checkpoint data in chunks: a path is opened here, in the body (its files are its own)."""
    if isinstance(data, str | os.PathLike):
        with open(data, "rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk
        return
    if isinstance(data, bytes | bytearray | memoryview):
        yield from artifact_chunks(data)
        return
    while chunk := data.read(CHUNK_BYTES):
        if not isinstance(chunk, bytes | bytearray):
            raise TypeError("checkpoint data must be a binary file object (opened with 'rb')")
        yield bytes(chunk)


def _info(value: object) -> CheckpointInfo | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("the worker sent a checkpoint description that is not an object")
    saved = value.get("saved_at")
    return CheckpointInfo(
        name=str(value["name"]),
        size=int(value["size"]),
        sha256=str(value["sha256"]),
        storage=str(value["storage"]),
        saved_at=datetime.fromisoformat(saved) if isinstance(saved, str) else None,
    )


class _BodyCheckpoints(Checkpoints):
    def __init__(self, peer: Peer, streams: Streams) -> None:
        self._peer, self._streams = peer, streams

    def save(self, name: str, data: CheckpointData) -> CheckpointInfo:
        with self._streams.opened(_file_chunks(data)) as token:
            info = _info(self._peer.call("checkpoint_save", {"name": name, "stream": token}))
        assert info is not None  # a save always describes what it saved
        return info

    def load(self, name: str) -> bytes | None:
        found = self._peer.call("checkpoint_load", {"name": name})
        return found if isinstance(found, bytes) else None

    def load_to(self, name: str, path: str | os.PathLike[str]) -> bool:
        data = self.load(name)  # whole in the body's memory (the pool child streams it to the pipe)
        if data is None:
            return False
        target = Path(path)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return True

    def info(self, name: str) -> CheckpointInfo | None:
        return _info(self._peer.call("checkpoint_info", {"name": name}))

    def delete(self, name: str) -> bool:
        return bool(self._peer.call("checkpoint_delete", {"name": name}))


class _NoRuntime:
    """The body's context never reaches a runtime of its own: every use goes to the pool child."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"an isolated body has no runtime ({name})")


class BodyContext(TaskContext):
    """A ``TaskContext`` whose every operation the pool child performs (see the module doc)."""

    def __init__(self, peer: Peer, streams: Streams, **fields: Any) -> None:
        super().__init__(runtime=_NoRuntime(), **fields)
        self._peer = peer
        self._streams = streams
        self._step_fn: Callable[[], Any] | None = None
        self._step_error: BaseException | None = None
        self._checkpoints = _BodyCheckpoints(peer, streams)

    def report(self, message: str, progress: float | None = None, total: float | None = None) -> None:
        self._peer.call("report", {"message": message, "progress": progress, "total": total})

    def log(self, level: str, message: str, data: Any = None) -> None:
        payload: JSONValue
        try:
            payload = json.loads(json.dumps(data, allow_nan=False))
        except (TypeError, ValueError):
            payload = repr(data)  # not JSON: as the worker log would show it
        self._peer.call("log", {"level": level, "message": message, "data": payload})

    def flush(self) -> None:
        self._peer.call("flush")

    @property
    def cancelled(self) -> bool:
        return bool(self._peer.call("cancelled"))

    def raise_if_cancelled(self) -> None:
        self._peer.call("raise_if_cancelled")

    def step(self, name: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        if self._step_fn is not None:
            raise RuntimeError("ctx.step cannot be called inside another step")
        self._step_fn, self._step_error = lambda: fn(*args, **kwargs), None
        try:
            return self._peer.call("step", {"name": name})
        except BaseException:
            if self._step_error is not None:  # the step's own exception, as in-process
                raise self._step_error from None
            raise
        finally:
            self._step_fn = self._step_error = None

    def run_step(self) -> JSONValue:
        """The pool child's request: run the pending step's function, return its JSON result."""
        if self._step_fn is None:
            raise RuntimeError("no step is pending")
        try:
            value = self._step_fn()
        except BaseException as exc:
            self._step_error = exc
            raise
        try:
            return json.loads(json.dumps(value, allow_nan=False))  # type: ignore[no-any-return]
        except (TypeError, ValueError) as exc:
            error = StepResultError(f"the result of a step must be JSON: {exc}")
            self._step_error = error
            raise error from None

    @property
    def checkpoint(self) -> Checkpoints:
        return self._checkpoints

    def artifact(self, name: str, data: ArtifactData, mime_type: str | None = None) -> ResourceLink:
        with self._streams.opened(artifact_chunks(data)) as token:
            link = self._peer.call("artifact", {"name": name, "mime_type": mime_type, "stream": token})
        return link  # type: ignore[no-any-return]

    def _ask(self, items: list[tuple[str | None, Ask]]) -> dict[str, JSONObject]:
        wire: list[Any] = [[key, method, dict(params) if isinstance(params, Mapping) else params]
                           for key, (method, params) in items]  # fmt: skip
        return self._peer.call("ask", {"items": wire})  # type: ignore[no-any-return]


def body_stream_reader(streams: Streams) -> Callable[[JSONObject], bytes]:
    """The body's answer to the pool child's ``read`` request."""

    def read(args: JSONObject) -> bytes:
        token, size = args.get("stream"), args.get("size")
        if not isinstance(token, int) or not isinstance(size, int) or not 0 < size <= CHUNK_BYTES:
            raise ValueError("read needs an integer stream and a size up to 1 MiB")
        return streams.read(token, size)

    return read
