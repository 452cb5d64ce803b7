"""Protocol 2025-11-25 on the same endpoint, from the same rows and jobs.

``initialize`` opens a session kept in Postgres (any replica serves it; DELETE ends it). A
tools/call without a task runs the same Celery job and answers on an SSE stream, where the
job's input requests become real server-to-client requests (``elicitation/create``,
``sampling/createMessage``, ``roots/list``); the client POSTs its response, which is recorded
like a tasks/update and wakes the worker. Clients may
send ``params.task`` (SEP-1686): a nested ``CreateTaskResult``, ``tasks/get``, the blocking
``tasks/result`` (input requests relayed with related-task ``_meta``), ``tasks/list`` scoped
to the principal, and ``tasks/cancel`` with that revision's rules. SEP-2663 never applies
on such a session, and a request carrying 2026-07-28 ``_meta`` is served statelessly.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from mcp_celery_tasks.errors import InvalidParams, InvalidRequest, MethodNotFound, ProtocolError
from mcp_celery_tasks.handlers import (
    UNKNOWN_TASK,
    Deferred,
    RequestContext,
    Services,
    StoredError,
    record_answers,
    request_cancel,
    start_job,
)
from mcp_celery_tasks.push import Stream
from mcp_celery_tasks.registry import all_tools, get_tool
from mcp_celery_tasks.store import TaskRecord
from mcp_celery_tasks.wire import CallToolParams, RequestMeta, iso

__all__ = ["LEGACY_VERSIONS", "LegacyResult", "handle", "is_legacy"]

LEGACY_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26")
RELATED: Final = "io.modelcontextprotocol/related-task"
INPUT_ID_PREFIX: Final = "mcp-input/"
PAGE: Final = 50


@dataclass(frozen=True)
class LegacyResult:
    """A legacy reply: a result, a stream or a deferred, an HTTP status, extra headers."""

    status: int
    body: dict[str, Any] | None = None
    stream: Stream | None = None
    deferred: Deferred | None = None
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Session:
    session_id: str
    owner: str
    protocol_version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any] | None


def is_legacy(body: Any, session_id: str | None, header_version: str | None = None) -> bool:
    """Whether a request belongs to the handshake era (2025-11-25 and before)."""
    if not isinstance(body, dict):
        return False
    params = body.get("params")
    modern = (
        isinstance(params, dict)
        and isinstance(params.get("_meta"), dict)
        and ("io.modelcontextprotocol/protocolVersion" in params["_meta"])
    )
    if modern or (header_version is not None and header_version not in LEGACY_VERSIONS):
        # A 2026-07-28 request is served statelessly, session header or not; there,
        # ``initialize`` does not exist (-32601, HTTP 404).
        return False
    return body.get("method") == "initialize" or session_id is not None


async def handle(
    services: Services, body: dict[str, Any], session_id: str | None, principal: str, accepts_sse: bool
) -> LegacyResult:
    request_id = body.get("id")
    method = body.get("method")
    if method is None:
        return await _client_response(services, body, principal)
    if method == "initialize":
        return await _initialize(services, body.get("params", {}), principal, request_id)
    assert session_id is not None
    row = await services.store.get_session(session_id, principal)
    if row is None:
        # 2025-11-25 Streamable HTTP: an unknown session is 404; the client initializes again.
        return LegacyResult(404, _error(request_id, InvalidRequest("Session not found")))
    session = Session(
        row["session_id"],
        row["owner"],
        row["protocol_version"],
        row["client_capabilities"],
        row["client_info"],
    )
    if "id" not in body:
        return LegacyResult(202)  # notifications/initialized, notifications/cancelled, …
    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    handler = _METHODS.get(str(method))
    if handler is None:
        raise MethodNotFound(f"Method not found: {method}")
    return await handler(services, session, params, request_id, accepts_sse)


def _error(request_id: Any, error: ProtocolError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_error()}


def _ok(request_id: Any, result: dict[str, Any]) -> LegacyResult:
    return LegacyResult(200, {"jsonrpc": "2.0", "id": request_id, "result": result})


async def _initialize(services: Services, params: Any, principal: str, request_id: Any) -> LegacyResult:
    if not isinstance(params, dict):
        raise InvalidParams("initialize params must be an object")
    requested = params.get("protocolVersion")
    version = requested if requested in LEGACY_VERSIONS else LEGACY_VERSIONS[0]
    capabilities = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
    session_id = secrets.token_urlsafe(24)
    client_info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else None
    await services.store.create_session(session_id, principal, version, capabilities or {}, client_info)
    result = {
        "protocolVersion": version,
        "capabilities": {
            "tools": {"listChanged": False},
            # SEP-1686's capability, only in this era (SEP-2663 forbids it on 2026-07-28).
            "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
        },
        "serverInfo": {"name": services.settings.server_name, "version": services.server_version},
        "instructions": "Long tools run as Celery jobs; declare capabilities.tasks to call them as tasks.",
    }
    reply = _ok(request_id, result)
    return LegacyResult(reply.status, reply.body, headers={"Mcp-Session-Id": session_id})


async def _ping(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    return _ok(rid, {})


async def _list_tools(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    tools = []
    for spec in all_tools():
        entry: dict[str, Any] = {"name": spec.name, "inputSchema": spec.input_schema}
        if spec.description:
            entry["description"] = spec.description
        entry["execution"] = {"taskSupport": spec.mode}
        tools.append(entry)
    return _ok(rid, {"tools": tools})


def _context(session: Session) -> RequestContext:
    meta = RequestMeta.model_validate(
        {
            "io.modelcontextprotocol/protocolVersion": session.protocol_version,
            "io.modelcontextprotocol/clientCapabilities": session.capabilities,
            "io.modelcontextprotocol/clientInfo": session.client_info,
        }
    )
    return RequestContext(principal=session.owner, meta=meta)


async def _call_tool(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    call = CallToolParams.model_validate(params)
    spec = get_tool(call.name)
    if spec is None:
        raise InvalidParams(f"Unknown tool: {call.name}")
    arguments = spec.validate_arguments(call.arguments or {})
    # SEP-1686: the request opts in with params.task (the server advertised tasks.requests).
    wants_task = isinstance(params.get("task"), dict)
    if spec.mode == "required" and not wants_task:
        # SEP-1686 "Tool-Level Negotiation": a task-required tool called without a task.
        raise MethodNotFound("This tool requires task-augmented invocation (params.task)")
    if spec.questions_first(arguments):
        raise InvalidParams(
            f"{spec.name!r} asks questions before it starts; call it with a 2026-07-28 client"
        )
    as_task = wants_task and spec.mode != "forbidden"
    retention_ms: int | None = None
    requested_ttl = params["task"].get("ttl") if as_task else None
    if isinstance(requested_ttl, int) and not isinstance(requested_ttl, bool) and requested_ttl > 0:
        retention_ms = min(requested_ttl, services.settings.max_retention_ms)  # the client's ask (SEP-1686)
    record = await start_job(
        services, _context(session), spec, arguments, as_task=as_task, retention_ms=retention_ms
    )
    if as_task:
        return _ok(rid, {"task": _task(record)})
    if sse:
        return LegacyResult(
            200, stream=Stream(_follow(services, session, rid, record.task_id, related=False))
        )
    return LegacyResult(
        200, deferred=Deferred(lambda: _final(services, session, record.task_id, related=False))
    )


def _task(record: TaskRecord) -> dict[str, Any]:
    """A SEP-1686 Task: ``ttl`` and ``pollInterval`` (not SEP-2663's ``…Ms`` names)."""
    status = record.status
    if status == "completed" and (record.result or {}).get("isError"):
        status = "failed"  # SEP-1686 "Task Execution Errors": a tool error fails the task
    task: dict[str, Any] = {
        "taskId": record.task_id,
        "status": status,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.last_updated_at),
        "ttl": record.reported_ttl_ms(),
        "pollInterval": record.poll_interval_ms,
    }
    if record.status_message:
        task["statusMessage"] = record.status_message
    return task


