"""The protocol layer over in-memory doubles: dispatch, the method table, both eras' handlers and
the task service, in milliseconds. The e2e tests run the same paths on Postgres and a broker."""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.protocol import methods
from mcp_celery_tasks.protocol.dispatch import dispatch
from mcp_celery_tasks.protocol.rpc import Headers, Reply, settle
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.protocol.shapes import Response
from mcp_celery_tasks.tools.registry import tool
from tests.memory_api import MemoryApiStore, RecordingPublisher
from tests.unit.conftest import meta

OWNER = "token:alice"
STRANGER = "token:mallory"


@tool(name="u_optional", mode="optional")
def u_optional(seconds: float = 1.0) -> str:
    """An optional-task tool."""
    return "ok"


@tool(name="u_required", mode="required")
def u_required() -> str:
    """A tool that only runs as a task."""
    return "ok"


@tool(name="u_forbidden", mode="forbidden", queue="gpu")
def u_forbidden(name: str) -> str:
    """Always synchronous."""
    return name


async def call(
    services: Services,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    principal: str = OWNER,
    extension: bool = True,
    name: str | None = None,
    session: str | None = None,
    legacy: bool = False,
) -> Reply:
    params = dict(params or {})
    if not legacy:
        params.setdefault("_meta", meta(extension))
    if name is None:
        name = params.get("name") if method == "tools/call" else params.get("taskId")
    headers = Headers(
        protocol_version=None if legacy else "2026-07-28",
        method=method,
        name=name,
        session_id=session,
    )
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    return await dispatch(services, body, headers, principal)


def result(reply: Reply) -> dict[str, Any]:
    assert reply.body is not None and "result" in reply.body, reply.body
    value: dict[str, Any] = dict(reply.body["result"])
    return value


def error(reply: Reply) -> dict[str, Any]:
    assert reply.body is not None and "error" in reply.body, reply.body
    value: dict[str, Any] = dict(reply.body["error"])
    return value


def answered(body: Response) -> dict[str, Any]:
    """The result of a settled response."""
    assert "result" in body, body
    return dict(body["result"])


# ---- the table ---------------------------------------------------------------------------------


def test_each_method_of_an_era_is_one_table_entry() -> None:
    seen = [(m.era, m.name) for m in methods.METHODS]
    assert len(seen) == len(set(seen))
    assert methods.lookup(methods.MODERN, "tasks/result") is None  # SEP-2663 removed it
    assert methods.lookup(methods.LEGACY, "tasks/result") is not None
    assert {"tools/call", "tasks/get", "subscriptions/listen", "initialize"} <= methods.NAMES


async def test_a_removed_method_is_not_found_with_http_404(services: Services) -> None:
    reply = await call(services, "tasks/list")
    assert reply.http_status == 404 and error(reply)["code"] == codes.METHOD_NOT_FOUND


async def test_results_carry_server_info(services: Services) -> None:
    discovered = result(await call(services, "server/discover"))
    assert discovered["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert "tasks" not in discovered["capabilities"]
    assert discovered["_meta"]["io.modelcontextprotocol/serverInfo"] == {
        "name": "mcp-celery-tasks",
        "version": "9.9.9",
    }


# ---- headers from the table ---------------------------------------------------------------------


async def test_mcp_name_must_match_the_param_the_table_names(services: Services) -> None:
    reply = await call(services, "tools/call", {"name": "u_optional"}, name="other")
    assert reply.http_status == 400 and error(reply)["code"] == codes.HEADER_MISMATCH


async def test_a_missing_mcp_name_is_refused_only_where_the_table_requires_it(services: Services) -> None:
    headers = Headers(protocol_version="2026-07-28", method="tools/call", name=None)
    body: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "u_optional", "_meta": meta()},
    }
    assert error(await dispatch(services, body, headers, OWNER))["code"] == codes.HEADER_MISMATCH
    headers = Headers(protocol_version="2026-07-28", method="tasks/get", name=None)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "x", "_meta": meta()}}
    assert error(await dispatch(services, body, headers, OWNER))["code"] == codes.INVALID_PARAMS


async def test_tasks_methods_need_the_extension_before_anything_else(services: Services) -> None:
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        reply = await call(services, method, {}, extension=False)  # params invalid too
        assert error(reply)["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY, method
        assert reply.http_status == 400


# ---- tools/call ----------------------------------------------------------------------------------


async def test_a_declaring_call_is_a_task_committed_and_published(
    services: Services, memory: MemoryApiStore, publisher: RecordingPublisher
) -> None:
    created = result(await call(services, "tools/call", {"name": "u_optional", "arguments": {"seconds": 2}}))
    assert created["resultType"] == "task" and created["status"] == "working"
    assert not {"result", "error", "inputRequests"} & created.keys()
    row = memory.rows[created["taskId"]]
    assert row.task.arguments == {"seconds": 2.0} and row.task.owner == OWNER
    assert publisher.jobs == [(row.task.job_id, "mcp.default")]


async def test_a_required_tool_without_the_extension_is_32021(services: Services) -> None:
    reply = await call(services, "tools/call", {"name": "u_required"}, extension=False)
    assert reply.http_status == 400
    assert error(reply)["data"] == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }


