"""Metrics, health and logs: counters match what was done; no task id ever leaks into them."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import Client, Proc, Stack, free_port, meta, start_api, start_worker, wait_until


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_counters_and_histograms_match_a_scripted_workload(stack: Stack, client: Client) -> None:
    api = stack.url.removesuffix("/mcp") + "/metrics"
    worker = f"http://127.0.0.1:{stack.env['MCP_TASKS_WORKER_METRICS_PORT']}/metrics"
    wait_until(lambda: _up(worker), 20, 0.2, what="the worker's metrics endpoint")
    api_before, worker_before = scrape(api), scrape(worker)

    done = [client.start("noop") for _ in range(3)]
    failing = client.start("failing_job")
    broken = client.start("protocol_error_job")
    spun = client.start("spin", {"seconds": 30})
    wait_until(lambda: stack.row(spun)["started_at"], 15, what="spin to start")
    client.cancel(spun)
    asked = client.request(
        "tools/call",
        {"name": "confirm_delete", "arguments": {"filename": "m"}, "_meta": meta(elicitation={})},
    ).result["taskId"]
    key = next(iter(client.wait_status(asked, ("input_required",))["inputRequests"]))
    client.update(asked, {key: {"action": "accept", "content": {"confirm": True}}})
    client.call_tool("greet", {"name": "metrics"})
    for task_id in [*done, failing, broken, asked]:
        client.wait_status(task_id)
    wait_until(lambda: stack.row(spun)["finished_at"], 15, what="spin to stop")
    ids = [*done, failing, broken, spun, asked]

    def settled() -> bool:
        after = scrape(worker)
        return (
            delta(
                worker_before, after, "mcp_tasks_finished_total", tool="confirm_delete", outcome="completed"
            )
            == 1
        )

    wait_until(settled, 10, 0.2, what="the worker's counters")
    api_after, worker_after = scrape(api), scrape(worker)
    assert delta(api_before, api_after, "mcp_tasks_created_total", tool="noop", mode="task") == 3
    assert delta(api_before, api_after, "mcp_tasks_created_total", tool="greet", mode="sync") == 1
    assert delta(api_before, api_after, "mcp_cancels_requested_total", tool="spin") == 1
    assert delta(api_before, api_after, "mcp_rpc_requests_total", method="tasks/update", code="0") == 1
    assert delta(api_before, api_after, "mcp_rpc_requests_total", method="tools/call", code="0") == 8
    assert delta(api_before, api_after, "mcp_rpc_seconds_count", method="tools/call") == 8
    # The OpenTelemetry MCP convention's mcp.server.operation.duration, by method and tool.
    operations = "mcp_server_operation_duration_seconds_count"
    by_tool = {"mcp_method_name": "tools/call", "error_type": ""}
    assert delta(api_before, api_after, operations, gen_ai_tool_name="noop", **by_tool) == 3
    assert delta(api_before, api_after, operations, gen_ai_tool_name="greet", **by_tool) == 1
    assert (
        delta(worker_before, worker_after, "mcp_tasks_finished_total", tool="noop", outcome="completed") == 3
    )
    assert (
        delta(
            worker_before, worker_after, "mcp_tasks_finished_total", tool="failing_job", outcome="tool_error"
        )
        == 1
    )
    assert (
        delta(
            worker_before,
            worker_after,
            "mcp_tasks_finished_total",
            tool="protocol_error_job",
            outcome="failed",
        )
        == 1
    )
    assert (
        delta(worker_before, worker_after, "mcp_tasks_finished_total", tool="spin", outcome="cancelled") == 1
    )
    assert delta(worker_before, worker_after, "mcp_cancels_effective_total", tool="spin") == 1
    assert delta(worker_before, worker_after, "mcp_input_wait_seconds_count", tool="confirm_delete") == 1
    queue = stack.env["MCP_TASKS_DEFAULT_QUEUE"]
    assert delta(worker_before, worker_after, "mcp_task_run_seconds_count", tool="noop", queue=queue) == 3
    assert delta(worker_before, worker_after, "mcp_task_pickup_seconds_count", tool="noop", queue=queue) == 3

    # No task id as a label value, in the metrics or in the logs.
    for text in (httpx.get(api).text, httpx.get(worker).text, stack.worker.log.read_text()):
        for task_id in ids:
            assert task_id not in text


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_health_and_readiness(stack: Stack) -> None:
    base = stack.url.removesuffix("/mcp")
    assert httpx.get(base + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(base + "/readyz", timeout=15)
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"ready": True, "checks": {"postgres": "ok", "migrations": "ok", "broker": "ok"}}


def test_readiness_fails_when_the_broker_or_postgres_is_unreachable(stack: Stack) -> None:
    env = dict(stack.env, MCP_TASKS_BROKER_URL="redis://127.0.0.1:1/0")
    proc: Proc
    proc, url = start_api("api-no-broker", env)
    try:
        answer = httpx.get(url.removesuffix("/mcp") + "/readyz", timeout=20)
        assert answer.status_code == 503 and answer.json()["checks"]["broker"] == "unreachable"
        assert answer.json()["checks"]["postgres"] == "ok"
    finally:
        proc.stop()
    env = dict(
        stack.env, MCP_TASKS_DATABASE_URL=re.sub(r"/[^/?]+(\?|$)", r"/no_such_db\1", stack.database_url)
    )
    proc, url = start_api("api-no-db", env)
    try:
        answer = httpx.get(url.removesuffix("/mcp") + "/readyz", timeout=20)
        assert answer.status_code == 503 and answer.json()["checks"]["postgres"] == "unreachable"
    finally:
        proc.stop()


def test_a_trace_started_at_tools_call_continues_in_the_worker(
    stack: Stack, db_url: str, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    # A database and maintenance queue of its own. Every API process (and sweeper) on a database
    # runs the fair publisher's pass for each of its queues whenever a task there changes status:
    # on the shared stack's database, its API can release this job first, with no trace context
    # (seen once under -n 2, while earlier tests' jobs were still finishing there).
    queue = stack.env["MCP_TASKS_DEFAULT_QUEUE"] + ".traced"  # only the traced worker takes these jobs
    env = dict(
        stack.env,
        MCP_TASKS_DATABASE_URL=db_url,
        MCP_TASKS_TRACE_FILE=str(spans_file),
        MCP_TASKS_DEFAULT_QUEUE=queue,
        MCP_TASKS_MAINTENANCE_QUEUE=stack.env["MCP_TASKS_MAINTENANCE_QUEUE"] + ".traced",
    )
    env["MCP_TASKS_WORKER_METRICS_PORT"] = str(free_port())
    api: Proc
    api, url = start_api("api-traced", env)
    worker = start_worker("worker-traced", env)
    try:
        client = Client(url)
        task_id = client.request(
            "tools/call",
            {"name": "confirm_delete", "arguments": {"filename": "t"}, "_meta": meta(elicitation={})},
        ).result["taskId"]
        key = next(iter(client.wait_status(task_id, ("input_required",))["inputRequests"]))
        client.update(task_id, {key: {"action": "accept", "content": {"confirm": True}}})
        client.wait_status(task_id)

        def spans() -> list[dict[str, Any]]:
            if not spans_file.exists():
                return []
            return [json.loads(line) for line in spans_file.read_text().splitlines() if line.strip()]

        wait_until(lambda: any(s["name"] == "record outcome" for s in spans()), 20, what="the worker's spans")
        by_name = {s["name"]: s for s in spans()}
        # The OpenTelemetry MCP conventions: a SERVER span "tools/call <tool>", and the GenAI
        # "execute_tool <tool>" span of the job, its child across the broker.
        call, run = by_name["tools/call confirm_delete"], by_name["execute_tool confirm_delete"]
        assert call["service"] == "mcp-celery-tasks-api" and run["service"] == "mcp-celery-tasks-worker"
        by_id = {s["span_id"]: s for s in spans()}
        assert call["kind"] == "SERVER" and by_id[call["parent_id"]]["kind"] == "SERVER"  # the HTTP span
        assert call["attributes"] == {
            "mcp.method.name": "tools/call", "gen_ai.tool.name": "confirm_delete",
            "gen_ai.operation.name": "execute_tool", "jsonrpc.request.id": "1",
            "mcp.protocol.version": "2026-07-28", "network.transport": "tcp", "network.protocol.name": "http",
        }  # fmt: skip
        assert run["trace_id"] == call["trace_id"] and run["parent_id"] == call["span_id"]
        assert run["attributes"]["gen_ai.tool.name"] == "confirm_delete"
        for child in ("claim", "input wait", "record outcome"):
            assert by_name[child]["parent_id"] == run["span_id"], child
        assert by_name["tasks/update"]["attributes"]["mcp.method.name"] == "tasks/update"

        # A caller's trace context in params._meta is the parent (the conventions: SHOULD); a
        # failing tool's span says so though its JSON-RPC response is a success.
        trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        traced = {**meta(extension=False), "traceparent": f"00-{trace_id}-{parent}-01"}
        params = {"name": "test_error_handling", "arguments": {}, "_meta": traced}
        failing = client.request("tools/call", params, extension=False)
        assert failing.result["isError"] is True
        wait_until(
            lambda: any(s["name"] == "tools/call test_error_handling" for s in spans()), 20, what="its span"
        )
        failed = next(s for s in spans() if s["name"] == "tools/call test_error_handling")
        assert failed["trace_id"] == trace_id and failed["parent_id"] == parent
        assert len(failed["links"]) == 1  # to the HTTP request's own span
        assert failed["attributes"]["error.type"] == "tool_error" and failed["status"] == "ERROR"
        unknown = client.request("tools/call", {"name": "no such tool \u2603", "arguments": {}})
        assert unknown.error["code"] == -32602
        wait_until(lambda: any(s["attributes"].get("error.type") == "-32602" for s in spans()), 20, what="it")
        refused = next(s for s in spans() if s["attributes"].get("error.type") == "-32602")
        assert refused["name"] == "tools/call" and "gen_ai.tool.name" not in refused["attributes"]
        assert task_id not in spans_file.read_text()
    finally:
        api.stop()
        worker.stop(signal.SIGQUIT)


def test_an_api_with_metrics_off_serves_no_metrics_and_still_answers(stack: Stack) -> None:
    # The switch the overhead benchmark flips (tests/bench/metrics_overhead.sh).
    api: Proc
    api, url = start_api("api-no-metrics", dict(stack.env, MCP_TASKS_METRICS_ENABLED="false"))
    try:
        assert httpx.get(url.removesuffix("/mcp") + "/metrics", timeout=10).status_code == 404
        client = Client(url)
        try:
            assert client.wait_status(client.start("noop"))["status"] == "completed"
        finally:
            client.close()
        assert httpx.get(stack.url.removesuffix("/mcp") + "/metrics", timeout=10).status_code == 200
    finally:
        api.stop()
