"""The official Python SDK (mcp 2.3) as a real third-party client of our server.

The SDK has no task runtime, but its extension API lets a client claim ``resultType: "task"``
answers; the claim below polls ``tasks/get`` (with ``Mcp-Name: <taskId>``) to the result.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

import mcp_types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

from tests.support import Stack

TASKS = "io.modelcontextprotocol/tasks"


class _Task(mcp_types.Result):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    ttl_ms: int | None = Field(alias="ttlMs")


class TaskHandle(_Task):
    result_type: Literal["task"] = Field(alias="resultType")


class TaskState(_Task):
    result_type: Literal["complete"] = Field(alias="resultType")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskIdParams(mcp_types.RequestParams):
    task_id: str = Field(serialization_alias="taskId")


class GetTask(mcp_types.Request[TaskIdParams, Literal["tasks/get"]]):
    name_param: ClassVar[str | None] = "taskId"
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams


class PollingTasks(ClientExtension):
    identifier = TASKS

    def __init__(self) -> None:
        self.polls: list[str] = []
        self.created: list[TaskHandle] = []

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(created: TaskHandle, ctx: ClaimContext) -> mcp_types.CallToolResult:
            self.created.append(created)
            while True:
                await asyncio.sleep((created.poll_interval_ms or 1000) / 1000)
                state = await ctx.session.send_request(
                    GetTask(params=TaskIdParams(task_id=created.task_id)), TaskState
                )
                self.polls.append(state.status)
                if state.status == "completed":
                    return mcp_types.CallToolResult.model_validate(state.result)
                if state.status in ("failed", "cancelled"):
                    raise RuntimeError(f"task {state.status}: {state.error}")

        return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]


async def test_official_sdk_client_calls_a_tool_as_a_task_and_polls_to_the_result(stack: Stack) -> None:
    tasks = PollingTasks()
    async with Client(stack.url, extensions=[tasks]) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("slow_compute", {"seconds": 0.5, "label": "sdk"})
    assert isinstance(text := result.content[0], mcp_types.TextContent), text
    assert text.text == "done after 0.5s (sdk)"
    assert tasks.created and tasks.created[0].status == "working"
    assert tasks.created[0].poll_interval_ms == 200
    assert tasks.polls[-1] == "completed"


async def test_official_sdk_client_without_the_extension_gets_a_plain_result(stack: Stack) -> None:
    async with Client(stack.url) as client:
        result = await client.call_tool("slow_compute", {"seconds": 0.1})
        assert isinstance(text := result.content[0], mcp_types.TextContent), text
        assert text.text == "done after 0.1s"
        with pytest.raises(MCPError) as caught:
            await client.call_tool("failing_job", {})
    assert caught.value.error.code == mcp_types.jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY
