"""The pipe between a pool child and a tool's isolated body: frames, calls, errors. No Celery here.

One ``AF_UNIX`` stream socket. A frame is a 5-byte header (kind ``J`` or ``B``, a big-endian
length) and its payload: a JSON object, or raw bytes (an artifact or checkpoint chunk). Both
ends speak the same small RPC:

- a request ``{"id": n, "op": name, "args": {...}}``;
- its reply ``{"re": n, "ok": value}`` or ``{"re": n, "error": {"type": …, "message": …}}``;
  ``"binary": true`` on either says one ``B`` frame follows (the request's or the reply's bytes).

Calls nest: while one side waits for the reply to its request it serves the other's requests
(a durable step's function runs in the body while the pool child records it; an artifact's
bytes are pulled chunk by chunk while the pool child writes them). Exceptions travel as their
kind (``encode_error``/``decode_error``): a cancel is a cancel on the other side, a tool error
the same tool error. Anything malformed — a frame over its bound, JSON that is not an object, a
reply nobody asked for — is a ``ProtocolViolation``: the pool child ends the body for it.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
from collections.abc import Callable
from typing import Any, Final

from mcp_celery_tasks.errors import (
    CheckpointTooLarge,
    InputNotSupported,
    InputTimedOut,
    JobSuspended,
    McpError,
    SoftTimeLimitExceeded,
    StepOrderError,
    StepResultError,
    TaskCancelled,
    ToolError,
    TooManyWaiting,
    WorkerStopping,
)
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.tools.retries import RetryLater

__all__ = [
    "HELD_SIGNALS",
    "Handler",
    "Peer",
    "ProtocolViolation",
    "RemoteError",
    "decode_error",
    "encode_error",
]

_HEADER: Final = struct.Struct(">cI")

HELD_SIGNALS: Final = frozenset({signal.SIGUSR2, signal.SIGTERM})
"""The pool child's signals to a body (soft limit, stop): held from the exec until the body's
handlers are in, so that neither ends it by its default action while Python starts."""
MAX_MESSAGE_CHARS: Final = 2000
"""An error message crossing the pipe is cut to this length."""

Handler = Callable[[str, JSONObject, bytes | None], tuple[JSONValue, bytes | None]]
"""``(op, args, bytes) -> (value, bytes)``: what one side answers the other's requests with."""


class ProtocolViolation(Exception):
    """The other side sent something the protocol does not allow (or hung up mid-call)."""


class RemoteError(Exception):
    """An exception of the other side that has no kind of its own here (its type name and message)."""


_TOOL_ERRORS: Final[dict[str, type[ToolError]]] = {
    "soft_time_limit": SoftTimeLimitExceeded,
    "input_timeout": InputTimedOut,
    "step_order": StepOrderError,
    "step_result": StepResultError,
    "checkpoint_too_large": CheckpointTooLarge,
    "too_many_waiting": TooManyWaiting,
    "tool_error": ToolError,
}
_BASE: Final[dict[str, type[BaseException]]] = {
    "cancelled": TaskCancelled,
    "stopping": WorkerStopping,
    "suspended": JobSuspended,
}


def encode_error(exc: BaseException) -> JSONObject:
    """``exc`` as the JSON the other side turns back into the same kind of exception."""
    message = str(exc)[:MAX_MESSAGE_CHARS]
    if isinstance(exc, RetryLater):
        return {"type": "retry_later", "seconds": exc.seconds, "reason": exc.reason[:MAX_MESSAGE_CHARS]}
    if isinstance(exc, InputNotSupported):
        return {"type": "input_not_supported", "message": message, "capability": exc.capability}
    if isinstance(exc, McpError):
        return {"type": "mcp_error", "code": exc.code, "message": exc.message[:MAX_MESSAGE_CHARS]}
    for kind, cls in (*_BASE.items(), *_TOOL_ERRORS.items()):
        if type(exc) is cls:
            return {"type": kind, "message": message}
    if isinstance(exc, ToolError):  # a tool's own subclass: the message is what the client sees
        return {"type": "tool_error", "message": message}
    for kind, base in (("value_error", ValueError), ("type_error", TypeError), ("key_error", KeyError)):
        if isinstance(exc, base):
            return {"type": kind, "message": message, "name": type(exc).__name__}
    return {"type": "error", "message": message, "name": type(exc).__name__}


def decode_error(error: object) -> BaseException:
    """The exception ``encode_error`` described (an unknown description: ``ProtocolViolation``)."""
    if not isinstance(error, dict) or not isinstance(error.get("type"), str):
        return ProtocolViolation(f"an error that is not an error object: {str(error)[:200]}")
    kind, message = error["type"], str(error.get("message", ""))[:MAX_MESSAGE_CHARS]
    if kind == "retry_later":
        seconds, reason = error.get("seconds"), error.get("reason", "")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not isinstance(reason, str):
            return ProtocolViolation("a retry_later without seconds and reason")
        return RetryLater(float(seconds), reason[:MAX_MESSAGE_CHARS])
    if kind == "input_not_supported":
        capability = error.get("capability")
        return InputNotSupported(message, capability if isinstance(capability, str) else None)
    if kind == "mcp_error":
        code = error.get("code")
        if isinstance(code, bool) or not isinstance(code, int):
            return ProtocolViolation("an mcp_error without an integer code")
        return McpError(code, message)
    if kind in _BASE:
        return _BASE[kind](message)
    if kind in _TOOL_ERRORS:
        return _TOOL_ERRORS[kind](message)
    if kind == "value_error":
        return ValueError(message)
    if kind == "type_error":
        return TypeError(message)
    if kind == "key_error":
        return KeyError(message)
    if kind == "error":
        return RemoteError(f"{str(error.get('name', 'Exception'))[:100]}: {message}")
    return ProtocolViolation(f"an error of unknown type {kind[:50]!r}")


