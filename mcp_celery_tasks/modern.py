"""Protocol 2026-07-28 with the tasks extension (SEP-2663): handlers over the task service.

Each handler gets validated params and returns a result model; the one mapping from a task to
the SEP-2663 wire shapes (``CreateTaskResult``, ``DetailedTask``) is here. A tools/call is a
task when the request declares the extension and the tool allows it, else it runs synchronously
(a ``Deferred``: the same row and job, awaited through the event hub). Input on the synchronous
path, and ``ask_first`` questions before a task exists, travel as MRTR rounds (``mrtr``).
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from mcp_types import CallToolResult, DiscoverResult, ListToolsResult, Tool
from mcp_types import jsonrpc as codes

from mcp_celery_tasks import mrtr, tracing
from mcp_celery_tasks.errors import InternalError, InvalidParams, MissingCapability, ProtocolError
from mcp_celery_tasks.lifecycle import COMPLETED, FAILED, INPUT_REQUIRED
from mcp_celery_tasks.registry import InvalidArguments, ToolSpec, all_tools, get_tool
from mcp_celery_tasks.results import error_result
from mcp_celery_tasks.rpc import Deferred, Result
from mcp_celery_tasks.service import UNKNOWN_TASK, RequestContext, Services, TaskView
from mcp_celery_tasks.store import TaskRecord
from mcp_celery_tasks.wire import (
    ALL_VERSIONS,
    TASKS_EXTENSION,
    TOOL_MODE_META_KEY,
    CallToolParams,
    DetailedTaskResult,
    EmptyAck,
    MetaParams,
    PagedParams,
    TaskCreated,
    TaskIdParams,
    TaskUpdateParams,
    dump,
    iso,
)

__all__ = [
    "StoredError",
    "call_tool",
    "cancel_task",
    "created",
    "detailed",
    "discover",
    "get_task",
    "list_tools",
    "update_task",
]

LISTING_TTL_MS = 60_000
"""``ttlMs`` of discover and tools/list results (the CacheableResult fields, not a task TTL)."""


# ---- the wire shapes of a task ----------------------------------------------------------------


def _task_fields(record: TaskRecord) -> dict[str, Any]:
    """The SEP-2663 ``Task`` fields of a row (``ttlMs`` per DESIGN §3)."""
    return {
        "task_id": record.task_id,
        "status": record.status,
        "status_message": record.status_message,
        "created_at": iso(record.created_at),
        "last_updated_at": iso(record.last_updated_at),
        "ttl_ms": record.reported_ttl_ms(),
        "poll_interval_ms": record.poll_interval_ms,
    }


def created(record: TaskRecord) -> TaskCreated:
    """SEP-2663 ``CreateTaskResult``: never carries result, error or inputRequests."""
    return TaskCreated(**_task_fields(record))


def detailed(view: TaskView) -> DetailedTaskResult:
    """The DetailedTask: what tasks/get returns and notifications/tasks carries (S-15)."""
    record = view.record
    task = DetailedTaskResult(**_task_fields(record))
    if record.status == COMPLETED:
        task.result = record.result or {"content": [], "isError": False}
    elif record.status == FAILED:
        task.error = record.error or {"code": codes.INTERNAL_ERROR, "message": "The task failed"}
    elif record.status == INPUT_REQUIRED:
        task.input_requests = view.input_requests
    return task


class StoredError(ProtocolError):
    """A task's recorded JSON-RPC error, answered as a synchronous call's error."""

    http_status = 200

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", "")), error.get("data"))
        self.code = int(error.get("code", codes.INTERNAL_ERROR))


# ---- server/discover, tools/list --------------------------------------------------------------


async def discover(services: Services, ctx: RequestContext, params: MetaParams) -> Result:
    return DiscoverResult.model_validate(
        {
            "supportedVersions": list(ALL_VERSIONS),
            "capabilities": {"tools": {}, "extensions": {TASKS_EXTENSION: {}}},
            "instructions": (
                "Long-running tools run as tasks: declare the io.modelcontextprotocol/tasks extension "
                "and poll tasks/get. Tools that require it answer -32021 otherwise."
            ),
            "ttlMs": LISTING_TTL_MS,
            "cacheScope": "public",
        }
    )


def _tool(spec: ToolSpec) -> Tool:
    return Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.input_schema,
        meta={TOOL_MODE_META_KEY: spec.mode},
    )


async def list_tools(services: Services, ctx: RequestContext, params: PagedParams) -> Result:
    if params.cursor is not None:
        raise InvalidParams("Invalid cursor: the tool list has one page")
    return ListToolsResult(
        tools=[_tool(spec) for spec in all_tools()], ttl_ms=LISTING_TTL_MS, cache_scope="public"
    )


# ---- tools/call ---------------------------------------------------------------------------------


async def call_tool(services: Services, ctx: RequestContext, params: CallToolParams) -> Result:
    with tracing.tracer.start_as_current_span("tools/call") as span:
        span.set_attribute("mcp.tool", params.name)
        return await _call_tool(services, ctx, params)


def resolve_call(services: Services, params: CallToolParams) -> tuple[ToolSpec, dict[str, Any]]:
    """The tool and its validated, storable arguments (-32602 for an unknown tool, arguments that
    are too large or do not fit the schema)."""
    spec = get_tool(params.name)
    if spec is None:
        raise InvalidParams(f"Unknown tool: {params.name}")
    limit = services.settings.max_arguments_bytes
    if params.arguments and len(pydantic_core.to_json(params.arguments)) > limit:
        raise InvalidParams(f"arguments are larger than {limit} bytes")
    return spec, spec.validate_arguments(params.arguments or {})


async def _call_tool(services: Services, ctx: RequestContext, params: CallToolParams) -> Result:
    try:
        spec, arguments = resolve_call(services, params)
    except InvalidArguments as exc:
        return CallToolResult.model_validate(error_result(exc.message))  # the model can correct it
    tasked = ctx.declares_tasks
    if spec.mode == "required" and not tasked:
        # SEP-2663: a server that cannot answer without a task MUST say -32021 (HTTP 400).
        raise MissingCapability()
    responses = params.input_responses or {}
    state = mrtr.open_state(services, ctx, spec, arguments, params.request_state)
    if state is not None and state.get("k") == "task":
        # The retry of a synchronous call whose job asked for input (MRTR): feed that task.
        record = await services.tasks.get(state["task"], ctx.principal)
        await services.tasks.answer(record, responses)
        return Deferred(lambda: _await_sync(services, ctx, spec, arguments, record.task_id))
    preflight = None
    questions = spec.questions_first(arguments)
    if questions:
        collected, missing = mrtr.preflight(ctx, questions, state, responses)
        if missing:
            # SEP-2663 S-13: MRTR rounds finish before the task exists (no taskId yet).
            return mrtr.input_required(
                services, ctx, spec, arguments, {"k": "pre", "ans": collected}, missing
            )
        preflight = collected
    as_task = tasked and spec.mode != "forbidden"
    record = await services.tasks.create(ctx, spec, arguments, as_task=as_task, preflight=preflight)
    if as_task:
        return created(record)
    return Deferred(lambda: _await_sync(services, ctx, spec, arguments, record.task_id))


async def _await_sync(
    services: Services, ctx: RequestContext, spec: ToolSpec, arguments: dict[str, Any], task_id: str
) -> dict[str, Any]:
    """Wait for a synchronous call's job; an input request it makes goes back as an MRTR round."""
    tasks = services.tasks
    async with tasks.cancelled_if_abandoned(task_id, ctx.principal):
        view = await tasks.wait_for_outcome(task_id, ctx.principal, relay_inputs=True)
    if view is None:
        raise InternalError("the task disappeared before it finished")
    record = view.record
    if record.status == INPUT_REQUIRED and view.inputs:
        state = {"k": "task", "task": task_id}
        return dump(mrtr.input_required(services, ctx, spec, arguments, state, view.input_requests))
    if record.active:
        await tasks.cancel(task_id, ctx.principal, "max_sync_wait exceeded")
        raise ProtocolError(
            f"The tool did not finish within {services.settings.max_sync_wait_seconds:.0f} s; "
            "call it as a task (declare the io.modelcontextprotocol/tasks extension) instead"
        )
    if record.status == COMPLETED and record.result is not None:
        return record.result
    if record.status == FAILED and record.error is not None:
        raise StoredError(record.error)
    raise ProtocolError("The tool call was cancelled")


# ---- tasks/get, tasks/update, tasks/cancel ------------------------------------------------------


async def get_task(services: Services, ctx: RequestContext, params: TaskIdParams) -> Result:
    record = await services.tasks.get(params.task_id, ctx.principal)
    return detailed(await services.tasks.view(record))


async def update_task(services: Services, ctx: RequestContext, params: TaskUpdateParams) -> Result:
    record = await services.tasks.get(params.task_id, ctx.principal)
    await services.tasks.answer(record, params.input_responses)
    return EmptyAck()


async def cancel_task(services: Services, ctx: RequestContext, params: TaskIdParams) -> Result:
    outcome = await services.tasks.cancel(params.task_id, ctx.principal)
    if not outcome.found:
        raise InvalidParams(UNKNOWN_TASK)
    # An ack, also for a task that was already terminal (conformance: idempotent ack).
    return EmptyAck()
