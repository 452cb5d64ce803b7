"""Isolated bodies on a real prefork worker (``@tool(isolation="process")``): a hostile body
reaches no credential, a normal one reports, asks through tasks/update, writes an artifact and
ends as its in-process twin; a cancelled body stops; a dying body is a clear error.

The stack is its own (one slot, a short cancel grace); the worker's environment holds the DSN
and ``CUDA_VISIBLE_DEVICES``, as a GPU worker's does.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import support
from tests.support import Client, Stack, wait_until

pytestmark = pytest.mark.serial

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.isolated"]'
GRACE_S = 2.0
COLOUR = {"action": "accept", "content": {"colour": "red"}}


@pytest.fixture(scope="module")
def iso(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    runs = tmp_path_factory.mktemp("iso-runs")
    with support.stack_of_its_own(
        "iso", template_db, TOOLS, concurrency=1,
        MCP_TASKS_CANCEL_GRACE_SECONDS=str(GRACE_S), MCP_TASKS_WATCHDOG_INTERVAL_SECONDS="0.5",
        MCP_TEST_RUNS_DIR=str(runs), CUDA_VISIBLE_DEVICES="7",
    ) as stack:  # fmt: skip
        yield stack


def _start(client: Client, name: str, arguments: dict[str, Any] | None = None) -> str:
    params = {"name": name, "arguments": arguments or {}, "_meta": support.meta(True, elicitation={})}
    result = client.request("tools/call", params).result
    assert result["resultType"] == "task", result
    return str(result["taskId"])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _structured(done: dict[str, Any]) -> dict[str, Any]:
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    return dict(done["result"]["structuredContent"])


@pytest.mark.timeout(120)
def test_a_hostile_isolated_body_reaches_no_credential(iso: Stack) -> None:
    client = iso.client()
    control = _structured(client.wait_status(_start(client, "leak_probe"), timeout=30))
    # The control: in the pool child the same probe finds the DSN and a live connection.
    assert any(line.startswith("MCP_TASKS_DATABASE_URL=") for line in control["environ"]), control
    assert control["gc_connections"] and control["connected"], control
    found = _structured(client.wait_status(_start(client, "leak_probe_isolated"), timeout=30))
    print(f"\nisolated probe: {found}")
    assert found["environ"] == [] and found["gc_connections"] == [], found
    assert found["parent_environ"] == ["<denied: Permission denied>"], found
    assert found["main_environ"] == ["<denied: Permission denied>"], found
    assert found["parent_mem"].startswith("maps <denied"), found
    assert found["parent_ptrace"].startswith("<denied"), found
    assert found["parent_fds"].startswith("opened 0 of "), found  # no handle on its sockets
    assert not control["parent_fds"].startswith("opened 0 of "), control
    assert found["dsns_found"] == 0 and found["connected"] == [], found
    assert found["cuda"] == "7"  # devices pass, secrets do not
    # Nothing inherited past stdin, stdout and stderr but the pipe.
    assert len(found["fds"]) == 1 and found["fds"][0].startswith("socket:"), found
    assert len(control["fds"]) > len(found["fds"])  # the pool child holds its connections, the broker's
    client.close()


@pytest.mark.timeout(120)
def test_an_isolated_body_reports_asks_publishes_and_ends_as_in_process(iso: Stack) -> None:
    client = iso.client()
    results = {}
    for name in ("plain_normal", "iso_normal"):
        task_id = _start(client, name, {"size_kib": 2500})

        def asking(task_id: str = task_id) -> dict[str, Any] | None:
            task = client.get(task_id).result
            return task if task["status"] == "input_required" else None

        task = wait_until(asking, 30, what=f"{name} to ask")
        assert task["statusMessage"] == "starting"
        assert list(task["inputRequests"]) == ["c"]
        assert client.update(task_id, {"c": COLOUR}).status == 200
        done = client.wait_status(task_id, timeout=30)
        results[name] = _structured(done)
        link = done["result"]["structuredContent"]["artifact"]
        assert link == {"name": "data.bin", "size": 2500 * 1024, "mimeType": "application/octet-stream"}
    assert results["iso_normal"] == results["plain_normal"]
    assert results["iso_normal"]["colour"] == "red"
    client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cooperate", [True, False])
def test_a_cancelled_isolated_body_is_stopped(iso: Stack, cooperate: bool) -> None:
    client = iso.client()
    marker = uuid.uuid4().hex
    task_id = _start(client, "iso_sleeper", {"marker": marker, "cooperate": cooperate})
    runs = Path(iso.env["MCP_TEST_RUNS_DIR"]) / marker
    wait_until(lambda: runs.exists() and runs.read_text().strip(), 30, what="the body to start")
    pid = int(runs.read_text())
    assert _alive(pid)
    client.cancel(task_id)
    cancelled = time.monotonic()
    wait_until(lambda: not _alive(pid), GRACE_S + 8, what="the body to be stopped")
    print(f"\ncooperate={cooperate}: body gone {time.monotonic() - cancelled:.2f} s after the cancel")
    assert client.get(task_id).result["status"] == "cancelled"
    assert (
        client.wait_status(_start(client, "iso_echo", {"text": "next"}), timeout=30)["status"] == "completed"
    )
    client.close()


@pytest.mark.timeout(120)
def test_the_memory_limit_counts_the_body_and_stops_it(iso: Stack) -> None:
    client = iso.client()
    marker = uuid.uuid4().hex
    task_id = _start(client, "iso_memory", {"marker": marker})
    done = client.wait_status(task_id, timeout=60)
    assert done["result"]["isError"] is True
    assert "exceeded its memory limit of 300 MiB" in done["result"]["content"][0]["text"]
    pid = int((Path(iso.env["MCP_TEST_RUNS_DIR"]) / marker).read_text())
    wait_until(lambda: not _alive(pid), 10, what="the body to die with its pool child")
    assert (
        client.wait_status(_start(client, "iso_echo", {"text": "next"}), timeout=30)["status"] == "completed"
    )
    client.close()


@pytest.mark.timeout(60)
def test_a_body_that_exits_ends_in_a_clear_error_recorded_as_a_crash(iso: Stack) -> None:
    client = iso.client()
    done = client.wait_status(_start(client, "iso_exit", {"code": 3}), timeout=30)
    assert done["status"] == "completed" and done["result"]["isError"] is True
    assert done["result"]["content"][0]["text"] == "The tool 'iso_exit' exited with code 3 before it returned"
    assert iso.row(done["taskId"])["error_kind"] == "crash"
    client.close()


@pytest.mark.timeout(180)
def test_the_start_overhead_of_an_isolated_body(iso: Stack) -> None:
    client = iso.client()

    def timed(name: str, arguments: dict[str, Any]) -> float:
        started = time.monotonic()
        reply = client.call_tool(name, arguments, extension=False)
        assert reply.status == 200 and reply.result["isError"] is False, reply.result
        return time.monotonic() - started

    samples: dict[str, list[float]] = {"greet": [], "iso_echo": []}
    for _ in range(10):
        samples["greet"].append(timed("greet", {"name": "x"}))
        samples["iso_echo"].append(timed("iso_echo", {"text": "x"}))
    inline, isolated = (statistics.median(samples[k]) for k in ("greet", "iso_echo"))
    print(f"\nsynchronous call median: in-process {inline * 1000:.0f} ms, isolated {isolated * 1000:.0f} ms")
    print(
        f"isolated body start overhead ~ {(isolated - inline) * 1000:.0f} ms (2 vCPU, {os.cpu_count()} seen)"
    )
    assert isolated > inline  # a process start is not free; nothing more is promised here
    client.close()


@pytest.mark.timeout(120)
def test_a_worker_set_to_isolate_runs_every_tool_out_of_process(template_db: str) -> None:
    with support.stack_of_its_own(
        "isow", template_db, TOOLS, concurrency=1, MCP_TASKS_TOOL_ISOLATION="process"
    ) as stack:
        client = stack.client()
        found = _structured(
            client.wait_status(_start(client, "leak_probe"), timeout=30)
        )  # not isolated itself
        assert found["environ"] == [] and found["gc_connections"] == [] and found["dsns_found"] == 0, found
        assert found["parent_environ"] == ["<denied: Permission denied>"], found
        assert (
            client.call_tool("greet", {"name": "Ada"}, extension=False).result["content"][0]["text"]
            == "Hello, Ada!"
        )
        client.close()
