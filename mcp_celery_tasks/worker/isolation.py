"""Running a tool's body in a fresh process that holds no credentials (``isolation="process"``).

The pool child keeps everything that needs the database: the claim, the lease, the runtime,
the outcome. It starts the body with ``subprocess`` (an ``exec`` of a new interpreter, never a
fork: a fork would copy the connection and its password), an environment cleaned of the
server's settings and of every variable that holds the database or broker URL
(``hardening.clean_environment``), no file descriptor but its end of the pipe and stdout/stderr,
and its own process group. The body dies with the pool child (``PR_SET_PDEATHSIG``) and gives up
every capability; the pool child (and the worker's main process) are made undumpable, so the
body cannot read their ``/proc/<pid>/environ`` or memory either.

The pool child is the trust boundary: the body's requests (``body_wire``) are checked for type
and size and performed on **this job's** real ``TaskContext`` only; an unknown request gets an
error reply, a malformed frame ends the body. The body's end maps back to what the in-process
path would have produced: its result; ``ToolError``, ``McpError``, ``RetryLater`` (its delay
checked again here), ``TaskCancelled``, ``WorkerStopping``, ``JobSuspended``; an unexpected
exception (matched against ``retry_on`` in the body); a body that dies is a crash of the tool
whose result names the exit code or signal.

While the body runs, the pool child forwards what it learns: the worker stopping (SIGTERM to
the body, SIGKILL 3 s later) and the soft time limit (SIGUSR2). Its own signals are held while
it serves (``Runtime._uninterrupted``): a frame is never cut in half.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from mcp_types import CallToolResult

from mcp_celery_tasks.errors import SoftTimeLimitExceeded, ToolError, WorkerStopping
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tools import retries
from mcp_celery_tasks.tools.artifacts import CHUNK_BYTES
from mcp_celery_tasks.tools.context import TaskContext
from mcp_celery_tasks.tools.registry import ToolSpec
from mcp_celery_tasks.tools.retries import RetryLater
from mcp_celery_tasks.worker import hardening
from mcp_celery_tasks.worker.body_wire import HELD_SIGNALS, Peer, ProtocolViolation, RemoteError, decode_error
from mcp_celery_tasks.worker.runtime import Runtime

__all__ = ["BodyCrashed", "isolated", "run_body", "run_isolated"]

logger = logging.getLogger("mcp_celery_tasks.isolation")

STOP_GRACE_S: Final = 3.0
"""After forwarding a stop, how long the body has before it is killed."""
MAX_TEXT: Final = 64 * 1024
MAX_ASKS: Final = 256


class BodyCrashed(ToolError):
    """The isolated body died before it answered (exit code or signal in the message); recorded
    as a crash of the tool (``error_kind`` ``crash``)."""

    outcome_kind = "crash"


def isolated(spec: ToolSpec, settings: Settings) -> bool:
    """Whether this run's body goes to a process of its own (the tool asks, or the worker does)."""
    return spec.isolation == "process" or settings.tool_isolation == "process"


def run_body(
    spec: ToolSpec,
    ctx: TaskContext,
    arguments: Mapping[str, object],
    runtime: Runtime,
    settings: Settings,
    *,
    inline: Callable[[ToolSpec, TaskContext, Mapping[str, object]], Any],
) -> Any:
    """The runner's one call into the tool: isolated when ``isolated`` says so, else ``inline``."""
    if isolated(spec, settings):
        return run_isolated(spec, ctx, arguments, runtime, settings)
    return inline(spec, ctx, arguments)


def _text(args: JSONObject, key: str, *, optional: bool = False, limit: int = MAX_TEXT) -> str | None:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise TypeError(f"{key} must be a string of at most {limit} characters")
    return value


def _number(args: JSONObject, key: str) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key} must be a number")
    return float(value)


class _BodyStream:
    """The body's bytes as a file object the worker's artifact and checkpoint code read."""

    def __init__(self, peer: Peer, token: object) -> None:
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError("stream must be an integer")
        self._peer, self._token = peer, token

    def seekable(self) -> bool:
        return False  # read once: a save is not retried

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = CHUNK_BYTES if size is None or size < 0 or size > CHUNK_BYTES else size
        chunk = self._peer.call("read", {"stream": self._token, "size": want})
        if not isinstance(chunk, bytes) or len(chunk) > want:
            raise ProtocolViolation("the body answered a read with something else than its bytes")
        return chunk


