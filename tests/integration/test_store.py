"""The store against real Postgres: guarded transitions, fencing, leases, TTLs, NOTIFY and GC.

Every test gets a fresh migrated database (the ``settings`` / ``db_url`` fixtures). Rows are
made through the store; raw SQL only moves clocks (leases, expiry, creation time) and adds the
input rows the store has no writer for yet.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
import pytest
from mcp_types import jsonrpc as codes
from psycopg.types.json import Jsonb

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, NewTask, TaskError, TaskRecord, WorkerStore, queries
from tests.integration.conftest import Db

OWNER = "token:alice"
STRANGER = "token:mallory"
ME = "host-a:101:aaaa1111"
RIVAL = "host-b:202:bbbb2222"
LEASE_S = 30.0
RETENTION_MS = 60_000


def new_task(**overrides: Any) -> NewTask:
    """A NewTask as the API would build it; any field can be overridden."""
    fields: dict[str, Any] = {
        "task_id": secrets.token_urlsafe(24),
        "job_id": str(uuid.uuid4()),
        "owner": OWNER,
        "tool_name": "slow_compute",
        "arguments": {"seconds": 1, "label": "x"},
        "queue": "mcp.default",
        "ttl_ms": RETENTION_MS,
        "retention_ms": RETENTION_MS,
        "poll_interval_ms": 500,
        "max_attempts": 3,
        "protocol_version": "2026-07-28",
        "client_capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "client_info": {"name": "tests", "version": "0"},
    }
    fields.update(overrides)
    return NewTask(**fields)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiStore]:
    store = ApiStore(settings)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def worker_store(settings: Settings) -> Iterator[WorkerStore]:
    store = WorkerStore(settings)
    yield store
    store.close()


@pytest.fixture
def listener(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("LISTEN " + queries.NOTIFY_CHANNEL)
        yield conn


def raw_row(db: Db, task_id: str) -> dict[str, Any]:
    found = db.execute("SELECT * FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert found is not None, f"no row for {task_id}"
    return found


def db_now(db: Db) -> datetime:
    found = db.execute("SELECT now() AS now").fetchone()
    assert found is not None
    now: datetime = found["now"]
    return now


def set_columns(db: Db, task_id: str, assignments: LiteralString) -> None:
    """Move a row's clocks, e.g. ``"lease_until = now() - interval '1 minute'"``."""
    db.execute("UPDATE mcp_tasks SET " + assignments + " WHERE task_id = %s", (task_id,))


def insert_input(db: Db, task_id: str, key: str) -> None:
    db.execute(
        "INSERT INTO mcp_task_inputs (task_id, key, method, params, params_hash) "
        "VALUES (%s, %s, 'elicitation/create', %s, 'h')",
        (task_id, key, Jsonb({"message": "name?", "requestedSchema": {"type": "object"}})),
    )


