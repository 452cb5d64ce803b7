"""What a client is told while Postgres is out of reach (issue 28): HTTP 503, ``Retry-After``, a
JSON-RPC -32603 whose ``data`` says what is unavailable and when to retry, and, for a create that
may have been written, which task to look up."""

from __future__ import annotations

import asyncio
import typing

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks import tool
from mcp_celery_tasks.errors import BrokerUnreachable, InfrastructureError, ServiceUnavailable
from mcp_celery_tasks.protocol.rpc import RETRY_AFTER_S, as_protocol_error, error_body
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.store.records import NewTask, TaskRecord
from tests.memory_api import MemoryApiStore
from tests.unit.test_protocol import call, error


def test_an_outage_is_a_503_that_says_when_to_retry() -> None:
    error = as_protocol_error(InfrastructureError("the task database is unavailable"))
    assert isinstance(error, ServiceUnavailable)
    assert (error.code, error.http_status, error.headers) == (codes.INTERNAL_ERROR, 503, {"Retry-After": "1"})
    body = error_body(7, error)
    assert body["error"]["message"] == (
        f"Temporarily unavailable: the task database is unavailable; retry in {RETRY_AFTER_S:g} s"
    )
    assert body["error"]["data"] == {"unavailable": "database", "retryAfterMs": 1000}


def test_a_broker_outage_names_the_broker() -> None:
    error = as_protocol_error(BrokerUnreachable("the broker is unreachable"))
    assert isinstance(error, ServiceUnavailable) and error.to_error()["data"] == {
        "unavailable": "broker",
        "retryAfterMs": 1000,
    }


def test_a_create_that_may_have_been_written_names_its_task() -> None:
    error = ServiceUnavailable("Temporarily unavailable: …", task_id="tid", retry_after_s=2.5)
    assert error.to_error()["data"] == {
        "unavailable": "database",
        "retryAfterMs": 2500,
        "taskId": "tid",
        "maybeCreated": True,
    }
    assert error.headers == {"Retry-After": "3"}  # whole seconds, rounded up


def test_an_unexpected_error_is_a_plain_internal_error_without_details() -> None:
    error = as_protocol_error(RuntimeError("secret detail"))
    assert (error.code, error.http_status, error.headers) == (codes.INTERNAL_ERROR, 500, {})
    assert error.to_error() == {"code": codes.INTERNAL_ERROR, "message": "Internal error"}


@tool(name="u_outage", mode="optional")
def u_outage() -> str:
    """A tool whose create meets an outage."""
    return "ok"


@pytest.fixture
def written_then_lost(memory: MemoryApiStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The INSERT commits, then the connection breaks before its answer (``maybe_applied``)."""
    real = memory.create_task

    async def create_task(
        task: NewTask, max_active: int | None = None, **bucket: typing.Any
    ) -> TaskRecord | None:
        await real(task, max_active, **bucket)
        lost = InfrastructureError("the task database is unavailable")
        lost.maybe_applied = True
        raise lost

    monkeypatch.setattr(memory, "create_task", create_task)


@pytest.mark.usefixtures("written_then_lost")
async def test_a_task_whose_row_may_exist_is_named_so_the_client_looks_before_calling_again(
    services: Services, memory: MemoryApiStore
) -> None:
    reply = await call(services, "tools/call", {"name": "u_outage", "arguments": {}})
    assert (reply.http_status, reply.headers) == (503, {"Retry-After": "1"})
    data = error(reply)["data"]
    assert data["maybeCreated"] is True and data["taskId"] in memory.rows
    assert memory.rows[data["taskId"]].status == "working"  # kept: it runs, the client polls it


@pytest.mark.usefixtures("written_then_lost")
async def test_a_synchronous_call_whose_task_may_exist_cancels_it_so_a_retry_runs_it_once(
    services: Services, memory: MemoryApiStore
) -> None:
    reply = await call(services, "tools/call", {"name": "u_outage", "arguments": {}}, extension=False)
    assert reply.http_status == 503
    assert "taskId" not in error(reply)["data"]  # a caller without tasks cannot look it up
    (row,) = memory.rows.values()
    for _ in range(100):
        if row.status == "cancelled":
            break
        await asyncio.sleep(0.01)
    assert row.status == "cancelled"
