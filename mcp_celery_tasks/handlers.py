"""What each JSON-RPC method does, for protocol 2026-07-28. No HTTP, no Celery."""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import (
    InternalError,
    InvalidParams,
    MissingCapability,
    ProtocolError,
)
from mcp_celery_tasks.events import TaskEvents
from mcp_celery_tasks.registry import ToolSpec, all_tools, get_tool
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
    def publish_job(self, job_id: str, queue_name: str) -> None: ...
    def wake(self, inbox: str, task_id: str) -> None: ...
    def revoke(self, job_id: str) -> None: ...


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: ApiStore
    events: TaskEvents
    publisher: Publisher
    server_version: str


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
    call = CallToolParams.model_validate(params)
    spec = get_tool(call.name)
    if spec is None:
        raise InvalidParams(f"Unknown tool: {call.name}")
    arguments = spec.validate_arguments(call.arguments or {})
    tasked = ctx.declares_tasks
    if spec.mode == "required" and not tasked:
        # SEP-2663: a server that cannot answer without a task MUST say -32021 (HTTP 400).
        raise MissingCapability()
    as_task = tasked and spec.mode != "forbidden"
    settings = services.settings
    retention_ms = int(spec.retention_seconds * 1000) if spec.retention_seconds else settings.retention_ms
    assert ctx.meta is not None
    record = await services.store.create_task(
        NewTask(
            task_id=new_task_id(),
            job_id=str(uuid.uuid4()),
            owner=ctx.principal,
            tool_name=spec.name,
            arguments=arguments,
            queue=spec.queue or settings.default_queue,
            ttl_ms=retention_ms,
            retention_ms=min(retention_ms, settings.max_retention_ms),
            poll_interval_ms=spec.poll_interval_ms or settings.poll_interval_ms,
            max_attempts=spec.max_attempts or settings.max_attempts,
            protocol_version=ctx.meta.protocol_version,
            client_capabilities=ctx.meta.client_capabilities,
            client_info=ctx.meta.client_info,
        )
    )
    # The row is committed (autocommit): a tasks/get for this id resolves from here on
    # (SEP-2663 S-12). Publishing happens off the loop; the sweeper covers a crash here.
    services.publisher.publish_job(record.job_id, record.queue)
    if as_task:
        return dump(_created(record))
    return Deferred(lambda: _await_sync(services, ctx, record))


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


async def _await_sync(services: Services, ctx: RequestContext, record: TaskRecord) -> dict[str, Any]:
    """Wait for a synchronous call's job; cancel the task if the caller goes away."""
    try:
        final = await services.events.wait_terminal(
            record.task_id, ctx.principal, services.settings.max_sync_wait_seconds
        )
    except asyncio.CancelledError:
        await asyncio.shield(_cancel(services, record.task_id, ctx.principal, "the caller went away"))
        raise
    if final is None:
        raise InternalError("the task disappeared before it finished")
    if final.active:
        await _cancel(services, record.task_id, ctx.principal, "max_sync_wait exceeded")
        raise ProtocolError(
            f"The tool did not finish within {services.settings.max_sync_wait_seconds:.0f} s; "
            "call it as a task (declare the io.modelcontextprotocol/tasks extension) instead"
        )
    if final.status == "completed" and final.result is not None:
        return final.result
    if final.status == "failed" and final.error is not None:
        error = final.error
        raise _StoredError(error)
    raise ProtocolError("The tool call was cancelled")


class _StoredError(ProtocolError):
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
        detailed.input_requests = {
            item.key: {"method": item.method, **({"params": item.params} if item.params is not None else {})}
            for item in inputs
        }
    return detailed


async def update_task(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    _require_extension(ctx)
    request = TaskUpdateParams.model_validate(params)
    if not await services.store.task_exists(request.task_id, ctx.principal):
        raise InvalidParams(UNKNOWN_TASK)
    # Keys that are not outstanding are ignored and the update still acknowledged (S-31).
    # Recording answers to outstanding keys arrives with input requests.
    return dump(EmptyAck())


async def cancel_task(services: Services, ctx: RequestContext, params: dict[str, Any]) -> Result:
    _require_extension(ctx)
    request = TaskIdParams.model_validate(params)
    found = await _cancel(services, request.task_id, ctx.principal, None)
    if not found:
        raise InvalidParams(UNKNOWN_TASK)
    # An ack, also for a task that was already terminal (conformance: idempotent ack).
    return dump(EmptyAck())


async def _cancel(services: Services, task_id: str, owner: str, message: str | None) -> bool:
    outcome = await services.store.request_cancel(task_id, owner, message)
    if outcome.cancelled_now and outcome.job_id:
        if outcome.previous_status == "input_required" and outcome.inbox:
            services.publisher.wake(outcome.inbox, task_id)
        # Without terminate: a queued job then never starts; a running one notices the row.
        services.publisher.revoke(outcome.job_id)
    return outcome.found