def notified(conn: psycopg.Connection[Any], until: str, timeout: float = 5.0) -> list[str]:
    """Payloads received on the task channel, up to and including ``until`` (under a deadline)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while until not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no notification for {until!r} within {timeout}s; saw {seen}")
        for notify in conn.notifies(timeout=left, stop_after=1):
            assert notify.channel == queries.NOTIFY_CHANNEL
            seen.append(notify.payload)
    return seen


async def create(api: ApiStore, task: NewTask) -> TaskRecord:
    """``api.create_task`` without a quota: the row is always created."""
    record = await api.create_task(task)
    assert record is not None
    return record


async def running(api: ApiStore, worker_store: WorkerStore, **overrides: Any) -> TaskRecord:
    """A created task claimed by ``ME``."""
    record = await create(api, new_task(**overrides))
    assert worker_store.claim(record.job_id, ME, LEASE_S) is not None
    return record


async def completed(api: ApiStore, worker_store: WorkerStore, **overrides: Any) -> TaskRecord:
    record = await running(api, worker_store, **overrides)
    assert worker_store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})
    return record


def ms(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1000)


# ---- create and get --------------------------------------------------------------------------


async def test_created_task_reads_back_for_its_owner(api: ApiStore) -> None:
    task = new_task(queue="gpu", poll_interval_ms=250)
    created = await create(api, task)
    got = await api.get_task(task.task_id, OWNER)
    assert got is not None
    for record in (created, got):
        assert record.task_id == task.task_id
        assert record.job_id == task.job_id
        assert record.owner == OWNER
        assert record.tool_name == "slow_compute"
        assert record.status == "working"
        assert record.active
        assert record.status_message is None
        assert record.result is None and record.error is None
        assert record.expires_at is None
        assert record.queue == "gpu"
        assert record.poll_interval_ms == 250
        assert record.retention_ms == RETENTION_MS
    assert got.created_at == created.created_at


async def test_task_of_another_owner_reads_as_unknown(api: ApiStore) -> None:
    task = new_task()
    await api.create_task(task)
    assert await api.get_task(task.task_id, STRANGER) is None
    assert await api.get_task("no-such-task", OWNER) is None
    assert not await api.task_exists(task.task_id, STRANGER)
    assert await api.task_exists(task.task_id, OWNER)


# ---- cancel ----------------------------------------------------------------------------------


async def test_cancel_of_working_task_cancels_it_at_once(api: ApiStore, db: Db) -> None:
    record = await create(api, new_task())
    outcome = await api.request_cancel(record.task_id, OWNER, "stopped by the user")
    assert outcome.found and outcome.cancelled_now
    assert outcome.job_id == record.job_id
    assert outcome.previous_status == "working"
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "cancelled"
    assert got.status_message == "stopped by the user"
    assert got.expires_at is not None
    assert ms(got.expires_at - got.last_updated_at) == RETENTION_MS
    assert raw_row(db, record.task_id)["cancel_requested_at"] is not None


async def test_cancel_of_completed_task_is_acknowledged_but_changes_nothing(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await completed(api, worker_store)
    before = await api.get_task(record.task_id, OWNER)
    outcome = await api.request_cancel(record.task_id, OWNER)
    assert outcome.found
    assert not outcome.cancelled_now
    after = await api.get_task(record.task_id, OWNER)
    assert before is not None and after is not None
    assert after.status == "completed"
    assert after.result == before.result
    assert after.expires_at == before.expires_at
    assert raw_row(db, record.task_id)["cancel_requested_at"] is None


async def test_cancel_of_input_required_task_names_the_inbox_to_wake(api: ApiStore, db: Db) -> None:
    record = await create(api, new_task())
    set_columns(db, record.task_id, "status = 'input_required', inbox = 'mcp.inbox.host-a.101'")
    outcome = await api.request_cancel(record.task_id, OWNER)
    assert outcome.cancelled_now
    assert outcome.previous_status == "input_required"
    assert outcome.inbox == "mcp.inbox.host-a.101"


async def test_cancel_of_unknown_task_is_not_found(api: ApiStore) -> None:
    outcome = await api.request_cancel("no-such-task", OWNER)
    assert not outcome.found
    assert not outcome.cancelled_now


async def test_cancel_of_another_owners_task_is_not_found_and_changes_nothing(api: ApiStore) -> None:
    record = await create(api, new_task())
    outcome = await api.request_cancel(record.task_id, STRANGER)
    assert not outcome.found
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None and got.status == "working"


# ---- claim -----------------------------------------------------------------------------------


async def test_claim_takes_the_lease_and_counts_an_attempt(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    task = new_task(preflight={"user_name": "Ada"})
    await api.create_task(task)
    claimed = worker_store.claim(task.job_id, ME, LEASE_S)
    assert claimed is not None
    assert claimed.task_id == task.task_id
    assert claimed.arguments == task.arguments
    assert claimed.preflight == {"user_name": "Ada"}
    assert claimed.client_capabilities == task.client_capabilities
    assert (claimed.attempts, claimed.max_attempts) == (1, 3)
    row = raw_row(db, task.task_id)
    assert row["worker"] == ME
    assert row["attempts"] == 1
    assert row["started_at"] is not None
    lease_left = row["lease_until"] - db_now(db)
    assert timedelta(seconds=LEASE_S - 5) < lease_left <= timedelta(seconds=LEASE_S)


async def test_reclaim_by_the_holder_keeps_the_first_start_time(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    first_start = raw_row(db, record.task_id)["started_at"]
    again = worker_store.claim(record.job_id, ME, LEASE_S)
    assert again is not None and again.attempts == 2
    assert raw_row(db, record.task_id)["started_at"] == first_start


async def test_claim_while_another_worker_holds_a_live_lease_returns_none(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    assert worker_store.claim(record.job_id, RIVAL, LEASE_S) is None
    row = raw_row(db, record.task_id)
    assert row["worker"] == ME
    assert row["attempts"] == 1


async def test_claim_after_the_lease_ran_out_goes_to_the_new_worker(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    set_columns(db, record.task_id, "lease_until = now() - interval '10 seconds'")  # past the grace
    claimed = worker_store.claim(record.job_id, RIVAL, LEASE_S)
    assert claimed is not None and claimed.attempts == 2
    assert raw_row(db, record.task_id)["worker"] == RIVAL


async def test_a_lease_that_just_lapsed_is_not_taken_within_its_grace(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    # A live worker cut off from the database renews within a second of it coming back: until
    # lease_grace_seconds have passed, a lapsed lease still belongs to its holder.
    record = await running(api, worker_store)
    set_columns(db, record.task_id, "lease_until = now() - interval '1 second'")
    assert worker_store.claim(record.job_id, RIVAL, LEASE_S) is None
    state = worker_store.job_state(record.job_id)
    assert state is not None and state["lease_left_s"] > 3  # come back after the grace


async def test_claim_of_cancelled_task_returns_none(api: ApiStore, worker_store: WorkerStore, db: Db) -> None:
    record = await create(api, new_task())
    await api.request_cancel(record.task_id, OWNER)
    assert worker_store.claim(record.job_id, ME, LEASE_S) is None
    row = raw_row(db, record.task_id)
    assert row["worker"] is None
    assert row["started_at"] is None
    assert row["attempts"] == 0


async def test_concurrent_claims_have_exactly_one_winner(api: ApiStore, settings: Settings, db: Db) -> None:
    record = await create(api, new_task())
    job_id = record.job_id
    contenders = 8
    stores = [WorkerStore(settings) for _ in range(contenders)]
    start = threading.Barrier(contenders)

    def claim(index: int) -> bool:
        start.wait(timeout=10)
        return stores[index].claim(job_id, f"host:{index}:x", LEASE_S) is not None

    try:
        with ThreadPoolExecutor(contenders) as pool:
            won = list(pool.map(claim, range(contenders)))
    finally:
        for store in stores:
            store.close()
    assert won.count(True) == 1
    assert raw_row(db, record.task_id)["attempts"] == 1


# ---- lease and checkpoints ---------------------------------------------------------------------


async def test_renewing_the_lease_extends_it_only_for_the_holder(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    set_columns(db, record.task_id, "lease_until = now() + interval '1 second'")
    assert not worker_store.renew_lease(record.task_id, RIVAL, LEASE_S)
    assert raw_row(db, record.task_id)["lease_until"] - db_now(db) <= timedelta(seconds=1)
    assert worker_store.renew_lease(record.task_id, ME, LEASE_S)
    assert raw_row(db, record.task_id)["lease_until"] - db_now(db) > timedelta(seconds=LEASE_S - 5)


async def test_checkpoint_says_the_task_is_gone_once_cancelled(
    api: ApiStore, worker_store: WorkerStore
) -> None:
    record = await running(api, worker_store)
    assert worker_store.still_mine(record.task_id, ME)
    assert not worker_store.still_mine(record.task_id, RIVAL)
    await api.request_cancel(record.task_id, OWNER)
    assert not worker_store.still_mine(record.task_id, ME)
    assert not worker_store.renew_lease(record.task_id, ME, LEASE_S)


async def test_mark_stopped_records_that_the_holder_really_stopped(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    await api.request_cancel(record.task_id, OWNER)
    worker_store.mark_stopped(record.task_id, RIVAL)
    assert raw_row(db, record.task_id)["finished_at"] is None  # still "stopping"
    worker_store.mark_stopped(record.task_id, ME)
    row = raw_row(db, record.task_id)
    assert row["finished_at"] is not None
    assert row["lease_until"] is None
    assert row["status"] == "cancelled"


# ---- finish and report -------------------------------------------------------------------------


async def test_finish_by_the_holder_completes_with_result_and_expiry(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    result = {"content": [{"type": "text", "text": "done"}], "isError": False, "resultType": "complete"}
    assert worker_store.finish(record.task_id, ME, "completed", result=result, message="all done")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "completed"
    assert got.result == result
    assert got.error is None
    assert got.status_message == "all done"
    assert got.expires_at is not None
    assert ms(got.expires_at - got.last_updated_at) == RETENTION_MS
    row = raw_row(db, record.task_id)
    assert row["finished_at"] is not None
    assert row["lease_until"] is None


async def test_finish_after_cancel_is_dropped_and_the_row_keeps_no_result(
    api: ApiStore, worker_store: WorkerStore
) -> None:
    record = await running(api, worker_store)
    await api.request_cancel(record.task_id, OWNER)
    late = {"content": [{"type": "text", "text": "too late"}], "isError": False}
    assert not worker_store.finish(record.task_id, ME, "completed", result=late)
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "cancelled"
    assert got.result is None


async def test_terminal_task_is_never_finished_twice(api: ApiStore, worker_store: WorkerStore) -> None:
    record = await completed(api, worker_store)
    error: TaskError = {"code": codes.INTERNAL_ERROR, "message": "second outcome"}
    assert not worker_store.finish(record.task_id, ME, "failed", error=error)
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "completed"
    assert got.error is None


async def test_finish_by_another_worker_is_fenced(api: ApiStore, worker_store: WorkerStore) -> None:
    record = await running(api, worker_store)
    stolen = {"content": [{"type": "text", "text": "not mine"}], "isError": False}
    assert not worker_store.finish(record.task_id, RIVAL, "completed", result=stolen)
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "working"
    assert got.result is None


async def test_report_sets_the_status_message_without_changing_status(
    api: ApiStore, worker_store: WorkerStore
) -> None:
    record = await running(api, worker_store)
    assert worker_store.report(record.task_id, ME, "Step 5/8: running tests")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "working"
    assert got.status_message == "Step 5/8: running tests"


async def test_report_by_another_worker_is_fenced(api: ApiStore, worker_store: WorkerStore) -> None:
    record = await running(api, worker_store)
    assert worker_store.report(record.task_id, ME, "mine")
    assert not worker_store.report(record.task_id, RIVAL, "not mine")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "working"
    assert got.status_message == "mine"


async def test_report_after_cancel_is_refused(api: ApiStore, worker_store: WorkerStore) -> None:
    record = await running(api, worker_store)
    await api.request_cancel(record.task_id, OWNER, "cancelled by the user")
    assert not worker_store.report(record.task_id, ME, "still going")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "cancelled"
    assert got.status_message == "cancelled by the user"


# ---- the attempts cap --------------------------------------------------------------------------


async def test_exhausted_attempts_refuse_the_claim_and_fail_the_task(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store, max_attempts=1)
    error: TaskError = {"code": codes.INTERNAL_ERROR, "message": "started 1 times without finishing"}
    # A live lease means someone may still finish it: not exhausted yet.
    assert not worker_store.fail_exhausted(record.job_id, error, "giving up")
    set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")
    assert worker_store.claim(record.job_id, RIVAL, LEASE_S) is None
    assert worker_store.fail_exhausted(record.job_id, error, "giving up")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    assert got.status == "failed"
    assert got.error == error
    assert got.status_message == "giving up"
    assert got.expires_at is not None
    assert raw_row(db, record.task_id)["finished_at"] is not None


async def test_fail_exhausted_leaves_a_task_with_attempts_left_alone(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store, max_attempts=2)
    set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")
    error: TaskError = {"code": codes.INTERNAL_ERROR, "message": "nope"}
    assert not worker_store.fail_exhausted(record.job_id, error, "giving up")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None and got.status == "working"


# ---- reported ttlMs ----------------------------------------------------------------------------


async def test_ttl_of_active_task_is_elapsed_time_plus_retention(api: ApiStore, db: Db) -> None:
    record = await create(api, new_task())
    assert record.reported_ttl_ms() >= RETENTION_MS
    set_columns(db, record.task_id, "created_at = created_at - interval '5 seconds'")
    got = await api.get_task(record.task_id, OWNER)
    assert got is not None
    elapsed = ms(got.db_now - got.created_at)
    assert elapsed >= 5_000
    assert got.reported_ttl_ms() == elapsed + RETENTION_MS


async def test_ttl_of_terminal_task_is_fixed_at_its_expiry(api: ApiStore, worker_store: WorkerStore) -> None:
    record = await completed(api, worker_store)
    first = await api.get_task(record.task_id, OWNER)
    # A later read sees a later database clock; the terminal TTL must not move with it.
    second = await api.get_task(record.task_id, OWNER)
    assert first is not None and second is not None
    assert first.expires_at is not None
    assert second.db_now > first.db_now
    assert first.reported_ttl_ms() == ms(first.expires_at - first.created_at)
    assert second.reported_ttl_ms() == first.reported_ttl_ms()
    assert first.reported_ttl_ms() >= RETENTION_MS


async def test_ttl_reported_while_running_never_exceeds_the_final_one(
    api: ApiStore, worker_store: WorkerStore
) -> None:
    # Nothing may be deleted before any createdAt + ttlMs ever reported (DESIGN §3).
    record = await running(api, worker_store)
    while_running = await api.get_task(record.task_id, OWNER)
    assert worker_store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})
    final = await api.get_task(record.task_id, OWNER)
    assert while_running is not None and final is not None
    assert while_running.reported_ttl_ms() <= final.reported_ttl_ms()


# ---- NOTIFY ------------------------------------------------------------------------------------


async def test_finish_notifies_the_task_id(
    api: ApiStore, worker_store: WorkerStore, listener: psycopg.Connection[Any]
) -> None:
    record = await running(api, worker_store)
    assert worker_store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})
    assert notified(listener, record.task_id) == [record.task_id]


async def test_cancel_notifies_the_task_id(api: ApiStore, listener: psycopg.Connection[Any]) -> None:
    record = await create(api, new_task())
    await api.request_cancel(record.task_id, OWNER)
    assert notified(listener, record.task_id) == [record.task_id]


async def test_fail_exhausted_notifies_the_task_id(
    api: ApiStore, worker_store: WorkerStore, db: Db, listener: psycopg.Connection[Any]
) -> None:
    record = await running(api, worker_store, max_attempts=1)
    set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")
    assert worker_store.fail_exhausted(record.job_id, {"code": codes.INTERNAL_ERROR, "message": "x"}, "x")
    assert notified(listener, record.task_id) == [record.task_id]


async def test_create_claim_and_report_do_not_notify(
    api: ApiStore, worker_store: WorkerStore, listener: psycopg.Connection[Any]
) -> None:
    quiet = await running(api, worker_store)
    assert worker_store.report(quiet.task_id, ME, "Step 1/2")
    assert not worker_store.report(quiet.task_id, RIVAL, "fenced")
    # A transition committed afterwards: notifications arrive in commit order, so once it is
    # seen, anything the quiet operations had sent would have been seen before it.
    marker = await create(api, new_task())
    await api.request_cancel(marker.task_id, OWNER)
    assert notified(listener, marker.task_id) == [marker.task_id]


# ---- garbage collection ------------------------------------------------------------------------


async def test_gc_deletes_expired_rows_and_their_inputs(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    expired = await completed(api, worker_store)
    insert_input(db, expired.task_id, "1-abc")
    set_columns(db, expired.task_id, "expires_at = now() - interval '1 second'")
    not_yet = await completed(api, worker_store)
    active = await create(api, new_task())
    assert worker_store.delete_expired(100) == 1
    assert db.execute("SELECT 1 FROM mcp_tasks WHERE task_id = %s", (expired.task_id,)).fetchone() is None
    inputs = db.execute("SELECT count(*) AS n FROM mcp_task_inputs WHERE task_id = %s", (expired.task_id,))
    assert inputs.fetchone() == {"n": 0}
    assert await api.get_task(not_yet.task_id, OWNER) is not None
    assert await api.get_task(active.task_id, OWNER) is not None


async def test_gc_deletes_at_most_its_batch_size(api: ApiStore, worker_store: WorkerStore, db: Db) -> None:
    for _ in range(3):
        record = await completed(api, worker_store)
        set_columns(db, record.task_id, "expires_at = now() - interval '1 second'")
    assert worker_store.delete_expired(2) == 2
    assert worker_store.delete_expired(2) == 1
    assert worker_store.delete_expired(2) == 0


async def test_gc_keeps_an_expired_row_whose_worker_lease_is_live(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    # Cancelled while its worker still runs ("stopping"): the row stays until the lease ends.
    record = await running(api, worker_store)
    await api.request_cancel(record.task_id, OWNER)
    set_columns(db, record.task_id, "expires_at = now() - interval '1 second'")
    assert worker_store.delete_expired(100) == 0
    assert await api.get_task(record.task_id, OWNER) is not None
    set_columns(db, record.task_id, "lease_until = now() - interval '1 second'")
    assert worker_store.delete_expired(100) == 1


async def test_gc_skips_while_another_collector_holds_the_lock(
    api: ApiStore, worker_store: WorkerStore, db: Db, db_url: str
) -> None:
    record = await completed(api, worker_store)
    set_columns(db, record.task_id, "expires_at = now() - interval '1 second'")
    with psycopg.connect(db_url) as other:
        locked = other.execute("SELECT pg_try_advisory_xact_lock(%s)", (queries.GC_LOCK_KEY,)).fetchone()
        assert locked == (True,)
        assert worker_store.delete_expired(100) is None
        assert await api.get_task(record.task_id, OWNER) is not None
        other.rollback()
    assert worker_store.delete_expired(100) == 1


# ---- outbox and sweeper queries ----------------------------------------------------------------


async def test_mark_dispatched_sets_dispatched_at_only_once(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    first = await create(api, new_task())
    second = await create(api, new_task())
    assert raw_row(db, first.task_id)["dispatched_at"] is None
    assert worker_store.mark_dispatched([first.job_id]) == 1
    dispatched_at = raw_row(db, first.task_id)["dispatched_at"]
    assert dispatched_at is not None
    assert worker_store.mark_dispatched([first.job_id, second.job_id]) == 1
    assert raw_row(db, first.task_id)["dispatched_at"] == dispatched_at
    assert raw_row(db, second.task_id)["dispatched_at"] is not None


async def test_undispatched_lists_old_active_rows_never_published(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    forgotten = await create(api, new_task(queue="gpu"))
    await api.create_task(new_task())  # created just now: too young to be considered lost
    published = await create(api, new_task())
    cancelled = await create(api, new_task())
    worker_store.mark_dispatched([published.job_id])
    await api.request_cancel(cancelled.task_id, OWNER)
    for record in (forgotten, published, cancelled):
        set_columns(db, record.task_id, "created_at = now() - interval '1 minute'")
    assert worker_store.undispatched(30.0, 100) == [(forgotten.job_id, "gpu")]


async def test_lost_leases_lists_active_rows_whose_lease_ran_out(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    lost = await running(api, worker_store, queue="gpu")
    await running(api, worker_store)  # its lease is live
    cancelled = await running(api, worker_store)
    await api.request_cancel(cancelled.task_id, OWNER)
    await api.create_task(new_task())  # never claimed: no lease to lose
    for record in (lost, cancelled):
        set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")
    assert worker_store.lost_leases(5.0, 100) == [(lost.job_id, "gpu")]


async def test_task_states_are_the_narrow_columns_the_event_hub_compares(
    api: ApiStore, worker_store: WorkerStore
) -> None:
    record = await running(api, worker_store)
    missing = secrets.token_urlsafe(24)

    [(task_id, status, message, updated, logs, finished)] = await api.task_states([record.task_id, missing])
    assert (task_id, status, message, logs, finished) == (record.task_id, "working", None, 0, None)

    # Neither a report nor a log sends a NOTIFY: the hub sees them only in these columns.
    assert worker_store.report(record.task_id, ME, "epoch 1 of 3", progress=1, total=3)
    assert worker_store.log(record.task_id, ME, "info", None, {"msg": "hello"}, max_logs=10)
    [(_, status, message, later, logs, _)] = await api.task_states([record.task_id])
    assert (status, message, logs) == ("working", "epoch 1 of 3", 1)
    assert later > updated
