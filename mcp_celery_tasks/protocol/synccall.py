"""A synchronous tools/call: the one object that waits for its task and answers it.

A handler that runs a tool without a task returns a ``SyncCall``: the task id, who asked, and
the mapper of its spec revision (``Modern`` for 2026-07-28, ``Legacy`` for 2025-11-25 JSON
waits). The transport settles it (``rpc.settle``): the wait goes through the task service and
the mapper turns where the task stands into the result, or raises the error to answer. Nothing
calls back into the handler modules: their wire rules for a finished call live here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Protocol

from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import InternalError, InvalidParams, MissingCapability, ProtocolError
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.lifecycle import COMPLETED, FAILED, INPUT_REQUIRED
from mcp_celery_tasks.protocol import rounds as mrtr
from mcp_celery_tasks.protocol.holds import Hold, streamed
from mcp_celery_tasks.protocol.rpc import Result, Stream, error_body
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import ErrorObject, RequestId, Response
from mcp_celery_tasks.store import TaskError, TaskRecord
from mcp_celery_tasks.tasks.service import UNKNOWN_TASK, RequestContext, TaskView
from mcp_celery_tasks.tools.registry import ToolSpec
from mcp_celery_tasks.wire import dump

__all__ = [
    "RELATED",
    "Legacy",
    "Mapper",
    "Modern",
    "StoredError",
    "SyncCall",
    "held",
    "legacy_message",
    "reserve",
]

RELATED: Final = "io.modelcontextprotocol/related-task"


class StoredError(ProtocolError):
    """A task's recorded JSON-RPC error, answered as a synchronous call's error."""

    http_status = 200

    def __init__(self, error: TaskError | ErrorObject) -> None:
        super().__init__(str(error.get("message", "")), error.get("data"))
        self.code = int(error.get("code", codes.INTERNAL_ERROR))


class Mapper(Protocol):
    """One spec revision's answer to a synchronous call from where its task stands."""

    @property
    def relays_inputs(self) -> bool: ...

    async def outcome(
        self, services: Services, ctx: RequestContext, view: TaskView | None
    ) -> Mapping[str, object]: ...


@dataclass(frozen=True)
class SyncCall:
    """A synchronous call's task, waited for once and mapped by its revision's ``mapper``."""

    services: Services
    ctx: RequestContext
    task_id: str
    mapper: Mapper
    cancels_if_abandoned: bool = True
    """The caller going away (its await cancelled) cancels the task (not for tasks/result)."""
    hold: Hold | None = None
    """The caller's synchronous-wait slot (``holds``), given back once this call settles."""

    async def result(self) -> Mapping[str, object]:
        tasks, principal = self.services.tasks, self.ctx.principal
        relay = self.mapper.relays_inputs
        try:
            if self.cancels_if_abandoned:
                async with tasks.cancelled_if_abandoned(self.task_id, principal):
                    view = await tasks.wait_for_outcome(self.task_id, principal, relay_inputs=relay)
            else:
                view = await tasks.wait_for_outcome(self.task_id, principal, relay_inputs=relay)
            return await self.mapper.outcome(self.services, self.ctx, view)
        finally:
            if self.hold is not None:
                self.hold.release()


def reserve(services: Services, principal: str, *, stream: bool) -> Hold:
    """A synchronous wait's slot for ``principal`` (and a stream's, when the call will answer
    on one), taken before its task exists; ``QuotaExceeded`` (HTTP 429) when either is full."""
    settings = services.settings
    stream_cap = settings.max_open_streams_per_principal if stream else None
    return services.holds.take(principal, wait=settings.max_sync_waits_per_principal, stream=stream_cap)


async def held(hold: Hold | None, make: Awaitable[Result]) -> Result:
    """``make``'s result, carrying ``hold`` (``holds``) until its response ends: a synchronous
    call until it settles, a stream until its last message; any other result (a task created,
    an MRTR round, an error result) or an exception gives it back at once."""
    if hold is None:
        return await make
    try:
        result = await make
    except BaseException:
        hold.release()
        raise
    if isinstance(result, SyncCall):
        return replace(result, hold=hold)
    if isinstance(result, Stream):
        return Stream(streamed(hold, result.messages))
    hold.release()
    return result


# ---- 2026-07-28 -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Modern:
    """2026-07-28: the tool's result, an MRTR round for its input request, or an error."""

    spec: ToolSpec
    arguments: JSONObject
    relays_inputs: bool = True

    async def outcome(
        self, services: Services, ctx: RequestContext, view: TaskView | None
    ) -> Mapping[str, object]:
        if view is None:
            raise InternalError("the task disappeared before it finished")
        record = view.record
        if record.status == INPUT_REQUIRED and view.inputs:
            state: mrtr.RoundState = {"k": "task", "task": record.task_id}
            round_ = mrtr.input_required(services, ctx, self.spec, self.arguments, state, view.input_requests)
            return dump(round_)
        if record.active:
            await services.tasks.cancel(record.task_id, ctx.principal, "max_sync_wait exceeded")
            raise ProtocolError(
                f"The tool did not finish within {services.settings.max_sync_wait_seconds:.0f} s; "
                "call it as a task (declare the io.modelcontextprotocol/tasks extension) instead"
            )
        error = record.error
        if (
            record.status == COMPLETED
            and error is not None
            and error.get("code") == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
        ):
            # The job asked for an input kind this request did not declare: -32021, as before a
            # task exists (SEP-2322 MRTR; the error names what is missing).
            raise MissingCapability(str(error.get("message", "")), _required(error))
        if record.status == COMPLETED and record.result is not None:
            return record.result
        if record.status == FAILED and record.error is not None:
            raise StoredError(record.error)
        raise ProtocolError("The tool call was cancelled")


def _required(error: TaskError) -> JSONObject | None:
    data = error.get("data")
    needed = data.get("requiredCapabilities") if isinstance(data, dict) else None
    return needed if isinstance(needed, dict) else None


# ---- 2025-11-25 -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Legacy:
    """2025-11-25 without a stream to relay input requests on: the outcome once it ends."""

    related: bool
    relays_inputs: bool = False

    async def outcome(
        self, services: Services, ctx: RequestContext, view: TaskView | None
    ) -> Mapping[str, object]:
        message = legacy_message(None, view.record if view else None, self.related)
        if "error" in message:
            raise StoredError(message["error"])
        return message["result"]


def legacy_message(request_id: RequestId | None, record: TaskRecord | None, related: bool) -> Response:
    """The JSON-RPC response a finished task answers a waiting 2025-11-25 request with."""
    if record is None:
        return error_body(request_id, InvalidParams(UNKNOWN_TASK))
    if record.status == COMPLETED:
        result: JSONObject = dict(record.result or {"content": [], "isError": False})
        result.pop("resultType", None)
        if related:
            meta = result.get("_meta") or {}
            if not isinstance(meta, dict):
                raise TypeError(f"a result's _meta must be an object, not {type(meta).__name__}")
            result["_meta"] = {**meta, RELATED: {"taskId": record.task_id}}
        return {"jsonrpc": "2.0", "id": request_id, "result": result}
    if record.status == FAILED and record.error:
        return {"jsonrpc": "2.0", "id": request_id, "error": record.error}
    return error_body(request_id, ProtocolError("The task was cancelled"))