class _Ops:
    """The body's requests, performed on the job's own context."""

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        self.peer: Peer | None = None

    def handle(self, op: str, args: JSONObject, binary: bytes | None) -> tuple[JSONValue, bytes | None]:
        ctx, peer = self.ctx, self.peer
        assert peer is not None
        if binary is not None:
            raise TypeError(f"{op[:50]!r} takes no bytes")
        if op == "report":
            ctx.report(_text(args, "message") or "", _number(args, "progress"), _number(args, "total"))
        elif op == "log":
            ctx.log(_text(args, "level", limit=20) or "", _text(args, "message") or "", args.get("data"))
        elif op == "flush":
            ctx.flush()
        elif op == "cancelled":
            return ctx.cancelled, None
        elif op == "raise_if_cancelled":
            ctx.raise_if_cancelled()
        elif op == "ask":
            return self._ask(args.get("items")), None
        elif op == "step":
            name = _text(args, "name", limit=1000) or ""
            return ctx.step(name, lambda: peer.call("run_step")), None
        elif op == "artifact":
            stream: Any = _BodyStream(peer, args.get("stream"))  # a binary file object, read once
            mime = _text(args, "mime_type", optional=True, limit=300)
            link: Any = ctx.artifact(_text(args, "name", limit=1000) or "", stream, mime)
            return link, None
        elif op.startswith("checkpoint_"):
            return self._checkpoint(op, args)
        else:
            raise ValueError(f"unknown operation {op[:50]!r}")
        return None, None

    def _ask(self, items: object) -> JSONValue:
        if not isinstance(items, list) or not 0 < len(items) <= MAX_ASKS:
            raise TypeError(f"ask takes a list of 1 to {MAX_ASKS} requests")
        checked: list[tuple[str | None, tuple[str, Mapping[str, object] | None]]] = []
        for item in items:
            if not isinstance(item, list) or len(item) != 3:
                raise TypeError("an input request is [key, method, params]")
            key, method, params = item
            if key is not None and (not isinstance(key, str) or len(key) > 256):
                raise TypeError("an input key is a string of at most 256 characters")
            if not isinstance(method, str) or (params is not None and not isinstance(params, dict)):
                raise TypeError("an input request needs a method name and object params")
            checked.append((key, (method, params)))
        # The context's own checks and waits: capabilities, keys, the timeout are the worker's.
        return dict(self.ctx._ask(checked))

    def _checkpoint(self, op: str, args: JSONObject) -> tuple[JSONValue, bytes | None]:
        checkpoints, name = self.ctx.checkpoint, _text(args, "name", limit=1000) or ""
        assert self.peer is not None
        if op == "checkpoint_save":
            info = checkpoints.save(name, _BodyStream(self.peer, args.get("stream")))  # type: ignore[arg-type]
        elif op == "checkpoint_info":
            info = checkpoints.info(name)  # type: ignore[assignment]
        elif op == "checkpoint_load":
            data = checkpoints.load(name)
            return None, data
        elif op == "checkpoint_delete":
            return checkpoints.delete(name), None
        else:
            raise ValueError(f"unknown operation {op[:50]!r}")
        if info is None:
            return None, None
        saved = info.saved_at.isoformat() if info.saved_at else None
        described: JSONObject = {"name": info.name, "size": info.size, "sha256": info.sha256,
                                 "storage": info.storage, "saved_at": saved}  # fmt: skip
        return described, None


def _secret_urls(settings: Settings) -> list[str]:
    urls = (value for name, value in os.environ.items() if "URL" in name.upper() and "://" in value)
    return [settings.database_url, settings.broker_url, *urls]


def _context_fields(ctx: TaskContext, settings: Settings) -> dict[str, Any]:
    """What the body's context knows about the job (no handle on anything)."""
    return {
        "task_id": ctx.task_id, "job_id": ctx.job_id, "tool_name": ctx.tool_name,
        "attempt": ctx.attempt, "preflight": ctx.preflight, "principal": ctx.principal,
        "device": ctx.device, "client_capabilities": ctx.client_capabilities,
        "strict_capabilities": settings.strict_input_capabilities,
        "max_outstanding_inputs": settings.max_outstanding_inputs,
        "sleep_slice_s": settings.cancel_check_interval_seconds, "is_task": ctx.is_task,
        "max_retry_delay_s": settings.retry_max_delay_seconds,
    }  # fmt: skip


def _start(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)  # the exec'd body inherits the mask
    try:
        proc = subprocess.Popen(  # an exec, never a bare fork: nothing of this process is copied
            [sys.executable, "-m", "mcp_celery_tasks.worker.body_main", str(theirs.fileno())],
            env=env, stdin=subprocess.DEVNULL, close_fds=True, pass_fds=(theirs.fileno(),),
            start_new_session=True,
        )  # fmt: skip
    except BaseException:
        ours.close()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        theirs.close()
    return proc, ours


