"""What the server-side sign-out check costs a console request (run by hand; pytest never
collects this file).

    .venv/bin/python tests/bench/console_revocation_bench.py [--checks 100000] [--revoked 1000]

On a database of its own (the machine's Postgres), with ``--revoked`` signed-out sessions and a
revoked admin in ``mcp_console_revocations``, a real ``ApiStore`` and event hub: the time of one
``Revocations.check`` (in memory: the snapshot is fresh), beside the cookie's own verification
(``Sessions.admin``: base64, HMAC, JSON) that every request already paid; the snapshot reads it
took; and how long a revocation took to reach the snapshot through the hub's NOTIFY.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.console.revocation import Revocations  # noqa: E402
from mcp_celery_tasks.console.security import SESSION_S, Refused, Sessions  # noqa: E402
from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import ApiStore, WorkerStore, migrate  # noqa: E402
from mcp_celery_tasks.tasks.events import TaskEvents  # noqa: E402
from tests import support  # noqa: E402


async def _run(dsn: str, checks: int, revoked: int) -> None:
    settings = Settings(database_url=dsn)
    writer = WorkerStore(settings)
    api = ApiStore(settings)
    await api.open()
    expires = int(time.time()) + 3600
    for n in range(revoked):
        await api.revoke_console_session(hashlib.sha256(f"gone-{n}".encode()).hexdigest(), expires, "bench")
    writer.revoke_console_sessions("admin:someone-else", "bench", SESSION_S)
    hub = TaskEvents(api)
    connected = asyncio.Event()
    hub.on_signal("bench:connected", connected.set)
    await hub.start()
    await asyncio.wait_for(connected.wait(), 10)
    services: Any = SimpleNamespace(store=api, events=hub)
    sessions = Sessions(
        Settings(console_admin_tokens={"ops": "0" * 64}, secret_keys=[base64.b64encode(b"k" * 32).decode()]),
        lambda token: False,
    )
    cookie = sessions.issue("ops")
    admin = sessions.admin(cookie)
    cache = Revocations()
    await cache.check(admin, services)
    started = time.perf_counter()
    for _ in range(checks):
        sessions.admin(cookie)
    verify_us = (time.perf_counter() - started) / checks * 1e6
    started = time.perf_counter()
    for _ in range(checks):
        await cache.check(admin, services)
    check_us = (time.perf_counter() - started) / checks * 1e6
    print(
        f"per request: the cookie's verification {verify_us:.2f} µs, the revocation check {check_us:.2f} µs"
    )
    print(f"  ({revoked} signed-out sessions in force; snapshot reads for {checks} checks: {cache.reads})")
    seen = []
    for _ in range(20):
        await asyncio.sleep(0.01)
        fresh = sessions.admin(sessions.issue("ops"))
        await cache.check(fresh, services)
        started = time.perf_counter()
        await asyncio.to_thread(writer.revoke_console_sessions, "admin:ops", "bench", SESSION_S)
        while True:
            try:
                await cache.check(fresh, services)
            except Refused:
                break
            await asyncio.sleep(0.0005)
        seen.append((time.perf_counter() - started) * 1000)
    seen.sort()
    print(f"another process's revocation (its statement included) to refused here: median {seen[10]:.1f} ms,")
    print(f"  max {seen[-1]:.1f} ms (20 revocations)")
    await hub.stop()
    await api.close()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checks", type=int, default=100_000)
    parser.add_argument("--revoked", type=int, default=1000)
    args = parser.parse_args()
    name = f"mcpt_console_rev_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name)
    try:
        migrate.upgrade(Settings(database_url=dsn))
        asyncio.run(_run(dsn, args.checks, args.revoked))
    finally:
        support.drop_database(name)


if __name__ == "__main__":
    main()
