"""Bounded requests, from the red team of issue 33, each against a real API process beside the
shared stack's worker: huge request heads (N3), trickling bodies (N4), a user behind a trusted
reverse proxy (N9), racing subscriptions (N7), ``/metrics`` exposure and duplicate JSON keys.

Clients at other addresses bind a loopback alias (``127.0.0.3`` plays the reverse proxy); what
each test measures or counts is named in its assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from tests.support import Client, Proc, Stack, meta, start_api, wait_until

TOKENS = {"alice": "alice-secret", "bob": "bob-secret"}
PROXY = "127.0.0.3"
METRICS_TOKEN = "metrics-secret"
INVALID_REQUEST = -32600


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


@pytest.fixture(scope="module")
def guarded(stack: Stack) -> Iterator[tuple[Proc, str]]:
    """An API with auth and a short body deadline (default head limits and body budget)."""
    env = dict(stack.env, MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS), MCP_TASKS_BODY_READ_TIMEOUT_SECONDS="5")
    proc, url = start_api("guarded-api", env)
    yield proc, url
    proc.stop()


@pytest.fixture(scope="module")
def proxied(stack: Stack) -> Iterator[str]:
    """An API behind a trusted reverse proxy at ``PROXY``, four connections per client."""
    env = dict(
        stack.env,
        MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS),
        MCP_TASKS_TRUSTED_PROXIES=json.dumps([f"{PROXY}/32"]),
        MCP_TASKS_MAX_CONNECTIONS_PER_CLIENT="4",
        MCP_TASKS_METRICS_TOKEN=METRICS_TOKEN,
    )
    proc, url = start_api("proxied-api", env)
    yield url
    proc.stop()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _status(sock: socket.socket, timeout: float = 5.0) -> int | None:
    """The status code of the response on ``sock``; None if it closed (or stayed silent)."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except (TimeoutError, ConnectionResetError):
        return None
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None


def _request(port: int, lines: list[str], source: str = "127.0.0.1") -> int | None:
    sock = _connect(port, source)
    try:
        sock.sendall(("\r\n".join(["GET /healthz HTTP/1.1", "Host: x", *lines]) + "\r\n\r\n").encode())
        return _status(sock)
    finally:
        sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.5)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


