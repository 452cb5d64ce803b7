"""Quotas across API replicas: two API processes on one database give a principal its creates per
second once, not twice (the bucket in ``mcp_principal_buckets``, taken by the create statement),
and count its requests in progress on both (``tasks.shared_load``, a second behind).

Two real API processes beside the shared stack's worker; carol hammers both at once from threads
for a few seconds and the test counts what each replica let through.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support import Client, Proc, Stack, start_api, wait_until

TOKENS = {"carol": "carol-secret", "dave": "dave-secret", "erin": "erin-secret"}
ERIN_CONCURRENT = 2
RATE, BURST = 5.0, 5
HAMMER_S = 3.0


@pytest.fixture(scope="module")
def replicas(stack: Stack) -> Iterator[list[str]]:
    env = dict(
        stack.env,
        MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS),
        MCP_TASKS_CREATES_PER_SECOND_PER_PRINCIPAL=str(RATE),
        MCP_TASKS_CREATE_BURST_PER_PRINCIPAL=str(BURST),
        MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL="0",
    )
    with stack.db() as conn:  # erin's override, read by both replicas at start
        conn.execute(
            "INSERT INTO mcp_principal_limits (principal, max_concurrent_requests) VALUES (%s, %s)"
            " ON CONFLICT (principal) DO UPDATE SET"
            " max_concurrent_requests = EXCLUDED.max_concurrent_requests",
            ("token:erin", ERIN_CONCURRENT),
        )
    procs: list[Proc] = []
    urls = []
    try:
        for name in ("replica-a", "replica-b"):
            proc, url = start_api(name, env)
            procs.append(proc)
            urls.append(url)
        yield urls
    finally:
        for proc in procs:
            proc.stop()


def hammer(url: str, token: str, until: float, made: list[float], refused: list[float]) -> None:
    client = Client(url, token=token)
    try:
        while time.monotonic() < until:
            reply = client.call_tool("noop")
            if "result" in reply.body:
                assert reply.result["resultType"] == "task", reply.body
                made.append(time.monotonic())
            else:
                assert reply.error["code"] == -32001, reply.body
                assert reply.error["data"]["limit"] == "creates_per_second", reply.body
                refused.append(time.monotonic())
                time.sleep(0.02)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_principal_gets_its_rate_once_across_two_replicas(replicas: list[str]) -> None:
    per_replica: list[list[float]] = [[], []]
    refused: list[float] = []
    started = time.monotonic()
    until = started + HAMMER_S
    threads = [
        threading.Thread(target=hammer, args=(url, TOKENS["carol"], until, per_replica[i], refused))
        for i, url in enumerate(replicas)
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = max(max(times, default=started) for times in per_replica) - started
    total = sum(len(times) for times in per_replica)
    bound = BURST + RATE * elapsed
    print(f"creates across both replicas: {total} in {elapsed:.2f} s (bucket bound {bound:.1f}; "
          f"each replica's own bucket alone would allow {2 * bound:.1f}); {len(refused)} refused; "
          f"per replica {[len(t) for t in per_replica]}")  # fmt: skip
    assert total <= bound + 1, total
    assert total >= bound - 3, total  # the rate is given, not starved
    assert all(per_replica), per_replica  # both replicas served some
    assert refused


def test_another_principal_is_not_slowed_by_carols_flood(replicas: list[str]) -> None:
    dave = Client(replicas[1], token=TOKENS["dave"])
    try:
        assert all(dave.call_tool("noop").result["resultType"] == "task" for _ in range(BURST))
    finally:
        dave.close()


def _slow_post(url: str, token: str) -> socket.socket:
    """A request whose head arrived and whose body never finishes: in progress until closed."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n"
    )
    sock.sendall(head.encode() + b"{")
    return sock


@pytest.mark.timeout(60)
def test_requests_in_progress_on_one_replica_count_on_the_other(replicas: list[str]) -> None:
    a, b = replicas
    held = [_slow_post(a, TOKENS["erin"]) for _ in range(ERIN_CONCURRENT)]  # erin's limit, on a
    erin_b = Client(b, token=TOKENS["erin"])
    try:
        started = time.monotonic()

        def refused_on_b() -> bool:
            reply = erin_b.request("tools/list")
            return reply.status == 429 and reply.body["error"]["data"]["limit"] == "concurrent_requests"

        wait_until(refused_on_b, 10, 0.1, what="replica b to count erin's requests on replica a")
        print(f"replica b refused erin {time.monotonic() - started:.2f} s after a held her limit")
        dave = Client(b, token=TOKENS["dave"])
        assert dave.request("tools/list").status == 200  # nobody else is affected
        dave.close()
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: erin_b.request("tools/list").status == 200, 10, 0.1, what="erin's slots to free up")
    erin_b.close()
