"""Protocol 2025-11-25 on the same endpoint: handlers over the same task service, rows and jobs.

``initialize`` opens a session kept in Postgres (any replica serves it; DELETE ends it); its
declared capabilities stand in for the per-request ``_meta`` of 2026-07-28. A tools/call
without a task runs the same Celery job and answers on an SSE stream, where the job's input
requests become real server-to-client requests (``elicitation/create``,
``sampling/createMessage``, ``roots/list``); the client POSTs its response, which is recorded
like a tasks/update. Clients may send ``params.task`` (SEP-1686): a nested ``CreateTaskResult``,
``tasks/get``, the blocking ``tasks/result`` (input requests relayed with related-task
``_meta``), ``tasks/list`` scoped to the principal, and ``tasks/cancel`` with that revision's
rules. SEP-2663 never applies on such a session.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Final

import pydantic_core

from mcp_celery_tasks.errors import InvalidParams, MethodNotFound, ProtocolError, QuotaExceeded
from mcp_celery_tasks.json_types import JSONObject, as_array, as_object
from mcp_celery_tasks.lifecycle import COMPLETED, FAILED
from mcp_celery_tasks.protocol import v2026_07_28 as modern
from mcp_celery_tasks.protocol.relay import Relay
from mcp_celery_tasks.protocol.rpc import Result, Stream, WithHeaders, error_body
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import (
    InitializeResult,
    LegacyCreateTaskResult,
    LegacyListTasksResult,
    LegacyListToolsResult,
    LegacyTask,
    LegacyTool,
    Message,
    ServerRequest,
)
from mcp_celery_tasks.protocol.synccall import RELATED, Legacy, SyncCall, held, legacy_message, reserve
from mcp_celery_tasks.store import TaskRecord
from mcp_celery_tasks.tasks.idempotency import idempotency_key
from mcp_celery_tasks.tasks.service import RequestContext, TaskView
from mcp_celery_tasks.tools.registry import InvalidArguments, ToolSpec, all_tools
from mcp_celery_tasks.wire import (
    LEGACY_VERSIONS,
    CallToolParams,
    LegacyCallToolParams,
    LegacyListParams,
    LegacyParams,
    LegacyTaskParams,
    SetLevelParams,
    iso,
    progress_token,
)

__all__ = [
    "LEGACY_VERSIONS",
    "call_tool",
    "cancel_task",
    "client_response",
    "get_task",
    "initialize",
    "list_tasks",
    "list_tools",
    "ping",
    "set_level",
    "task_result",
]

INPUT_ID_PREFIX: Final = "mcp-input/"
PAGE: Final = 50


# ---- the wire shape of a task (SEP-1686) ----------------------------------------------------


def task(record: TaskRecord) -> LegacyTask:
    """A SEP-1686 Task: ``ttl`` and ``pollInterval`` (not SEP-2663's ``…Ms`` names)."""
    status = record.status
    if status == COMPLETED and (record.result or {}).get("isError"):
        status = FAILED  # SEP-1686 "Task Execution Errors": a tool error fails the task
    shown: LegacyTask = {
        "taskId": record.task_id,
        "status": status,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.last_updated_at),
        "ttl": record.reported_ttl_ms(),
        "pollInterval": record.poll_interval_ms,
    }
    message = record.status_message
    if status == FAILED and not message:
        message = _failure_message(record)
    if message:
        shown["statusMessage"] = message
    return shown


def _failure_message(record: TaskRecord) -> str | None:
    """What went wrong, for a failed SEP-1686 task (its statusMessage SHOULD say so)."""
    if record.error:
        return str(record.error.get("message") or "") or None
    blocks = [as_object(block) for block in as_array((record.result or {}).get("content", []))]
    texts = [block.get("text") for block in blocks if block.get("type") == "text"]
    return " ".join(t for t in texts if isinstance(t, str) and t) or None


# ---- initialize, ping, tools/list ------------------------------------------------------------


async def initialize(services: Services, ctx: RequestContext, params: LegacyParams) -> Result:
    extra = params.model_extra or {}
    requested = extra.get("protocolVersion")
    version = requested if requested in LEGACY_VERSIONS else LEGACY_VERSIONS[0]
    capabilities = extra.get("capabilities") if isinstance(extra.get("capabilities"), dict) else {}
    client_info = extra.get("clientInfo") if isinstance(extra.get("clientInfo"), dict) else None
    declared = len(pydantic_core.to_json([capabilities, client_info]))
    limit = services.settings.max_client_info_bytes
    if declared > limit:
        raise InvalidParams(f"capabilities and clientInfo are {declared} bytes, more than {limit}")
    session_id = secrets.token_urlsafe(24)
    opened = await services.tasks.open_session(
        session_id, ctx.principal, version, capabilities or {}, client_info
    )
    if not opened:
        most = services.settings.max_sessions_per_principal
        raise QuotaExceeded(
            f"Too many open sessions: at most {most}; end unused ones (HTTP DELETE) or let them expire",
            limit="sessions",
            maximum=most,
        )
    result: InitializeResult = {
        "protocolVersion": version,
        "capabilities": {
            "tools": {"listChanged": False},
            # Jobs' ctx.log reaches synchronous calls at the session's logging/setLevel.
            "logging": {},
            "resources": {},  # artifacts (``protocol.resources``)
            # SEP-1686's capability, only in this era (SEP-2663 forbids it on 2026-07-28).
            "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
        },
        "serverInfo": services.server_info,
        "instructions": "Long tools run as Celery jobs; declare capabilities.tasks to call them as tasks.",
    }
    return WithHeaders(result, {"Mcp-Session-Id": session_id})


