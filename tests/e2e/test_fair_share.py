"""The noisy neighbour (issue 15): two principals share a real stack with two worker slots.

alice queues hundreds of short jobs, sends large bodies, holds synchronous waiters and leaves
questions unanswered; bob's ``noop`` still completes within a few seconds and his ``tasks/get``
p99 stays near its idle value. Fair dispatch keeps alice's backlog in Postgres (two of her jobs
in the broker at most) and hands out the slots round-robin; the waiting-for-input limit keeps
her questions from holding both slots.

The stack is this module's own: the shared one runs with the quotas off.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support import (
    REDIS_URL,
    Client,
    Proc,
    meta,
    stack_env,
    start_api,
    start_worker,
    wait_until,
)

# It compares bob's p99 latency idle and under alice's load: another xdist worker's stack on the
# same 2 cores would be a third, unmeasured neighbour.
pytestmark = pytest.mark.serial

TOKENS = {"alice": "alice-secret", "bob": "bob-secret"}
SLEEP_MS = 250
BACKLOG = 300
SAMPLES = 500
BODY_PAUSE_S = 0.1
ELICITING = meta(True, elicitation={})


@dataclass
class FairStack:
    url: str
    api: Proc
    worker: Proc

    def client(self, who: str) -> Client:
        return Client(self.url, token=TOKENS[who])


@pytest.fixture
def fair_stack(db_url: str) -> Iterator[FairStack]:
    env = stack_env(
        db_url,
        REDIS_URL,
        "fair" + db_url.rsplit("_", 1)[-1],
        MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS),
        MCP_TASKS_DISPATCH_AHEAD="2",
        MCP_TASKS_MAX_WAITING_INPUTS_PER_PRINCIPAL="1",
        # Questions held resident (no suspend): this is the limit that protects the slots of
        # tools that never suspend; tests/e2e/test_suspend.py covers the ones that do.
        MCP_TASKS_SUSPEND_AFTER_SECONDS="",
    )
    worker = start_worker("fair-worker", env, concurrency=2)
    api: Proc | None = None
    try:
        api, url = start_api("fair-api", env)
        stack = FairStack(url, api, worker)
        bob = stack.client("bob")
        task_id = bob.start("noop")
        bob.wait_status(task_id, timeout=60)  # the worker is up
        bob.close()
        yield stack
    finally:
        if api is not None:
            api.stop()
        worker.stop(timeout=20)


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def get_latencies(client: Client, task_id: str, count: int = SAMPLES) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        reply = client.get(task_id)
        latencies.append(time.perf_counter() - started)
        assert reply.status == 200, reply.body
    return latencies


def noop_seconds(client: Client, timeout: float = 30) -> float:
    started = time.perf_counter()
    task_id = client.start("noop")
    task = client.wait_status(task_id, timeout=timeout)
    assert task["status"] == "completed", task
    return time.perf_counter() - started


class Noise:
    """alice's background pressure on the API: 1 MB bodies and synchronous waiters."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.bodies = 0
        self._threads: list[threading.Thread] = []

    def waiters(self, count: int = 16) -> None:
        for _ in range(count):
            self._start(self._waiter)

    def large_bodies(self, senders: int = 4) -> None:
        for _ in range(senders):
            self._start(self._large_bodies)

    def _start(self, target: Any) -> None:
        thread = threading.Thread(target=target, daemon=True)
        self._threads.append(thread)
        thread.start()

    def __enter__(self) -> Noise:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def _large_bodies(self) -> None:
        # ~1 MB of [{},{},…]: refused by the parser's container budget, after being read. Each
        # sender pauses BODY_PAUSE_S between bodies: unpaced, four senders in this process push
        # ~400 MB/s through the 2 cores the API shares with them, and bob's p99 then measures
        # the machine's CPU, not the server's fairness (measured: p50 2 -> 17 ms, p99 9 -> 51 ms;
        # bounding bytes per second per client is the reverse proxy's job, deploy/nginx.conf).
        body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + b"[" + b"{}," * 330_000 + b"{}]}"
        headers = {"Authorization": f"Bearer {TOKENS['alice']}", "Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                   "Mcp-Method": "tools/call"}  # fmt: skip
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                try:
                    http.post(self.url, content=body, headers=headers)
                    self.bodies += 1
                except httpx.HTTPError:
                    pass
                self.stop.wait(BODY_PAUSE_S)

    def _waiter(self) -> None:
        # A synchronous call (no tasks extension): the request waits for the job's result.
        alice = Client(self.url, token=TOKENS["alice"], http=httpx.Client(timeout=120))
        try:
            alice.call_tool("sleep_ms", {"ms": SLEEP_MS}, extension=False)
        except httpx.HTTPError:
            pass  # the stack stops under it
        finally:
            alice.close()


def test_bob_is_served_promptly_while_alice_floods_the_pool(fair_stack: FairStack) -> None:
    alice, bob = fair_stack.client("alice"), fair_stack.client("bob")
    # A run time the tool bounds (spin: at most an hour) is a tool error, never a queued job.
    spun: dict[str, Any] = alice.call_tool("spin", {"seconds": 1e308}).result
    assert spun["isError"] is True and "taskId" not in spun and "seconds" in spun["content"][0]["text"]

    reference = bob.start("noop")
    bob.wait_status(reference)
    get_latencies(bob, reference, 50)  # warm-up
    idle = get_latencies(bob, reference)
    idle_noop = [noop_seconds(bob) for _ in range(3)]

    # ---- phase 1: hundreds of short jobs, large bodies, synchronous waiters -----------------
    with ThreadPoolExecutor(8) as pool:
        flood = list(pool.map(lambda _: alice.start("sleep_ms", {"ms": SLEEP_MS}), range(BACKLOG)))
    last = alice.get(flood[-1]).result
    assert last["status"] == "working" and last["statusMessage"].startswith("queued: ")
    ahead = int(last["statusMessage"].split()[1].rstrip("+"))
    assert ahead >= BACKLOG // 2, last["statusMessage"]  # its place in line, roughly

    with Noise(fair_stack.url) as noise:
        noise.waiters()
        time.sleep(1.0)  # the waiters are in flight
        waited = get_latencies(bob, reference)
        noise.large_bodies()
        time.sleep(1.0)
        busy = get_latencies(bob, reference)
        busy_noop = [noop_seconds(bob) for _ in range(3)]
    # Without fair dispatch bob waited behind alice's whole backlog: 300 x 250 ms / 2 slots.
    assert max(busy_noop) < 5.0, (busy_noop, idle_noop)
    idle_p99, waited_p99, busy_p99 = p99(idle), p99(waited), p99(busy)
    print(
        f"\nbob tasks/get p99 idle {idle_p99 * 1000:.1f} ms, with alice's backlog and waiters "
        f"{waited_p99 * 1000:.1f} ms, plus her 1 MB bodies {busy_p99 * 1000:.1f} ms (p50 "
        f"{statistics.median(idle) * 1000:.1f} / {statistics.median(waited) * 1000:.1f} / "
        f"{statistics.median(busy) * 1000:.1f} ms, {SAMPLES} each); bob noop idle "
        f"{[round(s, 2) for s in idle_noop]} s, noisy {[round(s, 2) for s in busy_noop]} s; "
        f"alice sent {noise.bodies} bodies of 1 MB meanwhile"
    )
    # Within 2x of idle, or 50 ms more. An idle p99 of a few ms on a 2-core machine shared with
    # the load generator (this process) and other test runs is mostly scheduling noise (measured
    # on such a machine: idle 6-12 ms, noisy 6-35 ms, swinging with the machine's load); what
    # this guards against is the regressions (waiters polling: p95 22 ms -> 1.44 s;
    # bodies parsed without a budget: tools/list 22.5 s).
    assert waited_p99 <= max(2 * idle_p99, idle_p99 + 0.050), (idle_p99, waited_p99, busy_p99)
    # Reading 1 MB bodies takes the API's CPU, which it shares here with the senders: on a loaded
    # 2-core machine bob's p99 rose to 20-80 ms with them (idle 6-25 ms). Bounded, not 2x: the
    # bytes a client may send per second are the reverse proxy's to limit (deploy/nginx.conf).
    assert busy_p99 <= max(2 * idle_p99, idle_p99 + 0.100), (idle_p99, waited_p99, busy_p99)

    # ---- phase 2: questions left unanswered ------------------------------------------------
    for task_id in flood:
        alice.cancel(task_id)
    asks = [
        alice.request("tools/call", {"name": "ask", "arguments": {}, "_meta": ELICITING}).result["taskId"]
        for _ in range(3)
    ]
    # Whichever ask starts first waits (asks released together may start in either order).
    first = wait_until(
        lambda: next((v for t in asks if (v := alice.get(t).result)["status"] == "input_required"), None),
        30,
        what="one of alice's questions",
    )
    asks.sort(key=lambda task_id: task_id != first["taskId"])
    asked_noop = [noop_seconds(bob) for _ in range(3)]
    assert max(asked_noop) < 5.0, asked_noop
    views = [alice.get(task_id).result for task_id in asks]
    waiting = [v for v in views if v["status"] == "input_required"]
    assert len(waiting) == 1, views  # the limit: one question at a time holds a slot
    for view in views[1:]:
        # Held back by dispatch, or refused at the ask if it was already on its way.
        refused = view["status"] == "completed" and view["result"]["isError"]
        assert view["status"] == "working" or refused, view
        if refused:
            assert "waiting for input" in view["result"]["content"][0]["text"], view
    print(f"bob noop while alice waits on a question: {[round(s, 2) for s in asked_noop]} s")
    # Answered: alice is below the limit again and her next question gets through.
    alice.update(asks[0], {key: {"action": "accept", "content": {"answer": "42"}}
                           for key in first["inputRequests"]})  # fmt: skip
    assert alice.wait_status(asks[0])["status"] == "completed"
    pending = [t for t, v in zip(asks, views, strict=True) if v["status"] == "working"]
    if pending:
        assert alice.wait_status(pending[0], ("input_required",), timeout=30)["status"] == "input_required"
    for task_id in asks:
        alice.cancel(task_id)
