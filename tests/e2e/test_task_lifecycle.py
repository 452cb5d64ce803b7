"""A task's life over real HTTP, a real broker and a real prefork worker."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from mcp_types import jsonrpc as codes

from tests.support import Client, Stack, wait_until


def test_tasked_call_answers_a_flat_create_result_then_completes(client: Client) -> None:
    created = client.call_tool("slow_compute", {"seconds": 0.2, "label": "x"}).result
    assert created["resultType"] == "task"
    assert created["status"] == "working"
    assert {"result", "error", "inputRequests", "task", "ttl", "pollInterval"}.isdisjoint(created)
    assert created["ttlMs"] > 0 and created["pollIntervalMs"] == 200
    # Durable before the answer (S-12): the very next tasks/get resolves.
    assert client.get(created["taskId"]).result["taskId"] == created["taskId"]
    done = client.wait_status(created["taskId"])
    assert done["status"] == "completed"
    assert done["resultType"] == "complete"
    assert done["result"]["content"][0]["text"] == "done after 0.2s (x)"
    assert done["result"]["isError"] is False


def test_synchronous_tool_returns_its_result_directly(client: Client) -> None:
    reply = client.call_tool("greet", {"name": "Ada"})
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert reply.result["content"] == [{"type": "text", "text": "Hello, Ada!"}]
    assert "taskId" not in reply.result


def test_optional_tool_runs_synchronously_for_a_client_without_the_extension(client: Client) -> None:
    reply = client.call_tool("slow_compute", {"seconds": 0}, extension=False)
    assert reply.result["resultType"] == "complete"
    assert reply.result["content"][0]["text"].startswith("done after")


def test_required_tool_without_the_extension_is_minus_32021_with_http_400(client: Client) -> None:
    reply = client.call_tool("failing_job", extension=False)
    assert reply.status == 400
    assert reply.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert reply.error["data"] == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }


def test_tool_error_completes_with_is_error(client: Client) -> None:
    task = client.wait_status(client.start("failing_job"))
    assert task["status"] == "completed"
    assert task["result"]["isError"] is True
    assert "on purpose" in task["result"]["content"][0]["text"]


def test_protocol_error_fails_with_the_json_rpc_error(client: Client) -> None:
    task = client.wait_status(client.start("protocol_error_job"))
    assert task["status"] == "failed"
    assert task["error"] == {"code": -32603, "message": "protocol_error_job: internal failure on purpose"}
    assert "result" not in task
    assert task["statusMessage"]


def test_cancel_stops_a_running_job_and_the_worker_records_that_it_stopped(
    client: Client, stack: Stack
) -> None:
    task_id = client.start("spin", {"seconds": 30})
    client.wait_status(task_id, ("working",))
    # Wait until the worker really holds it, so the cancel lands mid-run.
    from tests.support import wait_until

    wait_until(lambda: stack.row(task_id)["started_at"] is not None, 15, what="the job to start")
    ack = client.cancel(task_id).result
    assert ack == {"resultType": "complete", "_meta": ack["_meta"]}
    assert client.get(task_id).result["status"] == "cancelled"
    row = wait_until(lambda: (r := stack.row(task_id))["finished_at"] and r, 10, what="the worker to stop")
    assert row["status"] == "cancelled" and row["result"] is None
    assert row["lease_until"] is None


@pytest.mark.parametrize("catch", ["ToolError", "Exception"])
def test_cancel_stops_a_tool_that_wraps_its_work_in_a_broad_except(
    client: Client, stack: Stack, catch: str
) -> None:
    task_id = client.start("t_swallows_errors", {"catch": catch, "seconds": 60})
    wait_until(lambda: stack.row(task_id)["started_at"] is not None, 15, what="the job to start")
    client.cancel(task_id)
    # Far sooner than the 60 s the tool would run if its handler had swallowed the cancel.
    row = wait_until(lambda: (r := stack.row(task_id))["finished_at"] and r, 10, what="the worker to stop")
    assert row["status"] == "cancelled" and row["result"] is None and row["lease_until"] is None
    assert not (row["status_message"] or "").startswith("ignored")


def test_status_message_shows_progress(client: Client) -> None:
    task_id = client.start("slow_compute", {"seconds": 1.0, "label": "report"})
    from tests.support import wait_until

    # Before a worker takes it the task may say its place in line ("queued: 0 ahead"); once it runs,
    # the tool's own progress text.
    seen: list[str] = []

    def progress_shown() -> bool:
        message = client.get(task_id).result.get("statusMessage")
        if message and message not in seen:
            seen.append(message)
        return message == "computing report"

    wait_until(progress_shown, 10, what="the tool's progress text")
    assert all(m.startswith("queued: ") for m in seen[:-1]), seen
    # Once finished, the task no longer shows its last progress text as its status.
    assert "statusMessage" not in client.wait_status(task_id)


def test_readme_example_tool_counts_words_and_reports_a_tool_error(
    client: Client, stack: Stack, tmp_path: Path
) -> None:
    document = Path(stack.env["MCP_EXAMPLES_FILES_ROOT"]) / f"{tmp_path.name}-doc.txt"
    document.write_text("one two three\nfour")
    task = client.wait_status(client.start("count_words", {"paths": [f"file://{document}"]}))
    assert task["status"] == "completed"
    assert task["result"]["structuredContent"] == {f"file://{document}": 4}
    failed = client.wait_status(client.start("count_words", {"paths": ["https://example.com"]}))
    assert failed["status"] == "completed" and failed["result"]["isError"] is True
    assert "only paths and file:// URLs" in failed["result"]["content"][0]["text"]


def test_the_worker_keeps_renewing_the_lease_of_each_running_job(stack: Stack, client: Client) -> None:
    # The stack's lease is 6 s, renewed every 2 s by one thread per worker process. Three jobs in
    # a row on two pool processes: at least one process reuses the thread an earlier job started.
    for _ in range(3):
        task_id = client.start("spin", {"seconds": 4.5})
        leases: set[Any] = set()
        while (row := stack.row(task_id))["status"] == "working":
            if row["lease_until"] is not None:
                leases.add(row["lease_until"])
                assert row["lease_until"] > datetime.now(UTC)  # never lapsed while it ran
            time.sleep(0.2)
        assert row["status"] == "completed" and row["attempts"] == 1
        assert row["lease_until"] is None
        assert len(leases) >= 3, leases  # the claim's lease, then renewals at ~2 s and ~4 s