async def ping(services: Services, ctx: RequestContext, params: LegacyParams) -> Mapping[str, object]:
    return {}


async def set_level(services: Services, ctx: RequestContext, params: SetLevelParams) -> Mapping[str, object]:
    """``logging/setLevel``: the session's later synchronous calls get the jobs' log messages
    at this level and above (never its tasks)."""
    assert ctx.session_id is not None
    if not await services.tasks.set_log_level(ctx.session_id, ctx.principal, params.level):
        raise InvalidParams("Session not found")
    return {}


async def list_tools(
    services: Services, ctx: RequestContext, params: LegacyListParams
) -> LegacyListToolsResult:
    if params.cursor is not None:
        raise InvalidParams("Invalid cursor: the tool list has one page")
    tools: list[LegacyTool] = []
    for spec in all_tools():
        entry: LegacyTool
        if spec.description:
            entry = {
                "name": spec.name,
                "inputSchema": spec.input_schema,
                "description": spec.description,
                "execution": {"taskSupport": spec.mode},
            }
        else:
            entry = {
                "name": spec.name,
                "inputSchema": spec.input_schema,
                "execution": {"taskSupport": spec.mode},
            }
        tools.append(entry)
    return {"tools": tools}


# ---- tools/call -------------------------------------------------------------------------------


async def call_tool(services: Services, ctx: RequestContext, params: LegacyCallToolParams) -> Result:
    key = idempotency_key(params.meta)
    try:
        spec, arguments = modern.resolve_call(
            services, CallToolParams(name=params.name, arguments=params.arguments), ctx.scopes
        )
    except InvalidArguments as exc:  # a tool execution error the model can correct
        return {"content": [{"type": "text", "text": exc.message}], "isError": True}
    modern.require_inputs(spec, ctx)
    # SEP-1686: the request opts in with params.task (the server advertised tasks.requests).
    wants_task = params.task is not None
    if spec.mode == "required" and not wants_task:
        # SEP-1686 "Tool-Level Negotiation": a task-required tool called without a task.
        raise MethodNotFound("This tool requires task-augmented invocation (params.task)")
    if spec.questions_first(arguments, ctx.principal):
        raise InvalidParams(
            f"{spec.name!r} asks questions before it starts; call it with a 2026-07-28 client"
        )
    as_task = wants_task and spec.mode != "forbidden"
    retention_ms: int | None = None
    requested_ttl = (params.task or {}).get("ttl") if as_task else None
    if isinstance(requested_ttl, int) and not isinstance(requested_ttl, bool) and requested_ttl > 0:
        retention_ms = min(requested_ttl, services.settings.max_retention_ms)  # the client's ask (SEP-1686)
    relay = Relay(None, False)
    if not as_task and ctx.accepts_sse:
        # A synchronous call's stream carries the job's progress (when the request has a
        # progressToken) and logs (at the session's logging/setLevel); a task's never does.
        level = ctx.meta.log_level if ctx.meta is not None else None
        relay = Relay(progress_token(params.meta), level is not None)
    if as_task:
        return await _create(services, ctx, spec, arguments, True, retention_ms, relay, key)
    # A synchronous call holds its slot before its task exists (issue 33).
    hold = reserve(services, ctx.principal, stream=ctx.accepts_sse)
    return await held(hold, _create(services, ctx, spec, arguments, False, retention_ms, relay, key))


async def _create(
    services: Services,
    ctx: RequestContext,
    spec: ToolSpec,
    arguments: JSONObject,
    as_task: bool,
    retention_ms: int | None,
    relay: Relay,
    key: str | None,
) -> Result:
    record = await services.tasks.create(
        ctx,
        spec,
        arguments,
        as_task=as_task,
        retention_ms=retention_ms,
        log_level=ctx.meta.log_level if relay.logs and ctx.meta is not None else None,
        idempotency_key=key,
    )
    if as_task:
        created: LegacyCreateTaskResult = {"task": task(record)}
        return created
    return _answer_when_done(services, ctx, record.task_id, related=False, relay=relay)


def _answer_when_done(
    services: Services, ctx: RequestContext, task_id: str, *, related: bool, relay: Relay | None = None
) -> Result:
    if ctx.accepts_sse:
        return Stream(_follow(services, ctx, task_id, related=related, relay=relay or Relay(None, False)))
    return SyncCall(services, ctx, task_id, Legacy(related), cancels_if_abandoned=not related)


