"""The API's own CPU per request, in process: no HTTP server, no network (run by hand; never
collected).

    .venv/bin/python tests/bench/asgi_requests.py [--method tasks/get|tools/call] [--requests 20000]
        [--concurrency 64] [--rounds 3] [--broker redis://127.0.0.1:6379/7] [--skip-query]

Builds the ASGI app (``server.create_server``) on a scratch database (``mcp_perf_asgi``), runs
its lifespan, and sends ``--requests`` POSTs straight into it from ``--concurrency`` coroutines.
For tasks/get the tasks are created through the app and then marked completed in SQL (no worker
runs). Prints wall requests/s and the process's CPU per request for each round: the cost of
everything of ours plus Starlette/FastAPI, psycopg and pydantic, without uvicorn's HTTP parsing
(``get_profile.py`` measures the whole server under wrk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from mcp_celery_tasks.api.auth import ANONYMOUS  # noqa: E402
from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_asgi"


class Lifespan:
    """Runs an ASGI app's lifespan like a server does, keeping the state it fills."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lifespan:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        self._task = asyncio.create_task(self.app(scope, self._inbox.get, self._outbox.put))
        await self._inbox.put({"type": "lifespan.startup"})
        message = await self._outbox.get()
        if message["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"lifespan failed: {message}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._outbox.get()
        assert self._task is not None
        await self._task


async def post(app: Any, state: dict[str, Any], method: str, name: str, body: bytes) -> tuple[int, bytes]:
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        (b"mcp-protocol-version", support.VERSION.encode()),
        (b"mcp-method", method.encode()),
        (b"mcp-name", name.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": dict(state),
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # a client that stays connected
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def request_body(method: str, params: dict[str, Any], request_id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()


async def run(args: argparse.Namespace, dsn: str) -> None:
    from mcp_celery_tasks.api import server

    app = server.create_server(Settings())
    async with Lifespan(app) as life:
        call = {"name": "noop", "arguments": {}, "_meta": support.meta(True)}
        ids = []
        for i in range(300):
            status, raw = await post(
                app, life.state, "tools/call", "noop", request_body("tools/call", call, i)
            )
            assert status == 200, raw
            ids.append(json.loads(raw)["result"]["taskId"])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE mcp_tasks SET status = 'completed', dispatched_at = now(), finished_at = now(),"
                ' result = \'{"content": [{"type": "text", "text": "ok"}], "isError": false}\''
            )
        if args.method == "tasks/get" and args.skip_query:
            store = life.state["services"].store
            records = {task_id: await store.get_task(task_id, ANONYMOUS) for task_id in ids}

            async def from_memory(task_id: str, owner: str) -> Any:
                return records.get(task_id)

            store.get_task = from_memory  # everything but the SELECT
        if args.method == "tasks/get":
            bodies = [
                (task_id, request_body("tasks/get", {"taskId": task_id, "_meta": support.meta(True)}, i))
                for i, task_id in enumerate(ids)
            ]
        else:
            bodies = [("noop", request_body("tools/call", call, i)) for i in range(300)]
        per_worker = args.requests // args.concurrency
        for round_no in range(1, args.rounds + 1):
            failures = 0

            async def worker(offset: int) -> None:
                nonlocal failures
                for i in range(per_worker):
                    name, body = bodies[(offset + i) % len(bodies)]
                    status, raw = await post(app, life.state, args.method, name, body)
                    if status != 200 or b'"error"' in raw:
                        failures += 1

            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(worker(w * 7) for w in range(args.concurrency)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            done = per_worker * args.concurrency
            print(
                f"round {round_no}: {done} {args.method} in {wall:.2f} s = {done / wall:,.0f}/s,"
                f" CPU {cpu / done * 1e6:.0f} us per request, {failures} failed"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--method", choices=["tasks/get", "tools/call"], default="tasks/get")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument(
        "--skip-query", action="store_true", help="tasks/get: serve the rows from memory (all but the SELECT)"
    )
    args = parser.parse_args()
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    os.environ.update(
        support.stack_env(dsn, args.broker, "perfasgi", MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL="0")
    )
    os.sched_setaffinity(0, {0})  # one core, as a served API process has; Postgres may use the other
    try:
        try:
            import uvloop  # what uvicorn runs the API on when it is installed

            uvloop.run(run(args, dsn))
        except ImportError:
            asyncio.run(run(args, dsn))
    finally:
        support.drop_database(DB)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
