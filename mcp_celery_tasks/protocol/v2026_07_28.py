"""Protocol 2026-07-28 with the tasks extension (SEP-2663): handlers over the task service.

Each handler gets validated params and returns a result model; the one mapping from a task to
the SEP-2663 wire shapes (``CreateTaskResult``, ``DetailedTask``) is here. A tools/call is a
task when the request declares the extension and the tool allows it, else it runs synchronously
(a ``synccall.SyncCall`` with this revision's mapper: the same row and job, awaited through
the event hub). Input on the synchronous
path, and ``ask_first`` questions before a task exists, travel as MRTR rounds (``mrtr``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypedDict, cast

import pydantic_core
from mcp_types import CallToolResult, DiscoverResult, ListToolsResult, Tool
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import InsufficientScope, InvalidParams, MissingCapability
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.lifecycle import COMPLETED, FAILED, INPUT_REQUIRED, Status
from mcp_celery_tasks.protocol import rounds as mrtr
from mcp_celery_tasks.protocol.relay import Relay
from mcp_celery_tasks.protocol.rpc import Result, Stream, as_protocol_error, error_body, result_body
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import Message
from mcp_celery_tasks.protocol.synccall import Modern, SyncCall, held, reserve
from mcp_celery_tasks.store import TaskRecord
from mcp_celery_tasks.tasks.idempotency import idempotency_key
from mcp_celery_tasks.tasks.service import UNKNOWN_TASK, RequestContext, TaskView
from mcp_celery_tasks.tools.inputs import GIVEN_KEY, MAX_GIVEN
from mcp_celery_tasks.tools.registry import InvalidArguments, ToolSpec, all_tools, get_tool
from mcp_celery_tasks.tools.results import error_result
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
    iso,
    progress_token,
)

__all__ = [
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


class _TaskFields(TypedDict):
    """``wire._TaskFields`` by field name: the keyword arguments of its models."""

    task_id: str
    status: Status
    status_message: str | None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None


def _task_fields(record: TaskRecord) -> _TaskFields:
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
        # JSON as stored, passed on (the model holds any JSON object: ``dict[str, object]``).
        task.result = cast("dict[str, object]", record.result or {"content": [], "isError": False})
    elif record.status == FAILED:
        task.error = dict(record.error or {"code": codes.INTERNAL_ERROR, "message": "The task failed"})
    elif record.status == INPUT_REQUIRED:
        task.input_requests = dict(view.input_requests)
    return task


# ---- server/discover, tools/list --------------------------------------------------------------


async def discover(services: Services, ctx: RequestContext, params: MetaParams) -> Result:
    return DiscoverResult.model_validate(
        {
            "supportedVersions": list(ALL_VERSIONS),
            "capabilities": {
                "tools": {},
                "logging": {},
                "resources": {},  # artifacts (``protocol.resources``)
                "extensions": {TASKS_EXTENSION: {}},
            },
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
    # Its span is the request's own (dispatch, ``telemetry.semconv``): ``tools/call <tool>``.
    return await _call_tool(services, ctx, params)


def resolve_call(
    services: Services, params: CallToolParams, scopes: frozenset[str] | None = None
) -> tuple[ToolSpec, JSONObject]:
    """The tool and its validated, storable arguments (-32602 for an unknown tool, arguments that
    are too large or do not fit the schema; 403 ``insufficient_scope`` for a JWT caller whose
    ``scopes`` lack the tool's)."""
    spec = get_tool(params.name)
    if spec is None:
        raise InvalidParams(f"Unknown tool: {params.name}")
    if scopes is not None and not scopes.issuperset(spec.scopes):
        raise InsufficientScope(spec.scopes)
    limit = services.settings.max_arguments_bytes
    if params.arguments and len(pydantic_core.to_json(params.arguments)) > limit:
        raise InvalidParams(f"arguments are larger than {limit} bytes")
    return spec, spec.validate_arguments(params.arguments or {})


def require_inputs(spec: ToolSpec, ctx: RequestContext) -> None:
    """-32021 naming the client capabilities the tool's input requests need and the request (or
    its 2025-11-25 session) did not declare: refused before a job runs, not a task that ends
    ``isError`` when the tool first asks (clients that declare only the tasks extension)."""
    declared = ctx.meta.client_capabilities if ctx.meta is not None else {}
    missing = [kind for kind in spec.needs_inputs if not isinstance(declared.get(kind), dict)]
    if missing:
        raise MissingCapability(
            f"Missing required client capability: {spec.name!r} asks the client for {', '.join(missing)}",
            {kind: {} for kind in missing},
        )


async def _call_tool(services: Services, ctx: RequestContext, params: CallToolParams) -> Result:
    key = idempotency_key(params.meta.model_extra if params.meta else None)
    try:
        spec, arguments = resolve_call(services, params, ctx.scopes)
    except InvalidArguments as exc:
        return CallToolResult.model_validate(error_result(exc.message))  # the model can correct it
    require_inputs(spec, ctx)
    tasked = ctx.declares_tasks
    if spec.mode == "required" and not tasked:
        # SEP-2663: a server that cannot answer without a task MUST say -32021 (HTTP 400).
        raise MissingCapability()
    as_task = tasked and spec.mode != "forbidden"
    relay = Relay(progress_token(params.meta.model_extra if params.meta else None), False)
    if not as_task and ctx.accepts_sse:
        # Logs only when this request asked for them (absent: MUST NOT send, 2026-07-28).
        relay.logs = ctx.meta is not None and ctx.meta.log_level is not None
    else:
        relay = Relay(None, False)  # a task: statusMessage only (S-53); JSON: nowhere to send
    # A synchronous call holds its slot from here, before any state is spent or task created:
    # refused, it leaves nothing behind (issue 33).
    hold = None if as_task else reserve(services, ctx.principal, stream=relay.wanted)
    return await held(hold, _call(services, ctx, params, spec, arguments, as_task, relay, key))


async def _call(
    services: Services,
    ctx: RequestContext,
    params: CallToolParams,
    spec: ToolSpec,
    arguments: JSONObject,
    as_task: bool,
    relay: Relay,
    key: str | None,
) -> Result:
    responses = params.input_responses or {}
    state = mrtr.open_state(services, ctx, spec, arguments, params.request_state)
    if state is not None and state.get("k") == "task":
        # The retry of a synchronous call whose job asked for input (MRTR): feed that task.
        record = await services.tasks.get(state["task"], ctx.principal)
        await services.tasks.answer(record, responses)
        await mrtr.spend(services, state)  # after the answers passed: an invalid one may be corrected
        return SyncCall(services, ctx, record.task_id, Modern(spec, arguments))
    preflight = None
    questions = spec.questions_first(arguments, ctx.principal)
    if questions:
        collected, missing = mrtr.preflight(ctx, questions, state, responses)
        await mrtr.spend(services, state)
        if missing:
            # SEP-2663 S-13: MRTR rounds finish before the task exists (no taskId yet).
            return mrtr.input_required(
                services, ctx, spec, arguments, {"k": "pre", "ans": collected}, missing
            )
        preflight = collected
    if state is None and responses:
        # SEP-2322: answers sent before anything was asked; the job uses those that fit the
        # questions it asks under the same keys (unknown keys are ignored).
        offered: JSONObject = {k: v for k, v in list(responses.items())[:MAX_GIVEN] if isinstance(v, dict)}
        if offered:
            preflight = {**(preflight or {}), GIVEN_KEY: offered}
    log_level = ctx.meta.log_level if relay.logs and ctx.meta is not None else None
    record = await services.tasks.create(
        ctx,
        spec,
        arguments,
        as_task=as_task,
        preflight=preflight,
        log_level=log_level,
        idempotency_key=key,
    )
    if as_task:
        return created(record)
    if relay.wanted:
        return Stream(_relayed(services, ctx, spec, arguments, record.task_id, relay))
    return SyncCall(services, ctx, record.task_id, Modern(spec, arguments))


async def _relayed(
    services: Services,
    ctx: RequestContext,
    spec: ToolSpec,
    arguments: JSONObject,
    task_id: str,
    relay: Relay,
) -> AsyncIterator[Message]:
    """A synchronous call on an SSE stream: the job's progress and logs, then its outcome."""
    tasks = services.tasks
    deadline = tasks.sync_deadline()
    settled = False
    try:
        while True:
            view = await tasks.wait_for_outcome(
                task_id, ctx.principal, relay_inputs=True, news=relay.news, deadline=deadline
            )
            if view is not None:
                for message in await relay.notifications(services, view.record):
                    yield message
            if view is None or not view.record.active or view.inputs:
                break
            if asyncio.get_running_loop().time() >= deadline:
                break
        settled = True
    finally:
        if not settled:
            # The caller closed its stream: its task must not run on for nobody.
            await asyncio.shield(tasks.cancel(task_id, ctx.principal, "the caller went away"))
    try:
        result = await Modern(spec, arguments).outcome(services, ctx, view)
    except Exception as exc:
        yield error_body(ctx.request_id, as_protocol_error(exc))
    else:
        yield result_body(ctx.request_id, result, services.server_info)


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