class _PeakRss:
    """The API process's resident memory, sampled every 20 ms while the block runs."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.baseline = self.process.memory_info().rss
        self.peak = self.baseline
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


# ---- N3: the request head -----------------------------------------------------------------------


def _flood_head(port: int, limit: int) -> int | None:
    """Send one endless header in 64 KiB pieces (up to ``limit`` bytes) until the server answers."""
    sock = _connect(port)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        sent = 0
        while sent < limit:
            try:
                sock.sendall(b"a" * 65_536)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 65_536
            if select.select([sock], [], [], 0.005)[0]:
                break
        return _status(sock)
    finally:
        sock.close()


def test_a_flood_of_huge_request_heads_is_refused_431_and_the_api_stays_small(
    guarded: tuple[Proc, str],
) -> None:
    # Red team N3: 10 connections sending huge headers took the API from 182 MB to 1,077 MB.
    proc, url = guarded
    port = _port(url)
    statuses: list[int | None] = []
    with _PeakRss(proc.popen.pid) as rss:
        flood = [
            threading.Thread(target=lambda: statuses.append(_flood_head(port, 32 << 20))) for _ in range(10)
        ]
        for thread in flood:
            thread.start()
        assert httpx.get(url.removesuffix("/mcp") + "/healthz", timeout=5).status_code == 200
        for thread in flood:
            thread.join(60)
    grew = (rss.peak - rss.baseline) / 2**20
    assert grew < 40, f"the API grew by {grew:.0f} MiB"
    assert statuses == [431] * 10
    assert Client(url, token=TOKENS["alice"]).request("tools/list").status == 200


def test_too_many_header_lines_are_refused_431_and_a_normal_head_is_served(guarded: tuple[Proc, str]) -> None:
    _, url = guarded
    port = _port(url)
    assert _request(port, [f"X-H{n}: v" for n in range(150)]) == 431
    assert _request(port, [f"X-H{n}: v" for n in range(50)]) == 200
    assert _request(port, ["X-Big: " + "b" * 70_000]) == 431  # one header line over the head limit


# ---- N4: trickling bodies ------------------------------------------------------------------------


def _trickle(port: int, token: str) -> socket.socket:
    sock = _connect(port)
    head = (
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {1 << 20}\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"jsonrpc":')  # a 1 MiB body that never finishes
    return sock


def test_trickling_bodies_of_one_principal_leave_another_principals_large_request_served(
    guarded: tuple[Proc, str],
) -> None:
    # Red team N4: 64 such bodies held the whole 64 MiB budget; every other large request got 503.
    _, url = guarded
    port = _port(url)
    slow = [_trickle(port, TOKENS["alice"]) for _ in range(64)]
    stop = threading.Event()

    def trickle() -> None:  # a byte per body every 0.3 s: never idle, never done
        while not stop.wait(0.3):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(b" ")

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        time.sleep(0.5)  # every one of them has reserved its part of the budget, or waits for it
        arguments = {"seconds": 0, "label": "x" * 200_000}  # well over the 64 KiB of a small body
        started = time.monotonic()
        reply = Client(url, token=TOKENS["bob"]).call_tool("slow_compute", arguments)
        assert reply.status == 200 and reply.result["resultType"] == "task", reply.body
        assert time.monotonic() - started < 3.0  # not behind alice's deadline (5 s)
        # alice's bodies that held her share are cut at the 5 s deadline (408), not held forever.
        answered = wait_until(lambda: _answered(slow, at_least=16), 10, 0.1, what="alice's bodies to be cut")
        statuses = [_status(sock) for sock in answered]
        assert statuses.count(408) >= 16 and set(statuses) <= {408, 503}, statuses
    finally:
        stop.set()
        sender.join()
        for sock in slow:
            sock.close()


def _answered(socks: list[socket.socket], at_least: int) -> list[socket.socket] | None:
    readable = select.select(socks, [], [], 0)[0]
    return readable if len(readable) >= at_least else None


# ---- N9: a trusted reverse proxy -----------------------------------------------------------------


def _in_progress(port: int, client: str) -> socket.socket:
    """A request through the proxy for ``client`` whose body has not arrived yet."""
    sock = _connect(port, PROXY)
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {client}\r\n"
        f"Authorization: Bearer {TOKENS['alice']}\r\nContent-Length: 1000\r\n\r\n"
    )
    sock.sendall(head.encode() + b"{")
    return sock


def test_one_user_behind_the_proxy_cannot_lock_out_the_others(proxied: str) -> None:
    port = _port(proxied)
    held: list[socket.socket] = []
    try:
        # The proxy's own connections are not capped per address: it carries everybody.
        held += [_connect(port, PROXY) for _ in range(8)]
        assert not any(_closed_by_peer(sock) for sock in held[:8])
        # One user behind it fills their four; their next request is refused, nobody else's.
        held += [_in_progress(port, "203.0.113.7") for _ in range(4)]
        time.sleep(0.3)
        assert _request(port, ["X-Forwarded-For: 203.0.113.7"], PROXY) == 503
        assert _request(port, ["X-Forwarded-For: 203.0.113.8"], PROXY) == 200
        # The user's own X-Forwarded-For (the proxy appends the real address) changes nothing.
        assert _request(port, ["X-Forwarded-For: 203.0.113.8, 203.0.113.7"], PROXY) == 503
        # A proxy keeps its upstream connections open between requests: once answered, a
        # request no longer counts for its client, however long the connection idles.
        for _ in range(4):
            kept = _connect(port, PROXY)
            held.append(kept)
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.4\r\n\r\n")
            assert _status(kept) == 200
        assert _request(port, ["X-Forwarded-For: 198.51.100.4"], PROXY) == 200
        # From a peer that is not a trusted proxy the header is ignored: the peer is capped.
        held += [_connect(port, "127.0.0.4") for _ in range(4)]
        assert _request(port, ["X-Forwarded-For: 203.0.113.9"], "127.0.0.4") is None
        assert _request(port, ["X-Forwarded-For: 203.0.113.9"], PROXY) == 200
    finally:
        for sock in held:
            sock.close()


def test_metrics_answer_loopback_clients_and_the_metrics_token_only(proxied: str) -> None:
    port = _port(proxied)
    assert httpx.get(proxied.removesuffix("/mcp") + "/metrics", timeout=5).status_code == 200
    outside = ["X-Forwarded-For: 203.0.113.7"]
    assert _request_path(port, "/metrics", outside) == 403
    assert _request_path(port, "/metrics", [*outside, "Authorization: Bearer wrong"]) == 403
    assert _request_path(port, "/metrics", [*outside, f"Authorization: Bearer {METRICS_TOKEN}"]) == 200
    # The Host header names nothing: a scraper's own host name is as good as any.
    assert _request_path(port, "/metrics", [*outside, "Host: localhost"]) == 403


def _request_path(port: int, path: str, lines: list[str]) -> int | None:
    sock = _connect(port, PROXY)
    try:
        host = [] if any(line.startswith("Host:") for line in lines) else ["Host: x"]
        sock.sendall(("\r\n".join([f"GET {path} HTTP/1.1", *host, *lines]) + "\r\n\r\n").encode())
        return _status(sock)
    finally:
        sock.close()


# ---- N7: the subscription cap --------------------------------------------------------------------


def test_a_hundred_and_twenty_concurrent_listens_open_at_most_thirty_two(
    stack: Stack, guarded: tuple[Proc, str]
) -> None:
    _, url = guarded
    alice = Client(url, token=TOKENS["alice"])
    waiting = alice.request(
        "tools/call",
        {"name": "confirm_delete", "arguments": {"filename": "n7.txt"}, "_meta": meta(elicitation={})},
    ).result["taskId"]
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [waiting]}, "_meta": meta()},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
        "Authorization": f"Bearer {TOKENS['alice']}",
    }
    release = asyncio.Event()
    all_answered = asyncio.Event()
    firsts: list[str] = []

    def answered(outcome: str) -> None:
        firsts.append(outcome)
        if len(firsts) == 120:
            all_answered.set()

    async def one(http: httpx.AsyncClient) -> None:
        async with http.stream("POST", url, json=body, headers=headers) as response:
            lines: list[str] = []
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    first: dict[str, Any] = json.loads(line[5:])
                    answered(str(first["error"]["code"]) if "error" in first else first["method"])
                    break
                lines.append(line)
            else:  # refused before any stream: a plain JSON-RPC error
                error = json.loads("".join(lines) or "{}").get("error", {})
                answered(str(error.get("code", f"HTTP {response.status_code}")))
            await release.wait()  # an opened stream stays open until every listen has its answer

    async def race() -> None:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=120)) as http:
            listens = [asyncio.create_task(one(http)) for _ in range(120)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_answered.wait(), 20)
            release.set()
            await asyncio.gather(*listens)

    try:
        asyncio.run(race())
    finally:
        alice.cancel(waiting)
    outcomes = firsts
    opened = outcomes.count("notifications/subscriptions/acknowledged")
    assert opened == 32, outcomes
    assert outcomes.count(str(INVALID_REQUEST)) == 88, outcomes
    # Every slot came back when the streams ended.
    wait_until(lambda: _listen_opens(url, waiting), 10, 0.2, what="a listen to open again")


def _listen_opens(url: str, task_id: str) -> bool:
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [task_id]}, "_meta": meta()},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
        "Authorization": f"Bearer {TOKENS['alice']}",
    }
    reply = httpx.post(url, json=body, headers=headers, timeout=10)
    return reply.status_code == 200 and "notifications/subscriptions/acknowledged" in reply.text


# ---- duplicate JSON keys ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list","params":{"_meta":{}}}',
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"greet","name":"noop",'
        '"arguments":{},"_meta":{}}}',
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"greet",'
        '"arguments":{"name":"a","name":"b"},"_meta":{}}}',
    ],
    ids=["method", "tool-name", "argument"],
)
def test_a_request_naming_a_key_twice_is_refused_as_an_invalid_request(client: Client, raw: str) -> None:
    # Python keeps the last duplicate, many proxies and gateways the first: refused, not guessed.
    headers = {
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
    }
    response = client.http.post(client.url, content=raw.encode(), headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == INVALID_REQUEST and "appears twice" in error["message"]