async def test_a_synchronous_call_waits_for_the_job_and_answers_its_result(
    services: Services, memory: MemoryApiStore, publisher: RecordingPublisher
) -> None:
    reply = await call(services, "tools/call", {"name": "u_forbidden", "arguments": {"name": "x"}})
    assert reply.sync is not None and publisher.jobs[0][1] == "gpu"
    (task_id,) = memory.rows
    waiting = asyncio.create_task(settle(reply))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    done = {"content": [{"type": "text", "text": "x"}], "isError": False, "resultType": "complete"}
    memory.as_worker_finish(task_id, "completed", result=done)
    body = await asyncio.wait_for(waiting, 2)
    assert answered(body)["content"] == done["content"]


async def test_settling_a_synchronous_call_never_reenters_dispatch_or_the_handler_module(
    services: Services, memory: MemoryApiStore
) -> None:
    reply = await call(services, "tools/call", {"name": "u_forbidden", "arguments": {"name": "x"}})
    (task_id,) = memory.rows
    done = {"content": [{"type": "text", "text": "x"}], "isError": False, "resultType": "complete"}
    memory.as_worker_finish(task_id, "completed", result=done)
    entered: set[str] = set()

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("mcp_celery_tasks."):
            entered.add(module)

    sys.setprofile(profile)
    try:
        body = await settle(reply)
    finally:
        sys.setprofile(None)
    assert answered(body)["content"] == done["content"]
    assert "mcp_celery_tasks.protocol.synccall" in entered  # the profile sees the package
    assert not entered & {
        "mcp_celery_tasks.protocol.dispatch",
        "mcp_celery_tasks.protocol.v2026_07_28",
        "mcp_celery_tasks.api.server",
    }


async def test_a_synchronous_caller_that_leaves_cancels_its_task(
    services: Services, memory: MemoryApiStore, publisher: RecordingPublisher
) -> None:
    reply = await call(services, "tools/call", {"name": "u_forbidden", "arguments": {"name": "x"}})
    assert reply.sync is not None
    (task_id,) = memory.rows
    waiting = asyncio.create_task(settle(reply))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert memory.rows[task_id].status == "cancelled"
    assert publisher.revokes == [memory.rows[task_id].task.job_id]


async def test_a_synchronous_job_that_asks_goes_back_as_an_mrtr_round_then_resumes(
    services: Services, memory: MemoryApiStore, publisher: RecordingPublisher
) -> None:
    reply = await call(services, "tools/call", {"name": "u_forbidden", "arguments": {"name": "x"}})
    assert reply.sync is not None
    (task_id,) = memory.rows
    waiting = asyncio.create_task(settle(reply))
    form = {"mode": "form", "message": "ok?", "requestedSchema": {"type": "object", "properties": {}}}
    memory.as_worker_ask(task_id, {"q": ("elicitation/create", form)})
    round_one = answered(await asyncio.wait_for(waiting, 2))
    assert round_one["resultType"] == "input_required" and "taskId" not in round_one
    assert round_one["inputRequests"] == {"q": {"method": "elicitation/create", "params": form}}
    retry = await call(
        services,
        "tools/call",
        {"name": "u_forbidden", "arguments": {"name": "x"}, "requestState": round_one["requestState"],
         "inputResponses": {"q": {"action": "accept", "content": {}}}},
    )  # fmt: skip
    job_id = memory.rows[task_id].task.job_id  # wake-ups name the job: task ids are bearer-like
    assert memory.rows[task_id].status == "working" and publisher.wakes == [("mcp.inbox.test", job_id)]
    assert len(memory.rows) == 1  # the retry fed the same task
    assert retry.sync is not None


async def test_a_request_state_from_another_principal_is_refused(
    services: Services, memory: MemoryApiStore
) -> None:
    reply = await call(services, "tools/call", {"name": "u_forbidden", "arguments": {"name": "x"}})
    assert reply.sync is not None
    (task_id,) = memory.rows
    waiting = asyncio.create_task(settle(reply))
    memory.as_worker_ask(task_id, {"q": ("roots/list", None)})
    state = answered(await asyncio.wait_for(waiting, 2))["requestState"]
    params = {"name": "u_forbidden", "arguments": {"name": "x"}, "requestState": state}
    assert (
        error(await call(services, "tools/call", params, principal=STRANGER))["code"] == codes.INVALID_PARAMS
    )


# ---- tasks/get, update, cancel -------------------------------------------------------------------


async def start(services: Services, principal: str = OWNER) -> str:
    created = result(await call(services, "tools/call", {"name": "u_optional"}, principal=principal))
    return str(created["taskId"])


