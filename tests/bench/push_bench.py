"""Push benchmark, run by hand: commit → notification latency, and subscriptions per 100 MB.

Starts its own API and worker on a fresh database. Latency: for each round, a task is
subscribed to, then cancelled by another connection; the time from sending tasks/cancel to
receiving the `cancelled` notification covers the commit, the NOTIFY, the hub and the SSE
write (the cancel's own ack latency is reported beside it). Capacity: opens N idle
subscriptions and reports the API's RSS growth per subscription.

    .venv/bin/python -m tests.bench.push_bench --rounds 100 --subscriptions 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import httpx
import psutil

from tests import support

HEADERS = {"Accept": "text/event-stream", "MCP-Protocol-Version": "2026-07-28"}


def body(method: str, params: dict[str, object], request_id: int = 1) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": support.meta()},
    }


async def subscribe(
    http: httpx.AsyncClient, url: str, task_id: str, ready: asyncio.Event, done: asyncio.Future[float]
) -> None:
    payload = body("subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
    async with http.stream(
        "POST", url, json=payload, headers={**HEADERS, "Mcp-Method": "subscriptions/listen"}
    ) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message.get("method") == "notifications/tasks" and message["params"]["status"] == "working":
                ready.set()
            if message.get("method") == "notifications/tasks" and message["params"]["status"] == "cancelled":
                if not done.done():
                    done.set_result(time.perf_counter())
                return


async def post(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, object], name: str
) -> dict[str, Any]:
    headers = {
        "Accept": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    response = await http.post(url, json=body(method, params), headers=headers)
    reply: dict[str, Any] = response.json()
    return reply


async def latency(url: str, rounds: int) -> dict[str, float]:
    to_notification: list[float] = []
    acks: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for _ in range(rounds):
            created = await post(
                http, url, "tools/call", {"name": "spin", "arguments": {"seconds": 60}}, "spin"
            )
            task_id = created["result"]["taskId"]
            ready = asyncio.Event()
            done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            listener = asyncio.create_task(subscribe(http, url, task_id, ready, done))
            await asyncio.wait_for(ready.wait(), 10)
            sent = time.perf_counter()
            await post(http, url, "tasks/cancel", {"taskId": task_id}, task_id)
            acked = time.perf_counter()
            received = await asyncio.wait_for(done, 10)
            await listener
            to_notification.append((received - sent) * 1000)
            acks.append((acked - sent) * 1000)
    q = statistics.quantiles(to_notification, n=100)
    return {
        "rounds": rounds,
        "cancel_to_notification_p50_ms": round(statistics.median(to_notification), 2),
        "cancel_to_notification_p99_ms": round(q[98], 2),
        "cancel_ack_p50_ms": round(statistics.median(acks), 2),
    }


async def capacity(url: str, api_pid: int, count: int) -> dict[str, float | None]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=count + 10)) as http:
        ids = []
        for _ in range(count):
            created = await post(
                http, url, "tools/call", {"name": "spin", "arguments": {"seconds": 600}}, "spin"
            )
            ids.append(created["result"]["taskId"])
        before = psutil.Process(api_pid).memory_info().rss / 2**20
        ready_events = [asyncio.Event() for _ in ids]
        futures = [asyncio.get_running_loop().create_future() for _ in ids]
        listeners = [
            asyncio.create_task(subscribe(http, url, t, ready_events[i], futures[i]))
            for i, t in enumerate(ids)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready_events)), 120)
        await asyncio.sleep(2)
        after = psutil.Process(api_pid).memory_info().rss / 2**20
        per_sub_kib = (after - before) * 1024 / count
        for task_id in ids:
            await post(http, url, "tasks/cancel", {"taskId": task_id}, task_id)
        await asyncio.wait_for(asyncio.gather(*listeners, return_exceptions=True), 120)
    return {
        "subscriptions": count,
        "api_rss_before_mib": round(before, 1),
        "api_rss_after_mib": round(after, 1),
        "kib_per_subscription": round(per_sub_kib, 1),
        "subscriptions_per_100_mib": int(100 * 1024 / per_sub_kib) if per_sub_kib > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--subscriptions", type=int, default=500)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/8")
    args = parser.parse_args()
    from mcp_celery_tasks.settings import Settings
    from mcp_celery_tasks.store import migrate

    name = f"mcp_push_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name)
    migrate.upgrade(Settings(database_url=dsn))
    env = support.stack_env(dsn, args.broker, name)
    env["MCP_TASKS_MAX_SUBSCRIPTIONS_PER_PRINCIPAL"] = str(args.subscriptions + 10)
    worker = support.start_worker(f"push-worker-{name}", env)
    api, url = support.start_api(f"push-api-{name}", env)
    try:
        support.wait_until(
            lambda: support.Client(url).call_tool("greet", {"name": "x"}, extension=False).status == 200, 60
        )
        report = {"latency": asyncio.run(latency(url, args.rounds)),
                  "capacity": asyncio.run(capacity(url, api.popen.pid, args.subscriptions))}  # fmt: skip
        print(json.dumps(report, indent=2))
    finally:
        api.stop()
        worker.stop()
        support.drop_database(name)


if __name__ == "__main__":
    main()
