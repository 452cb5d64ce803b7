"""Containment: cancel always stops, limits always hold, whatever the tool does.

A prefork worker with ONE slot and a short lease (3 s) runs hostile tools (tests/fixtures/
hostile.py): a GIL-holding regex, a pure-Python loop, a blocking C sleep, a memory bomb. For
each, on Redis and RabbitMQ: cancel makes the task ``cancelled`` at once; the slot runs the next
job within the cancel grace (2 s) plus a few seconds; the body ran exactly once; the lease never
lapsed while the process lived.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import support
from tests.support import LOG_DIR, Stack, wait_until

# Hostile tools spin the CPU, hold the GIL and allocate until killed, and the checks are timed
# (the slot frees within the grace plus a few seconds, the lease never lapses): alone, or the
# other worker's tests would be slowed and this one's clock stretched.
pytestmark = pytest.mark.serial

LEASE_S = 3.0
GRACE_S = 2.0
SLOT_FREE_WITHIN_S = GRACE_S + 6.0
MEASURED: dict[str, list[float]] = {}
TOOLS = '["tests.fixtures.bench", "tests.fixtures.conformance", "tests.fixtures.hostile"]'


def _contained_stack(broker: str, template_db: str) -> Iterator[Stack]:
    url = support.REDIS_URL if broker == "redis" else support.AMQP_URL
    if broker == "rabbitmq" and not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    name = f"mcpt_contain_{broker}_{os.getpid()}"
    dsn = support.create_database(name, template=template_db)
    runs = LOG_DIR.parent / f"runs-{broker}-{uuid.uuid4().hex[:6]}"
    runs.mkdir(parents=True)
    extra = {
        "MCP_TASKS_TOOL_MODULES": TOOLS,
        "MCP_TASKS_LEASE_SECONDS": str(LEASE_S),
        "MCP_TASKS_LEASE_GRACE_SECONDS": "2",
        "MCP_TASKS_CANCEL_GRACE_SECONDS": str(GRACE_S),
        "MCP_TASKS_WATCHDOG_INTERVAL_SECONDS": "0.5",
        "MCP_TEST_RUNS_DIR": str(runs),
    }
    suffix = f"c{uuid.uuid4().hex[:6]}"
    with support.running_stack(f"contain-{broker}", dsn, url, suffix, concurrency=1, **extra) as stack:
        yield stack
    support.drop_database(name)


RERUN_WINDOW_S = LEASE_S + 2
"""Long enough after a cancelled body's slot freed for any re-run of it (a redelivery, the
sweeper) to start."""
CANCELLED: list[tuple[str, str, float]] = []
"""(tool, marker, when its re-run window ends) of each body a cancel test stopped on the current
stack: the stack's teardown checks that none ran again. The tests after it fill that window (and,
on a worker with one slot, a re-run would hold up theirs too) instead of each sleeping through
its own."""


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def contained(request: pytest.FixtureRequest, template_db: str) -> Iterator[Stack]:
    for stack in _contained_stack(request.param, template_db):
        CANCELLED.clear()
        yield stack
        _no_cancelled_body_ran_again(stack)  # while the worker still runs: a re-run needs one


def _no_cancelled_body_ran_again(stack: Stack) -> None:
    for tool, marker, window_ends in CANCELLED:
        time.sleep(max(0.0, window_ends - time.monotonic()))
        assert runs_of(stack, marker) == 1, f"{tool}: the cancelled body ran again"


def runs_of(stack: Stack, marker: str) -> int:
    path = Path(stack.env["MCP_TEST_RUNS_DIR"]) / marker
    return len(path.read_text().splitlines()) if path.exists() else 0


def lease_margin(stack: Stack, task_id: str) -> float:
    with stack.db() as conn:
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM lease_until - now())::float, attempts FROM mcp_tasks "
            "WHERE task_id = %s",
            (task_id,),
        ).fetchone()
    assert row is not None and row[1] == 1, row
    return float(row[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tool", ["h_regex", "h_busy", "h_sleep", "h_memory"])
def test_cancel_stops_a_tool_that_does_not_cooperate(contained: Stack, tool: str) -> None:
    client = contained.client()
    marker = uuid.uuid4().hex
    task_id = client.start(tool, {"marker": marker})
    wait_until(lambda: runs_of(contained, marker) == 1, 20, what="the body to start")
    # Twice the lease: a lease kept from inside the job would lapse here (GIL held, C call, …).
    watched_until = time.monotonic() + 2 * LEASE_S
    while time.monotonic() < watched_until:
        assert lease_margin(contained, task_id) > 0, "the lease lapsed while the process lived"
        time.sleep(0.25)
    client.cancel(task_id)
    cancelled_at = time.monotonic()
    assert client.get(task_id).result["status"] == "cancelled"  # at once
    follower = client.start("noop")
    client.wait_status(follower, timeout=SLOT_FREE_WITHIN_S + 10)
    slot_free_s = time.monotonic() - cancelled_at
    MEASURED.setdefault(tool, []).append(slot_free_s)
    print(f"\n{tool}: cancel -> slot free {slot_free_s:.2f} s")
    assert slot_free_s < SLOT_FREE_WITHIN_S, f"{tool}: the slot took {slot_free_s:.1f} s to free up"
    row = contained.row(task_id)
    assert row["status"] == "cancelled" and row["finished_at"] is not None
    assert "did not stop within" in row["stop_reason"]
    assert runs_of(contained, marker) == 1
    CANCELLED.append((tool, marker, time.monotonic() + RERUN_WINDOW_S))  # and still 1 after it
    client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("tool", "kind", "says"),
    [
        ("h_busy_limited", "time_limit", "exceeded its time limit of 2 s"),
        ("h_memory_limited", "memory_limit", "exceeded its memory limit of 300 MiB"),
    ],
)
def test_a_hard_limit_ends_the_task_with_a_clear_error_and_the_slot_is_reused(
    contained: Stack, tool: str, kind: str, says: str
) -> None:
    client = contained.client()
    marker = uuid.uuid4().hex
    done = client.wait_status(client.start(tool, {"marker": marker}), timeout=40)
    assert done["status"] == "completed" and done["result"]["isError"] is True
    assert says in done["result"]["content"][0]["text"]
    row = contained.row(done["taskId"])
    assert (row["error_kind"], row["stop_reason"]) == (kind, kind)
    assert client.wait_status(client.start("noop"), timeout=20)["status"] == "completed"
    assert runs_of(contained, marker) == 1
    port = contained.env["MCP_TASKS_WORKER_METRICS_PORT"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert f'mcp_forced_stops_total{{reason="{kind}",tool="{tool}"}}' in metrics
    client.close()


def test_a_soft_limit_raises_inside_the_tool_first(contained: Stack) -> None:
    client = contained.client()
    done = client.wait_status(client.start("h_soft", {"marker": uuid.uuid4().hex}), timeout=30)
    assert done["status"] == "completed" and done["result"]["isError"] is False
    assert done["result"]["content"][0]["text"] == "cleaned up after the soft limit"
    client.close()