async def test_foreign_and_unknown_tasks_answer_alike(services: Services) -> None:
    task_id = await start(services)
    foreign = error(await call(services, "tasks/get", {"taskId": task_id}, principal=STRANGER))
    unknown = error(await call(services, "tasks/get", {"taskId": "nope"}))
    assert foreign == unknown and foreign["code"] == codes.INVALID_PARAMS
    assert error(await call(services, "tasks/cancel", {"taskId": task_id}, principal=STRANGER)) == unknown


async def test_get_shows_each_status_with_its_field(services: Services, memory: MemoryApiStore) -> None:
    task_id = await start(services)
    working = result(await call(services, "tasks/get", {"taskId": task_id}))
    assert working["resultType"] == "complete" and working["status"] == "working"
    memory.as_worker_ask(task_id, {"a": ("roots/list", None)})
    waiting = result(await call(services, "tasks/get", {"taskId": task_id}))
    assert waiting["inputRequests"] == {"a": {"method": "roots/list"}}
    memory.as_worker_finish(task_id, "failed", error={"code": -32000, "message": "boom"}, message="boom")
    failed = result(await call(services, "tasks/get", {"taskId": task_id}))
    assert failed["error"] == {"code": -32000, "message": "boom"} and "result" not in failed
    assert isinstance(failed["ttlMs"], int) and failed["ttlMs"] > 0


async def test_update_records_outstanding_answers_only_and_wakes_the_worker(
    services: Services, memory: MemoryApiStore, publisher: RecordingPublisher
) -> None:
    task_id = await start(services)
    memory.as_worker_ask(task_id, {"a": ("roots/list", None), "b": ("roots/list", None)})
    ack = result(await call(services, "tasks/update", {"taskId": task_id, "inputResponses": {
        "a": {"roots": []}, "never-issued": {"ignored": True}}}))  # fmt: skip
    assert ack == {"resultType": "complete", "_meta": ack["_meta"]}
    assert memory.rows[task_id].status == "input_required"  # b still outstanding
    shown = result(await call(services, "tasks/get", {"taskId": task_id}))["inputRequests"]
    assert list(shown) == ["b"]
    result(await call(services, "tasks/update", {"taskId": task_id, "inputResponses": {"b": {"roots": []}}}))
    assert memory.rows[task_id].status == "working"
    assert publisher.wakes == [("mcp.inbox.test", memory.rows[task_id].task.job_id)] * 2


async def test_one_invalid_answer_records_none(services: Services, memory: MemoryApiStore) -> None:
    task_id = await start(services)
    memory.as_worker_ask(task_id, {"a": ("roots/list", None), "b": ("roots/list", None)})
    params = {"taskId": task_id, "inputResponses": {"a": {"roots": []}, "b": {"roots": "no"}}}
    assert error(await call(services, "tasks/update", params))["code"] == codes.INVALID_PARAMS
    assert len(await memory.outstanding_inputs(task_id)) == 2


async def test_cancel_of_a_waiting_task_wakes_revokes_and_drops_its_questions(
    services: Services, memory: MemoryApiStore, publisher: RecordingPublisher
) -> None:
    task_id = await start(services)
    memory.as_worker_ask(task_id, {"a": ("roots/list", None)})
    assert result(await call(services, "tasks/cancel", {"taskId": task_id}))["resultType"] == "complete"
    assert memory.rows[task_id].status == "cancelled"
    assert publisher.wakes == [("mcp.inbox.test", memory.rows[task_id].task.job_id)]
    assert publisher.revokes == [memory.rows[task_id].task.job_id]
    assert await memory.outstanding_inputs(task_id) == []
    # Terminal: the same ack again, nothing sent twice.
    assert result(await call(services, "tasks/cancel", {"taskId": task_id}))["resultType"] == "complete"
    assert len(publisher.revokes) == 1


# ---- 2025-11-25 ---------------------------------------------------------------------------------


async def test_a_legacy_session_serves_sep_1686_tasks(services: Services, memory: MemoryApiStore) -> None:
    opened = await call(
        services, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}}, legacy=True
    )
    session = (opened.headers or {})["Mcp-Session-Id"]
    assert result(opened)["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    params = {"name": "u_optional", "arguments": {}, "task": {"ttl": 60_000}, "_meta": {"progressToken": 1}}
    created = result(await call(services, "tools/call", params, session=session, legacy=True))["task"]
    assert created["status"] == "working" and created["ttl"] >= 60_000
    listed = result(await call(services, "tasks/list", {}, session=session, legacy=True))["tasks"]
    assert [t["taskId"] for t in listed] == [created["taskId"]]


async def test_legacy_errors_are_http_200_and_unknown_sessions_404(services: Services) -> None:
    reply = await call(services, "tools/list", {}, session="nope", legacy=True)
    assert reply.http_status == 404
    opened = await call(services, "initialize", {"protocolVersion": "2025-11-25"}, legacy=True)
    session = (opened.headers or {})["Mcp-Session-Id"]
    reply = await call(services, "tools/call", {"name": "u_required"}, session=session, legacy=True)
    assert reply.http_status == 200 and error(reply)["code"] == codes.METHOD_NOT_FOUND
