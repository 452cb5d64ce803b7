"""A tool's isolated body: ``python -m mcp_celery_tasks.worker.body_main <fd>``. No Celery here.

Started by the pool child (``worker.isolation``) with a cleaned environment and one inherited
file descriptor, its end of the pipe. Before anything else it arranges to die with the pool
child and gives up every capability (``hardening``); then it takes one ``run`` request — the
tool's module and name, the arguments, what its context needs to know — imports the module,
calls the tool with a ``BodyContext`` and answers with the result, the way the in-process path
would have produced it. Every context operation is a request back to the pool child.

Signals from the pool child reach the tool as they would in-process: SIGUSR2 is the soft time
limit (``SoftTimeLimitExceeded``), SIGTERM the worker stopping (``WorkerStopping``). One that
arrives while a request is on the pipe waits until the reply is in (a frame cut in half would
break the pipe), then is raised; one that arrives before the tool starts (the body starts with
both held, a loaded machine may take longer than a short soft limit) is raised as it starts.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import signal
import socket
import sys
from typing import Any

from mcp_types import CallToolResult
from pydantic import BaseModel

from mcp_celery_tasks.errors import McpError, SoftTimeLimitExceeded, ToolError, WorkerStopping
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.tools.context import bind
from mcp_celery_tasks.tools.registry import get_tool
from mcp_celery_tasks.worker import hardening
from mcp_celery_tasks.worker.body_context import BodyContext, Streams, body_stream_reader
from mcp_celery_tasks.worker.body_wire import HELD_SIGNALS, Peer, encode_error

__all__ = ["main"]

_UNBOUNDED = 1 << 40
"""What the body accepts from the pool child (the trusted side: a checkpoint comes whole)."""


class _GuardedPeer(Peer):
    """A peer whose calls a signal never interrupts: the exception it raises waits for the reply."""

    inside = 0
    pending: BaseException | None = None
    started = False  # the tool is running: before, a signal waits for it (``_Body.run``)
    done = False

    def call(self, op: str, args: JSONObject | None = None, binary: bytes | None = None) -> Any:
        self.inside += 1
        try:
            value = super().call(op, args, binary)
        finally:
            self.inside -= 1
        self.raise_pending()
        return value

    def raise_pending(self) -> None:
        if self.inside == 0 and self.pending is not None and not self.done:
            pending, self.pending = self.pending, None
            raise pending

    def signalled(self, exc: BaseException) -> None:
        if self.done:
            return
        if self.inside or not self.started:
            self.pending = exc
            return
        raise exc


class _Body:
    def __init__(self, sock: socket.socket) -> None:
        self.streams = Streams()
        self.peer = _GuardedPeer(sock, self.handle, max_json_bytes=_UNBOUNDED, max_binary_bytes=_UNBOUNDED)
        self.ctx: BodyContext | None = None
        self._read = body_stream_reader(self.streams)

    def handle(self, op: str, args: JSONObject, binary: bytes | None) -> tuple[JSONValue, bytes | None]:
        if op == "run":
            return self.run(args), None
        if op == "run_step" and self.ctx is not None:
            return self.ctx.run_step(), None
        if op == "read":
            return None, self._read(args)
        raise ValueError(f"the body knows no operation {op[:50]!r}")

    def run(self, args: JSONObject) -> JSONValue:
        given = args.get("sys_path")
        if isinstance(given, list) and given:
            sys.path[:] = [str(p) for p in given]
        module, name = str(args["module"]), str(args["tool"])
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ToolError(f"the isolated body cannot import the tool module {module!r}: {exc}") from None
        spec = get_tool(name)
        if spec is None:
            raise ToolError(f"tool {name!r} is not defined by module {module!r}")
        fields = args["context"]
        assert isinstance(fields, dict)
        self.ctx = ctx = BodyContext(self.peer, self.streams, **fields)
        try:
            with bind(ctx):
                kwargs: dict[str, Any] = spec.call_kwargs(args["arguments"])  # type: ignore[arg-type]
                if spec.context_param:
                    kwargs[spec.context_param] = ctx
                self.peer.started = True
                self.peer.raise_pending()  # a limit or stop that came while the body started
                value = spec.fn(**kwargs)
                if inspect.isawaitable(value):
                    value = asyncio.run(_await(value))
        except (ToolError, McpError):
            raise  # the pool child maps them as the in-process path does
        except Exception as exc:
            raised = encode_error(exc)
            retry_on = spec.retry.retry_on if spec.retry is not None else ()
            types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
            matched = next((i for i, cls in enumerate(types) if isinstance(exc, cls)), None)
            return {"raised": {**raised, "retry_index": matched}}
        finally:
            self.peer.done = True  # past the tool: a late signal changes nothing
        return _result(value)


def _result(value: object) -> JSONValue:
    """What the tool returned, as JSON the pool child turns into the same ``CallToolResult``."""
    if isinstance(value, CallToolResult):
        return {"call_tool_result": value.model_dump(by_alias=True, exclude_none=True, mode="json")}
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    # Not JSON (a set, an object): the in-process path fails the same way (a crash of the tool).
    return {"value": json.loads(json.dumps(value, separators=(",", ":"), ensure_ascii=False))}


async def _await(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str]) -> int:
    hardening.die_with_parent()
    hardening.drop_capabilities()
    sock = socket.socket(fileno=int(argv[1]))
    body = _Body(sock)
    peer = body.peer

    def soft_limit(signum: int, frame: object) -> None:
        peer.signalled(SoftTimeLimitExceeded("The tool ran past its soft time limit"))

    def stopping(signum: int, frame: object) -> None:
        peer.signalled(WorkerStopping("the worker is stopping"))

    signal.signal(signal.SIGUSR2, soft_limit)
    signal.signal(signal.SIGTERM, stopping)
    # Held since the exec (``isolation._start``): one sent while Python started waited, rather
    # than ending the body by its default action; now it reaches the handlers.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
    message, binary = peer.receive()
    peer.serve_one(message, binary)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
