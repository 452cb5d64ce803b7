"""What each JSON-RPC method does, for protocol 2026-07-28. No HTTP, no Celery."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pydantic_core
from mcp_types import jsonrpc as codes

from mcp_celery_tasks import metrics, tracing
from mcp_celery_tasks.errors import (
    InternalError,
    InvalidParams,
    MissingCapability,
    ProtocolError,
)
from mcp_celery_tasks.events import TaskEvents
from mcp_celery_tasks.inputs import CAPABILITY_FOR, Elicit, validate_response
from mcp_celery_tasks.registry import ToolSpec, all_tools, get_tool
from mcp_celery_tasks.sealing import Sealer, arguments_hash
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, NewTask, TaskRecord
from mcp_celery_tasks.wire import (
    MODERN_VERSION,
    TASKS_EXTENSION,
    CallToolParams,
    DetailedTaskResult,
    EmptyAck,
    RequestMeta,
    TaskCreated,
    TaskIdParams,
    TaskUpdateParams,
    declares_tasks,
    dump,
    iso,
)

__all__ = ["Deferred", "Publisher", "RequestContext", "Services", "new_task_id"]

logger = logging.getLogger(__name__)

UNKNOWN_TASK = "Failed to retrieve task: Task not found"


class Publisher(Protocol):
    def publish_job(self, job_id: str, queue_name: str, headers: dict[str, str] | None = None) -> None: ...
    def wake(self, inbox: str, task_id: str) -> None: ...
    def revoke(self, job_id: str) -> None: ...
    def check_broker(self) -> concurrent.futures.Future[bool]: ...


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: ApiStore
    events: TaskEvents
    publisher: Publisher
    server_version: str
    sealer: Sealer
    default_queue: str
    """Where jobs of tools that name no queue go (the Celery app's route, or the setting)."""
    subscriptions: dict[str, int] = field(default_factory=dict)
    """Open subscriptions per principal in this process."""


@dataclass(frozen=True)
class RequestContext:
    """Who asks, and with which per-request envelope."""

    principal: str
    meta: RequestMeta | None

    @property
    def declares_tasks(self) -> bool:
        return self.meta is not None and declares_tasks(self.meta.client_capabilities)


@dataclass(frozen=True)
class Deferred:
    """A result that is only ready after waiting (the synchronous tools/call path).

    The transport awaits ``wait()``; cancelling that await (the client went away) cancels
    the task.
    """

    wait: Callable[[], Awaitable[dict[str, Any]]]


Result = dict[str, Any] | Deferred


def new_task_id() -> str:
    """192 bits from ``secrets``, URL-safe (never of the ``=?base64?`` form: no ``=`` or ``?``)."""
    return secrets.token_urlsafe(24)


# ---- server/discover, tools/list -------------------------------------------------------


async def discover(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    return {
        "resultType": "complete",
        "supportedVersions": [MODERN_VERSION],
        "capabilities": {"tools": {}, "extensions": {TASKS_EXTENSION: {}}},
        "instructions": (
            "Long-running tools run as tasks: declare the io.modelcontextprotocol/tasks extension "
            "and poll tasks/get. Tools that require it answer -32021 otherwise."
        ),
        "ttlMs": 60_000,
        "cacheScope": "public",
    }


def _tool_entry(spec: ToolSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": spec.name, "inputSchema": spec.input_schema}
    if spec.description:
        entry["description"] = spec.description
    # 2026-07-28 has no tool-level task flag (SPEC-CHECKLIST Q-19); say it in _meta so hosts
    # that care can show it, without inventing a spec field.
    entry["_meta"] = {f"{TASKS_EXTENSION}/mode": spec.mode}
    return entry


async def list_tools(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    return {
        "resultType": "complete",
        "tools": [_tool_entry(spec) for spec in all_tools()],
        "ttlMs": 60_000,
        "cacheScope": "public",
    }


# ---- tools/call -----------------------------------------------------------------------------


async def call_tool(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    with tracing.tracer.start_as_current_span("tools/call") as span:
        span.set_attribute("mcp.tool", str(params.get("name")))
        return await _call_tool(services, ctx, params)


async def _call_tool(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    call = CallToolParams.model_validate(params)
    spec = get_tool(call.name)
    if spec is None:
        raise InvalidParams(f"Unknown tool: {call.name}")
    if call.arguments and len(pydantic_core.to_json(call.arguments)) > services.settings.max_arguments_bytes:
        raise InvalidParams(f"arguments are larger than {services.settings.max_arguments_bytes} bytes")
    arguments = spec.validate_arguments(call.arguments or {})
    tasked = ctx.declares_tasks
    if spec.mode == "required" and not tasked:
        # SEP-2663: a server that cannot answer without a task MUST say -32021 (HTTP 400).
        raise MissingCapability()
    state = _open_state(services, ctx, spec, arguments, call)
    if state is not None and state.get("k") == "task":
        # The retry of a synchronous call whose job asked for input (MRTR): feed that task.
        return await _resume_sync(services, ctx, spec, arguments, state["task"], call.input_responses or {})
    preflight = None
    questions = spec.questions_first(arguments)
    if questions:
        collected = _preflight(ctx, questions, state, call.input_responses or {})
        missing = {key: question for key, question in questions.items() if key not in collected}
        if missing:
            # SEP-2663 S-13: MRTR rounds finish before the task exists (no taskId yet).
            state_out = {"k": "pre", "ans": collected}
            return _input_required(services, ctx, spec, arguments, state_out, {
                key: {"method": q.method, "params": q.params} for key, q in missing.items()
            })  # fmt: skip
        preflight = collected
    as_task = tasked and spec.mode != "forbidden"
    record = await start_job(services, ctx, spec, arguments, as_task=as_task, preflight=preflight)
    if as_task:
        return dump(_created(record))
    return Deferred(lambda: _await_sync(services, ctx, spec, arguments, record.task_id))


async def start_job(
    services: Services,
    ctx: RequestContext,
    spec: ToolSpec,
    arguments: dict[str, Any],
    *,
    as_task: bool,
    preflight: dict[str, Any] | None = None,
    retention_ms: int | None = None,
) -> TaskRecord:
    """Commit the task row, then hand its job to the publisher (both eras use this)."""
    settings = services.settings
    if retention_ms is None:
        retention_ms = int(spec.retention_seconds * 1000) if spec.retention_seconds else settings.retention_ms
    assert ctx.meta is not None
    record = await services.store.create_task(
        NewTask(
            task_id=new_task_id(),
            job_id=str(uuid.uuid4()),
            owner=ctx.principal,
            tool_name=spec.name,
            arguments=arguments,
            queue=spec.queue or services.default_queue,
            ttl_ms=retention_ms,
            retention_ms=min(retention_ms, settings.max_retention_ms),
            poll_interval_ms=spec.poll_interval_ms or settings.poll_interval_ms,
            max_attempts=spec.max_attempts or settings.max_attempts,
            protocol_version=ctx.meta.protocol_version,
            client_capabilities=ctx.meta.client_capabilities,
            client_info=ctx.meta.client_info,
            preflight=preflight,
        )
    )
    # The row is committed (autocommit): a tasks/get for this id resolves from here on
    # (SEP-2663 S-12). Publishing happens off the loop; the sweeper covers a crash here.
    services.publisher.publish_job(record.job_id, record.queue, tracing.inject())
    metrics.tasks_created.labels(spec.name, "task" if as_task else "sync").inc()
    return record


def _open_state(
    services: Services, ctx: RequestContext, spec: ToolSpec, arguments: dict[str, Any], call: CallToolParams
) -> dict[str, Any] | None:
    if call.request_state is None:
        return None
    return services.sealer.open(call.request_state, p=ctx.principal, t=spec.name, a=arguments_hash(arguments))


def _preflight(
    ctx: RequestContext, questions: dict[str, Elicit], state: dict[str, Any] | None, responses: dict[str, Any]
) -> dict[str, Any]:
    collected: dict[str, Any] = dict((state or {}).get("ans") or {})
    capabilities = ctx.meta.client_capabilities if ctx.meta else {}
    for key, question in questions.items():
        if key in collected:
            continue
        if key in responses:
            collected[key] = validate_response(key, question.method, question.params, responses[key])
        elif CAPABILITY_FOR[question.method] not in capabilities:
            needed = CAPABILITY_FOR[question.method]
            raise MissingCapability(f"The tool asks first and needs the {needed!r} capability", {needed: {}})
    return collected


def _input_required(
    services: Services,
    ctx: RequestContext,
    spec: ToolSpec,
    arguments: dict[str, Any],
    state: dict[str, Any],
    requests: dict[str, Any],
) -> dict[str, Any]:
    sealed = services.sealer.seal(
        {**state, "p": ctx.principal, "t": spec.name, "a": arguments_hash(arguments)},
        services.settings.request_state_ttl_seconds,
    )
    return {"resultType": "input_required", "inputRequests": requests, "requestState": sealed}


def _created(record: TaskRecord) -> TaskCreated:
    return TaskCreated(
        task_id=record.task_id,
        status=record.status,
        status_message=record.status_message,
        created_at=iso(record.created_at),
        last_updated_at=iso(record.last_updated_at),
        ttl_ms=record.reported_ttl_ms(),
        poll_interval_ms=record.poll_interval_ms,
    )


async def _resume_sync(
    services: Services,
    ctx: RequestContext,
    spec: ToolSpec,
    arguments: dict[str, Any],
    task_id: str,
    responses: dict[str, Any],
) -> Result:
    record = await services.store.get_task(task_id, ctx.principal)
    if record is None:
        raise InvalidParams("The requestState refers to a task that no longer exists")
    await record_answers(services, record, responses)
    return Deferred(lambda: _await_sync(services, ctx, spec, arguments, task_id))


async def _await_sync(
    services: Services, ctx: RequestContext, spec: ToolSpec, arguments: dict[str, Any], task_id: str
) -> dict[str, Any]:
    """Wait for a synchronous call's job; cancel the task if the caller goes away."""
    try:
        final = await services.events.wait_for(
            task_id,
            ctx.principal,
            services.settings.max_sync_wait_seconds,
            until=lambda r: not r.active or r.status == "input_required",
        )
    except asyncio.CancelledError:
        await asyncio.shield(request_cancel(services, task_id, ctx.principal, "the caller went away"))
        raise
    if final is None:
        raise InternalError("the task disappeared before it finished")
    if final.status == "input_required":
        inputs = await services.store.outstanding_inputs(task_id)
        if inputs:
            requests = {item.key: _input_entry(item.method, item.params) for item in inputs}
            return _input_required(services, ctx, spec, arguments, {"k": "task", "task": task_id}, requests)
        final = (
            await services.events.wait_for(
                task_id, ctx.principal, services.settings.max_sync_wait_seconds, until=lambda r: not r.active
            )
            or final
        )
    if final.active:
        await request_cancel(services, task_id, ctx.principal, "max_sync_wait exceeded")
        raise ProtocolError(
            f"The tool did not finish within {services.settings.max_sync_wait_seconds:.0f} s; "
            "call it as a task (declare the io.modelcontextprotocol/tasks extension) instead"
        )
    if final.status == "completed" and final.result is not None:
        return final.result
    if final.status == "failed" and final.error is not None:
        raise StoredError(final.error)
    raise ProtocolError("The tool call was cancelled")


def _input_entry(method: str, params: dict[str, Any] | None) -> dict[str, Any]:
    return {"method": method, **({"params": params} if params is not None else {})}


class StoredError(ProtocolError):
    """A task's recorded JSON-RPC error, answered as the synchronous call's error."""

    http_status = 200

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", "")), error.get("data"))
        self.code = int(error.get("code", codes.INTERNAL_ERROR))


# ---- tasks/get, tasks/update, tasks/cancel ------------------------------------------------------


def _require_extension(ctx: RequestContext) -> None:
    # SEP-2663: tasks/* from a request that does not declare the extension -> -32021.
    if not ctx.declares_tasks:
        raise MissingCapability()


async def get_task(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    _require_extension(ctx)
    request = TaskIdParams.model_validate(params)
    record = await services.store.get_task(request.task_id, ctx.principal)
    if record is None:
        # Unknown and foreign tasks answer alike, so a task's existence never leaks.
        raise InvalidParams(UNKNOWN_TASK)
    return dump(await detailed_task(services, record))


async def detailed_task(services: Services, record: TaskRecord) -> DetailedTaskResult:
    """The DetailedTask for a row: what tasks/get (and push notifications) carry."""
    detailed = DetailedTaskResult(
        task_id=record.task_id,
        status=record.status,
        status_message=record.status_message,
        created_at=iso(record.created_at),
        last_updated_at=iso(record.last_updated_at),
        ttl_ms=record.reported_ttl_ms(),
        poll_interval_ms=record.poll_interval_ms,
    )
    if record.status == "completed":
        detailed.result = record.result or {"content": [], "isError": False}
    elif record.status == "failed":
        detailed.error = record.error or {"code": codes.INTERNAL_ERROR, "message": "The task failed"}
    elif record.status == "input_required":
        inputs = await services.store.outstanding_inputs(record.task_id)
        detailed.input_requests = {item.key: _input_entry(item.method, item.params) for item in inputs}
    return detailed


async def update_task(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    _require_extension(ctx)
    request = TaskUpdateParams.model_validate(params)
    record = await services.store.get_task(request.task_id, ctx.principal)
    if record is None:
        raise InvalidParams(UNKNOWN_TASK)
    await record_answers(services, record, request.input_responses)
    return dump(EmptyAck())


async def record_answers(services: Services, record: TaskRecord, responses: dict[str, Any]) -> None:
    """Record answers to outstanding keys; ignore the rest (S-31); one bad answer records none."""
    if record.status != "input_required":
        return
    outstanding = {item.key: item for item in await services.store.outstanding_inputs(record.task_id)}
    answers: dict[str, Any] = {}
    for key, response in responses.items():
        item = outstanding.get(key)
        if item is None:
            continue  # never issued, already answered or superseded: ignored, still acked
        answers[key] = validate_response(key, item.method, item.params, response)
    if answers:
        outcome = await services.store.record_answers(record.task_id, answers)
        if outcome.answered and outcome.inbox:
            services.publisher.wake(outcome.inbox, record.task_id)


async def cancel_task(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    _require_extension(ctx)
    request = TaskIdParams.model_validate(params)
    found = await request_cancel(services, request.task_id, ctx.principal, None)
    if not found:
        raise InvalidParams(UNKNOWN_TASK)
    # An ack, also for a task that was already terminal (conformance: idempotent ack).
    return dump(EmptyAck())


async def request_cancel(services: Services, task_id: str, owner: str, message: str | None) -> bool:
    outcome = await services.store.request_cancel(task_id, owner, message)
    if outcome.cancelled_now and outcome.job_id:
        metrics.cancels_requested.labels(outcome.tool or "unknown").inc()
        if outcome.previous_status == "input_required" and outcome.inbox:
            services.publisher.wake(outcome.inbox, task_id)
        # Without terminate: a queued job then never starts; a running one notices the row.
        services.publisher.revoke(outcome.job_id)
    return outcome.found