async def _owned(services: Services, session: Session, params: dict[str, Any]) -> TaskRecord:
    task_id = params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidParams("taskId is required")
    record = await services.store.get_task(task_id, session.owner)
    if record is None:
        raise InvalidParams(UNKNOWN_TASK)
    return record


async def _get_task(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    return _ok(rid, _task(await _owned(services, session, params)))


async def _task_result(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    record = await _owned(services, session, params)
    if sse:
        return LegacyResult(200, stream=Stream(_follow(services, session, rid, record.task_id, related=True)))
    return LegacyResult(
        200, deferred=Deferred(lambda: _final(services, session, record.task_id, related=True))
    )


async def _list_tasks(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    after: tuple[datetime, str] | None = None
    cursor = params.get("cursor")
    if cursor is not None:
        try:
            stamp, _, task_id = base64.urlsafe_b64decode(str(cursor).encode()).decode().partition("|")
            after = (datetime.fromisoformat(stamp), task_id)
        except ValueError as exc:  # includes binascii.Error and UnicodeDecodeError
            raise InvalidParams("Invalid cursor") from exc
        if "\x00" in task_id or after[0].tzinfo is None:
            raise InvalidParams("Invalid cursor")
    records = await services.store.list_tasks(session.owner, PAGE + 1, after)
    result: dict[str, Any] = {"tasks": [_task(r) for r in records[:PAGE]]}
    if len(records) > PAGE:
        last = records[PAGE - 1]
        token = f"{last.created_at.isoformat()}|{last.task_id}".encode()
        result["nextCursor"] = base64.urlsafe_b64encode(token).decode()
    return _ok(rid, result)


async def _cancel_task(
    services: Services, session: Session, params: dict[str, Any], rid: Any, sse: bool
) -> LegacyResult:
    record = await _owned(services, session, params)
    if not record.active:
        # SEP-1686: cancelling a terminal task is an error (SEP-2663 acknowledges instead).
        raise InvalidParams(f"Cannot cancel a task in terminal status {record.status!r}")
    await request_cancel(services, record.task_id, session.owner, "cancelled by the client")
    updated = await services.store.get_task(record.task_id, session.owner)
    return _ok(rid, _task(updated or record))


async def _follow(
    services: Services, session: Session, request_id: Any, task_id: str, *, related: bool
) -> AsyncIterator[dict[str, Any]]:
    """Relay the job's input requests as server requests, then answer with its result."""
    sent: set[str] = set()
    owner = session.owner
    finished = False
    try:
        while True:
            record = await services.events.wait_for(
                task_id,
                owner,
                services.settings.max_sync_wait_seconds,
                until=lambda r: not r.active or r.status == "input_required",
            )
            if record is None or not record.active:
                finished = True
                yield _response(request_id, record, related)
                return
            if record.status != "input_required":  # max_sync_wait ran out
                yield _error(request_id, ProtocolError("The tool did not finish in time"))
                return
            fresh = [
                item for item in await services.store.outstanding_inputs(task_id) if item.key not in sent
            ]
            for item in fresh:
                sent.add(item.key)
                request_params = dict(item.params or {})
                if related:
                    request_params["_meta"] = {RELATED: {"taskId": task_id}}
                yield {
                    "jsonrpc": "2.0",
                    "id": f"{INPUT_ID_PREFIX}{task_id}/{item.key}",
                    "method": item.method,
                    **({"params": request_params} if item.params is not None or related else {}),
                }
            seen = record.last_updated_at
            await services.events.wait_for(
                task_id,
                owner,
                30.0,
                until=lambda r, seen=seen: r.status != "input_required" or r.last_updated_at != seen,  # type: ignore[misc]
            )
    finally:
        if not finished and not related:
            # The synchronous caller left (or timed out): its task must not run on for nobody.
            await asyncio.shield(request_cancel(services, task_id, owner, "the caller went away"))


def _response(request_id: Any, record: TaskRecord | None, related: bool) -> dict[str, Any]:
    if record is None:
        return _error(request_id, InvalidParams(UNKNOWN_TASK))
    if record.status == "completed":
        result = dict(record.result or {"content": [], "isError": False})
        result.pop("resultType", None)
        if related:
            result["_meta"] = {**(result.get("_meta") or {}), RELATED: {"taskId": record.task_id}}
        return {"jsonrpc": "2.0", "id": request_id, "result": result}
    if record.status == "failed" and record.error:
        return {"jsonrpc": "2.0", "id": request_id, "error": record.error}
    return _error(request_id, ProtocolError("The task was cancelled"))


async def _final(services: Services, session: Session, task_id: str, *, related: bool) -> dict[str, Any]:
    record = await services.events.wait_for(task_id, session.owner, services.settings.max_sync_wait_seconds)
    message = _response(None, record, related)
    if "error" in message:
        error = message["error"]
        if isinstance(error, dict) and "code" in error:
            raise StoredError(error)
    result: dict[str, Any] = message["result"]
    return result


async def _client_response(services: Services, body: dict[str, Any], principal: str) -> LegacyResult:
    """The client's answer to one of our server-to-client requests."""
    response_id = str(body.get("id", ""))
    if not response_id.startswith(INPUT_ID_PREFIX):
        return LegacyResult(202)
    task_id, _, key = response_id.removeprefix(INPUT_ID_PREFIX).partition("/")
    record = await services.store.get_task(task_id, principal)
    if record is None:
        return LegacyResult(202)
    if "result" in body and isinstance(body["result"], dict):
        answer = dict(body["result"])
        answer.pop("_meta", None)
    else:
        answer = {"action": "decline"}  # the client refused the request
    try:
        await record_answers(services, record, {key: answer})
    except InvalidParams:
        return LegacyResult(202)  # a malformed answer leaves the request outstanding
    return LegacyResult(202)


_METHODS = {
    "ping": _ping,
    "tools/list": _list_tools,
    "tools/call": _call_tool,
    "tasks/get": _get_task,
    "tasks/result": _task_result,
    "tasks/list": _list_tasks,
    "tasks/cancel": _cancel_task,
}