async def _follow(
    services: Services, ctx: RequestContext, task_id: str, *, related: bool, relay: Relay
) -> AsyncIterator[Message]:
    """Relay the job's input requests as server requests (and its progress and logs, when
    asked), then answer with its outcome."""
    tasks = services.tasks
    sent: set[str] = set()
    finished = False
    deadline = tasks.sync_deadline()
    news = relay.news if relay.wanted else None
    try:
        while True:
            view = await tasks.wait_for_outcome(
                task_id, ctx.principal, relay_inputs=True, known=sent, news=news, deadline=deadline
            )
            if view is not None and news is not None:
                for message in await relay.notifications(services, view.record):
                    yield message
            if view is None or not view.record.active:
                finished = True
                yield legacy_message(ctx.request_id, view.record if view else None, related)
                return
            if all(item.key in sent for item in view.inputs):
                if asyncio.get_running_loop().time() < deadline:
                    continue  # only progress or logs were new
                yield error_body(ctx.request_id, ProtocolError("The tool did not finish in time"))
                return
            for request in _server_requests(view, sent, related):
                yield request
    finally:
        if not finished and not related:
            # The synchronous caller left (or timed out): its task must not run on for nobody.
            await tasks.cancel(task_id, ctx.principal, "the caller went away")


def _server_requests(view: TaskView, sent: set[str], related: bool) -> list[ServerRequest]:
    """The input requests not relayed yet, as server-to-client JSON-RPC requests."""
    requests: list[ServerRequest] = []
    for item in view.inputs:
        if item.key in sent:
            continue
        sent.add(item.key)
        request: ServerRequest = {
            "jsonrpc": "2.0",
            "id": f"{INPUT_ID_PREFIX}{view.record.task_id}/{item.key}",
            "method": item.method,
        }
        if item.params is not None or related:
            request_params: JSONObject = dict(item.params or {})
            if related:
                request_params["_meta"] = {RELATED: {"taskId": view.record.task_id}}
            request["params"] = request_params
        requests.append(request)
    return requests


async def client_response(services: Services, principal: str, body: JSONObject) -> None:
    """The client's answer to one of our server-to-client requests (recorded like tasks/update;
    anything that does not fit is ignored and leaves the request outstanding)."""
    response_id = str(body.get("id", ""))
    if not response_id.startswith(INPUT_ID_PREFIX):
        return
    task_id, _, key = response_id.removeprefix(INPUT_ID_PREFIX).partition("/")
    record = await services.tasks.find(task_id, principal)
    if record is None:
        return
    result = body.get("result")
    answer: JSONObject
    if isinstance(result, dict):
        answer = dict(result)
        answer.pop("_meta", None)
    else:
        answer = {"action": "decline"}  # the client refused the request
    try:
        await services.tasks.answer(record, {key: answer})
    except InvalidParams:
        return


# ---- SEP-1686 tasks/* -------------------------------------------------------------------------


async def get_task(services: Services, ctx: RequestContext, params: LegacyTaskParams) -> LegacyTask:
    return task(await services.tasks.get(params.task_id, ctx.principal))


async def task_result(services: Services, ctx: RequestContext, params: LegacyTaskParams) -> Result:
    hold = reserve(services, ctx.principal, stream=ctx.accepts_sse)  # a wait like a synchronous call's
    return await held(hold, _result_when_done(services, ctx, params.task_id))


async def _result_when_done(services: Services, ctx: RequestContext, task_id: str) -> Result:
    record = await services.tasks.get(task_id, ctx.principal)
    return _answer_when_done(services, ctx, record.task_id, related=True)


async def list_tasks(
    services: Services, ctx: RequestContext, params: LegacyListParams
) -> LegacyListTasksResult:
    after: tuple[datetime, str] | None = None
    if params.cursor is not None:
        try:
            stamp, _, task_id = base64.urlsafe_b64decode(params.cursor.encode()).decode().partition("|")
            after = (datetime.fromisoformat(stamp), task_id)
        except ValueError as exc:  # includes binascii.Error and UnicodeDecodeError
            raise InvalidParams("Invalid cursor") from exc
        if "\x00" in task_id or after[0].tzinfo is None:
            raise InvalidParams("Invalid cursor")
    # A session's own tasks: never another client's, also when auth is off (everyone is anon).
    assert ctx.session_id is not None
    records = await services.tasks.session_tasks(ctx.principal, ctx.session_id, PAGE + 1, after)
    result: LegacyListTasksResult = {"tasks": [task(r) for r in records[:PAGE]]}
    if len(records) > PAGE:
        last = records[PAGE - 1]
        token = f"{last.created_at.isoformat()}|{last.task_id}".encode()
        result["nextCursor"] = base64.urlsafe_b64encode(token).decode()
    return result


async def cancel_task(services: Services, ctx: RequestContext, params: LegacyTaskParams) -> LegacyTask:
    record = await services.tasks.get(params.task_id, ctx.principal)
    if not record.active:
        # SEP-1686: cancelling a terminal task is an error (SEP-2663 acknowledges instead).
        raise InvalidParams(f"Cannot cancel a task in terminal status {record.status!r}")
    await services.tasks.cancel(record.task_id, ctx.principal, "cancelled by the client")
    updated = await services.tasks.find(record.task_id, ctx.principal)
    return task(updated or record)