class Peer:
    """One end of the pipe: ``call`` the other side, serving its requests meanwhile."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        *,
        max_json_bytes: int,
        max_binary_bytes: int,
        idle: Callable[[], None] | None = None,
        idle_every_s: float = 0.2,
    ) -> None:
        self._sock = sock
        self._handler = handler
        self._max_json = max_json_bytes
        self._max_binary = max_binary_bytes
        self._idle = idle  # called while waiting, every ``idle_every_s`` (the pool child's checks)
        self._idle_every_s = idle_every_s
        self._next_id = 0

    # ---- frames ----------------------------------------------------------------------------

    def _send(self, kind: bytes, payload: bytes) -> None:
        self._sock.sendall(_HEADER.pack(kind, len(payload)) + payload)

    def send_json(self, message: JSONObject, binary: bytes | None = None) -> None:
        if binary is not None:
            message = {**message, "binary": True}
        self._send(b"J", json.dumps(message, separators=(",", ":"), allow_nan=False).encode())
        if binary is not None:
            self._send(b"B", binary)

    def _read_exact(self, size: int) -> bytes:
        chunks: list[bytes] = []
        left = size
        while left:
            if self._idle is not None:
                self._sock.settimeout(self._idle_every_s)
            try:
                chunk = self._sock.recv(min(left, 1 << 20))
            except TimeoutError:
                if self._idle is not None:
                    self._idle()
                continue
            if not chunk:
                raise ProtocolViolation("the other side hung up")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _frame(self) -> tuple[bytes, bytes]:
        kind, size = _HEADER.unpack(self._read_exact(_HEADER.size))
        if kind == b"J" and size > self._max_json:
            raise ProtocolViolation(f"a message of {size} bytes, over the bound of {self._max_json}")
        if kind == b"B" and size > self._max_binary:
            raise ProtocolViolation(f"a chunk of {size} bytes, over the bound of {self._max_binary}")
        if kind not in (b"J", b"B"):
            raise ProtocolViolation(f"a frame of unknown kind {kind!r}")
        return kind, self._read_exact(size)

    def receive(self) -> tuple[JSONObject, bytes | None]:
        """The next message and the bytes that came with it."""
        kind, payload = self._frame()
        if kind != b"J":
            raise ProtocolViolation("bytes where a message was due")
        try:
            message = json.loads(payload)
        except ValueError as exc:
            raise ProtocolViolation(f"a message that is not JSON ({exc})") from None
        if not isinstance(message, dict):
            raise ProtocolViolation("a message that is not a JSON object")
        binary = None
        if message.get("binary") is True:
            kind, binary = self._frame()
            if kind != b"B":
                raise ProtocolViolation("a message where its bytes were due")
        return message, binary

    # ---- calls -----------------------------------------------------------------------------

    def call(self, op: str, args: JSONObject | None = None, binary: bytes | None = None) -> Any:
        """Ask the other side to do ``op``; returns its value (bytes when it sent bytes), raises
        its error. Requests of the other side that come meanwhile are served."""
        self._next_id += 1
        ident = self._next_id
        self.send_json({"id": ident, "op": op, "args": args or {}}, binary)
        return self.wait_for(ident)

    def wait_for(self, ident: int) -> Any:
        while True:
            message, binary = self.receive()
            if "re" in message:
                if message["re"] != ident:
                    raise ProtocolViolation(f"a reply to {message['re']!r} while waiting for {ident}")
                if "error" in message:
                    raise decode_error(message["error"])
                return binary if binary is not None else message.get("ok")
            self.serve_one(message, binary)

    def serve_one(self, message: JSONObject, binary: bytes | None) -> None:
        """Answer one request of the other side (its error, or ours in handling it, as an error)."""
        ident, op, args = message.get("id"), message.get("op"), message.get("args", {})
        if isinstance(ident, bool) or not isinstance(ident, int) or not isinstance(op, str):
            raise ProtocolViolation("a request without an integer id and an op name")
        if not isinstance(args, dict):
            self.send_json({"re": ident, "error": encode_error(TypeError(f"{op}: args must be an object"))})
            return
        try:
            value, out = self._handler(op, args, binary)
        except ProtocolViolation:
            raise
        except BaseException as exc:  # every kind crosses the pipe; the caller re-raises it there
            self.send_json({"re": ident, "error": encode_error(exc)})
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            return
        self.send_json({"re": ident, "ok": value}, out)
