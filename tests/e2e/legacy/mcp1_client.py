"""Driven by tests/e2e/test_legacy.py with the Python SDK 1.30 (a 2025-11-25 client).

Prints one JSON line per step so the test can assert on what the real client saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings

warnings.simplefilter("ignore")

from mcp import ClientSession, types  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402


def say(step: str, **data: object) -> None:
    print(json.dumps({"step": step, **data}, default=str), flush=True)


async def on_elicit(context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
    say("elicited", message=params.message)
    return types.ElicitResult(action="accept", content={"confirm": True})


LOGS: list[object] = []


async def on_log(params: types.LoggingMessageNotificationParams) -> None:
    LOGS.append(params.data)


async def main(url: str) -> None:
    async with (
        streamablehttp_client(url) as (read, write, _),
        ClientSession(read, write, elicitation_callback=on_elicit, logging_callback=on_log) as session,
    ):
        init = await session.initialize()
        say("initialized", version=init.protocolVersion, tasks=init.capabilities.tasks is not None)
        tools = await session.list_tools()
        modes = {t.name: (t.execution.taskSupport if t.execution else None) for t in tools.tools}
        say("tools", modes=modes)
        greeted = await session.call_tool("greet", {"name": "legacy"})
        say("sync", text=greeted.content[0].text)
        confirmed = await session.call_tool("confirm_delete", {"filename": "old.txt"})
        say("sync-with-elicitation", text=confirmed.content[0].text)
        steps: list[tuple[float, float | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            steps.append((progress, total))

        progressed = await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        say("sync-with-progress", text=progressed.content[0].text, steps=steps)
        await session.set_logging_level("info")
        logged = await session.call_tool("test_tool_with_logging", {})
        say("sync-with-logs", text=logged.content[0].text, logs=list(LOGS))
        created = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 0.5}, ttl=60000)
        task_id = created.task.taskId
        say("created", status=created.task.status, ttl=created.task.ttl, poll=created.task.pollInterval)
        statuses = [status.status async for status in session.experimental.poll_task(task_id)]
        say("polled", statuses=statuses)
        result = await session.experimental.get_task_result(task_id, types.CallToolResult)
        say("result", text=result.content[0].text)
        listed = await session.experimental.list_tasks()
        say("listed", contains=task_id in [t.taskId for t in listed.tasks])
        spun = await session.experimental.call_tool_as_task("spin", {"seconds": 30}, ttl=60000)
        cancelled = await session.experimental.cancel_task(spun.task.taskId)
        say("cancelled", status=cancelled.status)
        try:
            await session.experimental.cancel_task(task_id)
            say("cancel-terminal", error=None)
        except Exception as exc:  # SEP-1686: cancelling a terminal task is -32602
            say("cancel-terminal", error=getattr(getattr(exc, "error", None), "code", str(exc)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
