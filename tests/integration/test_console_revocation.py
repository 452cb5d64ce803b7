"""The console's revocations on real Postgres: the API process's snapshot (``console.revocation``)
over a real ``ApiStore`` and event hub, revocations written as the CLI writes them (``WorkerStore``,
another process's view), and their collection with the console's audit by ``collect_garbage``."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import cast

import pytest

from mcp_celery_tasks.console.revocation import SIGNED_OUT, UNLISTENED_S, Revocations
from mcp_celery_tasks.console.security import SESSION_S, Admin, Refused
from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore
from mcp_celery_tasks.store.revocation_calls import ALL_ADMINS, admin_subject
from mcp_celery_tasks.tasks.events import TaskEvents
from tests.integration.conftest import Db


def _session(name: str, nonce: str, issued: float | None = None) -> Admin:
    issued_at = time.time() if issued is None else issued
    digest = hashlib.sha256(nonce.encode()).hexdigest()
    return Admin(
        name, "csrf", session=digest, issued_ms=int(issued_at * 1000), expires=int(issued_at) + SESSION_S
    )


@pytest.fixture
async def events(api: ApiStore) -> AsyncIterator[TaskEvents]:
    hub = TaskEvents(api)
    connected = asyncio.Event()
    hub.on_signal("test:connected", connected.set)  # a signal's callbacks also run on (re)connect
    await hub.start()
    await asyncio.wait_for(connected.wait(), 10)
    yield hub
    await hub.stop()


def _services(api: ApiStore, events: TaskEvents) -> Services:
    return cast(Services, SimpleNamespace(store=api, events=events))


async def _until_refused(cache: Revocations, admin: Admin, services: Services, within: float) -> float:
    """Seconds until ``check`` refuses ``admin`` (checked as often as a busy console would)."""
    started = time.monotonic()
    while True:
        try:
            await cache.check(admin, services)
        except Refused as refused:
            assert str(refused) == SIGNED_OUT and refused.status == 401
            return time.monotonic() - started
        assert time.monotonic() - started < within, "the revocation was not seen in time"
        await asyncio.sleep(0.005)


async def test_a_thousand_page_views_read_the_revocations_once(api: ApiStore, events: TaskEvents) -> None:
    cache, services = Revocations(), _services(api, events)
    admin = _session("ops", "n1")
    for _ in range(1000):
        await cache.check(admin, services)
    assert cache.reads == 1
    bearer = Admin("ops", csrf="")  # a bearer request has no session: nothing to read
    await Revocations().check(bearer, services)


async def test_another_process_revoking_an_admin_reaches_this_one_through_the_hub(
    api: ApiStore, events: TaskEvents, store: WorkerStore
) -> None:
    cache, services = Revocations(), _services(api, events)
    ops, other = _session("ops", "n1"), _session("other", "n2")
    await cache.check(ops, services)
    await asyncio.sleep(0.01)  # the revocation's clock is after the session's issue
    store.revoke_console_sessions(admin_subject("ops"), "cli:oncall", SESSION_S, {"from": "cli"})
    took = await _until_refused(cache, ops, services, within=UNLISTENED_S)
    print(f"revocation seen by the other process's hub after {took * 1000:.1f} ms")
    await cache.check(other, services)  # another admin's session stands
    await cache.check(_session("ops", "n3"), services)  # one issued after the revocation too
    store.revoke_console_sessions(ALL_ADMINS, "cli:oncall", SESSION_S)
    await _until_refused(cache, other, services, within=UNLISTENED_S)
    assert cache.reads <= 4


async def test_a_signed_out_session_alone_is_refused(api: ApiStore, events: TaskEvents) -> None:
    cache, services = Revocations(), _services(api, events)
    gone, kept = _session("ops", "gone"), _session("ops", "kept")
    await api.revoke_console_session(gone.session, gone.expires, gone.actor)
    await _until_refused(cache, gone, services, within=UNLISTENED_S)
    await cache.check(kept, services)


async def test_without_a_listener_a_revocation_still_applies_within_a_second(
    api: ApiStore, store: WorkerStore
) -> None:
    cache, services = Revocations(), _services(api, TaskEvents(api))  # a hub that never listened
    admin = _session("ops", "n1", issued=time.time() - 1)
    await cache.check(admin, services)
    store.revoke_console_sessions(admin_subject("ops"), "cli:oncall", SESSION_S)
    took = await _until_refused(cache, admin, services, within=UNLISTENED_S + 0.5)
    assert took > 0.5 * UNLISTENED_S  # found by the re-read, not a notification
    assert cache.reads == 2


# ---- collection ---------------------------------------------------------------------------------


def _audit_ids(db: Db) -> list[str]:
    return [row["target"] for row in db.execute("SELECT target FROM mcp_console_actions ORDER BY id")]


async def test_the_collector_deletes_the_audit_past_its_retention_in_batches(
    api: ApiStore, db: Db, db_url: str
) -> None:
    for n in range(5):
        await api.record_console_action("admin:ops", "cancel", f"old-{n}", 1)
    await api.record_console_action("admin:ops", "cancel", "recent", 1)
    db.execute(
        "UPDATE mcp_console_actions SET acted_at = now() - interval '91 days' WHERE target LIKE 'old-%'"
    )
    keep = WorkerStore(Settings(database_url=db_url, console_audit_retention_seconds=0))
    gc.collect_garbage(keep)
    assert len(_audit_ids(db)) == 6  # 0: kept forever
    keep.close()
    store = WorkerStore(Settings(database_url=db_url))  # the default: 90 days
    gc.collect_garbage(store, batch=2, max_batches=10)
    assert _audit_ids(db) == ["recent"]
    store.close()


async def test_the_collector_forgets_revocations_once_their_sessions_have_expired(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    await api.revoke_console_sessions(admin_subject("ops"), "admin:ops", SESSION_S)
    await api.revoke_console_session("a" * 64, int(time.time()) + 60, "admin:ops")
    await api.revoke_console_session("b" * 64, int(time.time()) + 60, "admin:ops")
    db.execute(
        "UPDATE mcp_console_revocations SET expires_at = now() - interval '1 s' "
        "WHERE subject = 'session:' || repeat('b', 64)"
    )
    gc.collect_garbage(store, batch=1, max_batches=10)
    left = sorted(row["subject"] for row in db.execute("SELECT subject FROM mcp_console_revocations"))
    assert left == ["admin:ops", "session:" + "a" * 64]
    assert sorted(row.subject for row in await api.console_revocations()) == left