def _ended(proc: subprocess.Popen[bytes]) -> None:
    """Kill the body's process group if anything of it is left, and reap the body."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _died(spec: ToolSpec, proc: subprocess.Popen[bytes]) -> BodyCrashed:
    try:
        code = proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return BodyCrashed(
            f"The tool {spec.name!r} broke off its conversation with the worker; it was stopped"
        )
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return BodyCrashed(f"The tool {spec.name!r} was killed by signal {name} before it returned")
    return BodyCrashed(f"The tool {spec.name!r} exited with code {code} before it returned")


class _Watch:
    """What the pool child does while it waits for the body: forward a stop and the soft limit."""

    def __init__(self, proc: subprocess.Popen[bytes], runtime: Runtime) -> None:
        self._proc, self._runtime = proc, runtime
        self.stop_sent: float | None = None
        self.soft: SoftTimeLimitExceeded | None = None

    def __call__(self) -> None:
        if self._proc.poll() is not None:
            raise ProtocolViolation("the body exited")
        if self._runtime.stopping and self.stop_sent is None:
            self.stop_sent = time.monotonic()
            self._proc.send_signal(signal.SIGTERM)
        elif self.stop_sent is not None and time.monotonic() - self.stop_sent > STOP_GRACE_S:
            self._proc.kill()
        if self.soft is None:
            try:
                self._runtime.check_soft_limit()
            except SoftTimeLimitExceeded as exc:
                self.soft = exc
                self._proc.send_signal(signal.SIGUSR2)


def run_isolated(
    spec: ToolSpec, ctx: TaskContext, arguments: Mapping[str, object], runtime: Runtime, settings: Settings
) -> Any:
    """Run ``spec``'s body in a process of its own; returns what the tool returned (as JSON, or a
    ``CallToolResult``), raises what it raised (see the module doc)."""
    with contextlib.suppress(OSError):
        hardening.undumpable()  # before the body exists: it must never see our /proc entries
    env = hardening.clean_environment(os.environ, _secret_urls(settings))
    started = time.monotonic()
    proc, sock = _start(env)
    ops = _Ops(ctx)
    watch = _Watch(proc, runtime)
    peer = Peer(sock, ops.handle, max_json_bytes=max(4 << 20, 2 * settings.max_result_bytes + (64 << 10)),
                max_binary_bytes=CHUNK_BYTES, idle=watch)  # fmt: skip
    ops.peer = peer
    request: Any = {"module": spec.fn.__module__, "tool": spec.name, "arguments": dict(arguments),
                    "sys_path": list(sys.path), "context": _context_fields(ctx, settings)}  # fmt: skip
    try:
        with runtime._uninterrupted():  # our signals wait: a frame is never cut in half
            try:
                answer = peer.call("run", request)
            except ProtocolViolation as exc:
                if runtime.stopping:
                    raise WorkerStopping("the worker is stopping") from None
                try:
                    proc.wait(timeout=1)  # it exited (or is about to): its exit status says how
                except subprocess.TimeoutExpired:
                    logger.warning("job %s: the isolated body broke the protocol: %s", ctx.job_id, exc)
                    proc.kill()
                    said = (
                        f"The tool {spec.name!r} broke the protocol with the worker ({exc}); it was stopped"
                    )
                    raise BodyCrashed(said[:500]) from None
                raise _died(spec, proc) from None
            except SoftTimeLimitExceeded as exc:
                raise (watch.soft or exc) from None
            except RetryLater as exc:  # the delay is checked here, not in the body
                raise retries.retry_later(exc.seconds, exc.reason, settings.retry_max_delay_seconds) from None
    finally:
        sock.close()
        _ended(proc)
        logger.debug("job %s: isolated body ran %.3f s", ctx.job_id, time.monotonic() - started)
    return _returned(spec, answer)


def _returned(spec: ToolSpec, answer: object) -> Any:
    if not isinstance(answer, dict):
        raise BodyCrashed(f"The tool {spec.name!r} answered with something else than a result")
    if "call_tool_result" in answer:
        return CallToolResult.model_validate(answer["call_tool_result"])
    if "value" in answer:
        return answer["value"]
    raised = answer.get("raised")
    error = decode_error(raised)
    if isinstance(error, ProtocolViolation):
        raise BodyCrashed(f"The tool {spec.name!r} answered with something else than a result")
    index = raised.get("retry_index") if isinstance(raised, dict) else None
    types = spec.retry.retry_on if spec.retry is not None else ()
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(types):
        # The body matched ``retry_on``: raise that type here, so the runner schedules the retry.
        exc = types[index].__new__(types[index], str(error))
        raise exc
    if isinstance(error, RemoteError):
        name = str(raised.get("name", "Exception")) if isinstance(raised, dict) else "Exception"
        # Named as the body's exception in the worker log and the admin's detail.
        raise type(re.sub(r"\W", "", name)[:100] or "Exception", (RemoteError,), {})(
            str(error).split(": ", 1)[-1]
        )
    raise error
