"""The beat jobs of ``gc.py`` against real Postgres: the sweeper (outbox and lost leases), the
collector, its run record and the overdue alarm, and the TTL promise the collector keeps.

No broker: ``sweep`` gets a list-appending ``publish_job``. Rows are made through the stores; raw
SQL only moves clocks (creation, leases, expiry, last runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, NewTask, TaskRecord, WorkerStore, queries
from mcp_celery_tasks.worker.checkpoints import DirectoryCheckpoints
from tests.integration.conftest import Db
from tests.integration.test_store import create, raw_row

OWNER = "token:alice"
ME = "host-a:101:aaaa1111"
LEASE_S = 30.0
RETENTION_MS = 60_000
UNDISPATCHED_AFTER_S = 30.0
FAIL_AFTER_S = 900.0
GRACE_S = 5.0


@pytest.fixture
def sweep_settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        tool_modules=["workers"],
        undispatched_after_seconds=UNDISPATCHED_AFTER_S,
        undispatched_fail_after_seconds=FAIL_AFTER_S,
        lease_grace_seconds=GRACE_S,
        gc_interval_seconds=60,
        gc_alarm_intervals=3,
    )


@pytest.fixture
async def api(sweep_settings: Settings) -> AsyncIterator[ApiStore]:
    store = ApiStore(sweep_settings)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def store(sweep_settings: Settings) -> Iterator[WorkerStore]:
    worker_store = WorkerStore(sweep_settings)
    yield worker_store
    worker_store.close()


@pytest.fixture
def published() -> list[tuple[str, str]]:
    return []


BACKLOG = 100


def sweep(
    store: WorkerStore,
    published: list[tuple[str, str]],
    settings: Settings,
    depths: Mapping[str, int | None] | None = None,
) -> int:
    """``gc.sweep`` publishing into ``published``; every queue holds a backlog of ``BACKLOG``
    messages unless ``depths`` says otherwise (None: the broker cannot be asked)."""
    waiting = depths or {}
    return gc.sweep(
        store,
        lambda job_id, queue: published.append((job_id, queue)),
        settings,
        queue_depth=lambda queue: waiting.get(queue, BACKLOG),
    )


def new_task(**overrides: Any) -> NewTask:
    fields: dict[str, Any] = {
        "task_id": secrets.token_urlsafe(24),
        "job_id": str(uuid.uuid4()),
        "owner": OWNER,
        "tool_name": "slow_compute",
        "arguments": {"seconds": 1},
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


def row(db: Db, task_id: str) -> dict[str, Any] | None:
    return db.execute("SELECT * FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()


def move(db: Db, task_id: str, assignments: LiteralString) -> None:
    """Move a row's clocks, e.g. ``"created_at = now() - interval '1 minute'"``."""
    db.execute("UPDATE mcp_tasks SET " + assignments + " WHERE task_id = %s", (task_id,))


async def dispatched(api: ApiStore, store: WorkerStore, **overrides: Any) -> TaskRecord:
    """A task whose job was published: it waits in the broker, no worker holds it yet."""
    record = await create(api, new_task(**overrides))
    assert store.mark_dispatched([record.job_id]) == 1
    return record


def published_ago(db: Db, task_id: str, interval: LiteralString) -> None:
    """Created and published ``interval`` ago (e.g. ``"2 hours"``); no worker started it."""
    ago: LiteralString = "now() - interval '" + interval + "'"
    move(db, task_id, "created_at = " + ago + ", dispatched_at = " + ago)


async def claimed(api: ApiStore, store: WorkerStore, **overrides: Any) -> TaskRecord:
    record = await dispatched(api, store, **overrides)
    assert store.claim(record.job_id, ME, LEASE_S) is not None
    return record


async def finished(api: ApiStore, store: WorkerStore, **overrides: Any) -> TaskRecord:
    record = await claimed(api, store, **overrides)
    assert store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})
    return record


# ---- sweep: the outbox ---------------------------------------------------------------------------


async def test_sweep_releases_the_backlog_fairly_up_to_dispatch_ahead_per_queue_and_marks_it(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    # The API's fair publisher runs the same pass on every change; the sweeper covers an API
    # that is down. Each queue gets at most dispatch_ahead jobs in the broker, the rest wait.
    ahead = sweep_settings.dispatch_ahead
    backlog = [await create(api, new_task()) for _ in range(ahead + 2)]
    gpu = await create(api, new_task(queue="gpu"))

    assert sweep(store, published, sweep_settings) == ahead + 1
    assert sorted(published) == sorted(
        [(r.job_id, "mcp.default") for r in backlog[:ahead]] + [(gpu.job_id, "gpu")]
    )
    for record in [*backlog[:ahead], gpu]:
        swept = row(db, record.task_id)
        assert swept is not None and swept["dispatched_at"] is not None and swept["status"] == "working"
    for record in backlog[ahead:]:
        assert raw_row(db, record.task_id)["dispatched_at"] is None
    # Nothing started: the broker still holds dispatch_ahead jobs, so nothing more goes out.
    published.clear()
    assert sweep(store, published, sweep_settings) == 0
    assert published == []
    # A worker starts one: one more is released.
    assert store.claim(backlog[0].job_id, ME, LEASE_S) is not None
    assert sweep(store, published, sweep_settings) == 1
    assert published == [(backlog[ahead].job_id, "mcp.default")]


async def test_sweep_never_touches_a_dispatched_unleased_row(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    # Queued behind a long backlog for 20 minutes, past even the fail threshold: still not ours
    # (below republish_unstarted_after_seconds, 30 minutes by default).
    queued = await dispatched(api, store)
    published_ago(db, queued.task_id, "20 minutes")
    before = row(db, queued.task_id)

    assert sweep(store, published, sweep_settings) == 0
    assert published == []
    assert row(db, queued.task_id) == before


async def test_sweep_republishes_a_job_published_long_ago_that_never_started_once_per_period(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    # A broker that cannot say what it holds: after republish_unstarted_after_seconds the job
    # may have been lost (a failover without its data): publish it again, and re-stamp it so the
    # next sweep waits a whole period before doing it again.
    lost = await dispatched(api, store)
    published_ago(db, lost.task_id, "2 hours")
    depths = {"mcp.default": None}

    assert sweep(store, published, sweep_settings, depths) == 1
    assert published == [(lost.job_id, "mcp.default")]
    assert raw_row(db, lost.task_id)["status"] == "working"
    published.clear()
    assert sweep(store, published, sweep_settings, depths) == 0
    # A broker that says it holds the message: left alone, however old.
    published_ago(db, lost.task_id, "2 hours")
    assert sweep(store, published, sweep_settings) == 0


async def test_sweep_republishes_only_the_missing_oldest_jobs_of_a_queue_whatever_its_backlog(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    # Issue 19: a broker that lost messages (Redis without persistence) had them re-published
    # only once the backlog drained. Now the backlog waits in Postgres, so the published jobs no
    # worker holds can be counted against what the broker holds, backlog or not.
    oldest = await dispatched(api, store)
    older = await dispatched(api, store)
    newer = await dispatched(api, store)
    published_ago(db, oldest.task_id, "3 minutes")
    published_ago(db, older.task_id, "2 minutes")
    published_ago(db, newer.task_id, "1 minute")
    backlog = [await create(api, new_task()) for _ in range(20)]
    ahead = sweep_settings.dispatch_ahead
    assert ahead == 4  # three queued: the fair pass releases exactly one more
    depths = {"mcp.default": 2}  # the broker holds two of the four: two were lost

    assert sweep(store, published, sweep_settings, depths) == 3
    assert published[0] == (backlog[0].job_id, "mcp.default")
    assert sorted(published[1:]) == sorted([(oldest.job_id, "mcp.default"), (older.job_id, "mcp.default")])
    # Re-stamped: published at most once per period, however often the sweeper runs (the
    # broker now holds all four).
    published.clear()
    assert sweep(store, published, sweep_settings, {"mcp.default": 4}) == 0
    assert sweep(store, published, sweep_settings, {"mcp.default": 3}) == 1
    assert published == [(newer.job_id, "mcp.default")]  # the only one old enough to be missing


async def test_sweep_republishes_an_unstarted_job_sooner_when_its_queue_holds_no_message(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    # A worker received it and lost its broker connection before starting it (on Redis the
    # message is gone, or kept aside for its visibility timeout with ack emulation on). Only an
    # empty queue says so: behind a backlog, or with a broker that cannot be asked, the job may
    # still be on its way, and a fresh one surely is.
    idle = sweep_settings.republish_idle_queue_after_seconds
    assert idle < sweep_settings.republish_unstarted_after_seconds
    lost = await dispatched(api, store, queue="empty")
    fresh = await dispatched(api, store, queue="empty")
    queued = await dispatched(api, store, queue="busy")
    unknown = await dispatched(api, store, queue="unreachable")
    for record in (lost, queued, unknown):
        published_ago(db, record.task_id, "1 minute")
    published_ago(db, fresh.task_id, "5 seconds")
    depths = {"empty": 0, "busy": 3, "unreachable": None}
    before = {r.task_id: row(db, r.task_id) for r in (fresh, queued, unknown)}

    assert sweep(store, published, sweep_settings, depths) == 1
    assert published == [(lost.job_id, "empty")]
    assert {task_id: row(db, task_id) for task_id in before} == before
    # Re-stamped: the next sweep leaves it alone for another period.
    published.clear()
    assert sweep(store, published, sweep_settings, depths) == 0
    published_ago(db, lost.task_id, "1 minute")
    assert sweep(store, published, sweep_settings, depths) == 1


# ---- sweep: lost leases --------------------------------------------------------------------------


async def test_sweep_republishes_an_active_row_whose_lease_expired_past_the_grace(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    lost = await claimed(api, store, queue="gpu")
    waiting = await claimed(api, store)  # input_required and its worker died: lost too
    db.execute("UPDATE mcp_tasks SET status = 'input_required' WHERE task_id = %s", (waiting.task_id,))
    within_grace = await claimed(api, store)
    alive = await claimed(api, store)
    done = await finished(api, store)
    move(db, lost.task_id, "lease_until = now() - interval '10 seconds'")
    move(db, waiting.task_id, "lease_until = now() - interval '20 seconds'")
    move(db, within_grace.task_id, "lease_until = now() - interval '1 second'")
    move(db, done.task_id, "lease_until = now() - interval '1 minute'")
    before = {r.task_id: row(db, r.task_id) for r in (within_grace, alive, done)}

    assert sweep(store, published, sweep_settings) == 2
    assert sorted(published) == sorted([(lost.job_id, "gpu"), (waiting.job_id, "mcp.default")])
    assert {task_id: row(db, task_id) for task_id in before} == before
    # Handed back to the queue once: lease cleared (the next claim is the new worker's), stamped
    # as published now; the next sweeps do not publish it again (issue 19: 96 messages for 20
    # re-runs), unless its message goes missing from the broker.
    for record in (lost, waiting):
        raw = row(db, record.task_id)
        assert raw is not None and raw["lease_until"] is None and raw["attempts"] == 1
    published.clear()
    assert sweep(store, published, sweep_settings) == 0
    assert store.claim(lost.job_id, "host-b:7:bbbb", LEASE_S) is not None


# ---- sweep: giving up ----------------------------------------------------------------------------


async def test_sweep_fails_rows_undispatched_past_the_fail_threshold_and_notifies(
    api: ApiStore,
    store: WorkerStore,
    db: Db,
    db_url: str,
    sweep_settings: Settings,
    published: list[tuple[str, str]],
) -> None:
    hopeless = await create(api, new_task())
    late = await create(api, new_task())
    move(db, hopeless.task_id, "created_at = now() - interval '20 minutes'")
    move(db, late.task_id, "created_at = now() - interval '1 minute'")
    # The publishers recorded a broker outage 16 minutes ago that has not ended.
    store.broker_down(True)
    db.execute(
        "UPDATE mcp_maintenance SET last_run_at = now() - interval '16 minutes' WHERE job = 'broker-down'"
    )
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN " + queries.NOTIFY_CHANNEL)

        assert sweep(store, published, sweep_settings) == 1

        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == [hopeless.task_id]
    assert published == [(late.job_id, "mcp.default")]  # published, not failed
    failed = await api.get_task(hopeless.task_id, OWNER)
    assert failed is not None and failed.status == "failed"
    assert failed.error is not None and failed.error["code"] == codes.INTERNAL_ERROR
    assert "could not be queued" in failed.error["message"]
    assert failed.result is None
    raw = row(db, hopeless.task_id)
    assert raw is not None and raw["finished_at"] is not None and raw["dispatched_at"] is None
    assert failed.expires_at is not None and failed.expires_at > failed.db_now  # readable for its retention


async def test_sweep_never_fails_a_job_for_waiting_in_the_backlog_while_the_broker_is_fine(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    # Behind another principal's thousands of jobs, a job may wait longer than the old "could
    # not be queued" threshold: it is not failed for that, only for a long broker outage.
    patient = await create(api, new_task(owner="token:bob"))
    move(db, patient.task_id, "created_at = now() - interval '20 minutes'")
    db.execute("UPDATE mcp_tasks SET dispatched_at = NULL")
    settings = sweep_settings.model_copy(update={"dispatch_ahead": 0})  # no room in the broker
    store.broker_down(True)  # an outage that just began
    assert sweep(store, published, settings) == 0
    assert raw_row(db, patient.task_id)["status"] == "working"
    store.broker_down(False)
    db.execute("UPDATE mcp_maintenance SET last_run_at = now() - interval '1 hour'")
    assert sweep(store, published, settings) == 0
    assert raw_row(db, patient.task_id)["status"] == "working"


async def test_sweep_records_its_run(
    api: ApiStore, store: WorkerStore, db: Db, sweep_settings: Settings, published: list[tuple[str, str]]
) -> None:
    record = await create(api, new_task())
    move(db, record.task_id, "created_at = now() - interval '1 minute'")
    assert sweep(store, published, sweep_settings) == 1
    ran = db.execute("SELECT last_count, now() - last_run_at AS ago FROM mcp_maintenance WHERE job = 'sweep'")
    found = ran.fetchone()
    assert found is not None and found["last_count"] == 1 and found["ago"].total_seconds() < 5


# ---- collect_garbage ---------------------------------------------------------------------------


def count(db: Db, sql: LiteralString) -> int:
    found = db.execute(sql).fetchone()
    assert found is not None
    return int(next(iter(found.values())))


async def test_collect_garbage_deletes_only_expired_rows_without_a_live_lease(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    expired = [await finished(api, store) for _ in range(3)]
    db.execute(
        "INSERT INTO mcp_task_inputs (task_id, key, method, params, params_hash) "
        "VALUES (%s, 'k', 'elicitation/create', '{}', 'h')",
        (expired[0].task_id,),
    )
    for record in expired:
        move(db, record.task_id, "expires_at = now() - interval '1 second'")
    not_yet = await finished(api, store)
    stopping = await claimed(api, store)  # cancelled, its worker still winding down
    await api.request_cancel(stopping.task_id, OWNER)
    move(db, stopping.task_id, "expires_at = now() - interval '1 second'")
    active = await claimed(api, store)

    assert gc.collect_garbage(store) == 3
    left = {r["task_id"] for r in db.execute("SELECT task_id FROM mcp_tasks").fetchall()}
    assert left == {not_yet.task_id, stopping.task_id, active.task_id}
    assert count(db, "SELECT count(*) FROM mcp_task_inputs") == 0
    # Once the stopping worker's lease is over, its row goes too.
    move(db, stopping.task_id, "lease_until = now() - interval '1 second'")
    assert gc.collect_garbage(store) == 1


async def test_collect_garbage_deletes_in_bounded_batches(api: ApiStore, store: WorkerStore, db: Db) -> None:
    for _ in range(25):
        record = await finished(api, store)
        move(db, record.task_id, "expires_at = now() - interval '1 second'")

    assert gc.collect_garbage(store, batch=10, max_batches=2) == 20
    assert count(db, "SELECT count(*) FROM mcp_tasks") == 5
    # The rest is the next run's.
    assert gc.collect_garbage(store, batch=10, max_batches=2) == 5
    assert count(db, "SELECT count(*) FROM mcp_tasks") == 0
    assert gc.collect_garbage(store, batch=10, max_batches=2) == 0


async def test_collect_garbage_records_its_run_in_mcp_maintenance(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    record = await finished(api, store)
    move(db, record.task_id, "expires_at = now() - interval '1 second'")
    assert gc.collect_garbage(store) == 1
    ran = db.execute(
        "SELECT last_count, now() - last_run_at AS ago FROM mcp_maintenance WHERE job = 'collect_garbage'"
    ).fetchone()
    assert ran is not None and ran["last_count"] == 1 and ran["ago"].total_seconds() < 5
    assert gc.collect_garbage(store) == 0
    again = db.execute("SELECT last_count FROM mcp_maintenance WHERE job = 'collect_garbage'").fetchone()
    assert again == {"last_count": 0}


async def test_collect_garbage_skips_while_another_collector_holds_the_lock(
    api: ApiStore, store: WorkerStore, db: Db, db_url: str
) -> None:
    record = await finished(api, store)
    move(db, record.task_id, "expires_at = now() - interval '1 second'")
    with psycopg.connect(db_url) as other:
        assert other.execute("SELECT pg_try_advisory_xact_lock(%s)", (queries.GC_LOCK_KEY,)).fetchone() == (
            True,
        )
        assert gc.collect_garbage(store) == 0
        assert row(db, record.task_id) is not None
        other.rollback()
    assert gc.collect_garbage(store) == 1


# ---- the overdue alarm -------------------------------------------------------------------------


async def test_gc_overdue_reports_a_collector_that_stopped_running(
    store: WorkerStore, db: Db, sweep_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    assert gc.gc_overdue(store, sweep_settings) is None  # never ran: nothing to compare with
    gc.collect_garbage(store)
    assert gc.gc_overdue(store, sweep_settings) is None
    # The alarm allows gc_alarm_intervals * gc_interval_seconds = 180 s.
    db.execute("UPDATE mcp_maintenance SET last_run_at = now() - interval '170 seconds'")
    assert gc.gc_overdue(store, sweep_settings) is None
    db.execute("UPDATE mcp_maintenance SET last_run_at = now() - interval '1 hour'")
    overdue = gc.gc_overdue(store, sweep_settings)
    assert overdue is not None and 3600 <= overdue < 3660
    with caplog.at_level(logging.ERROR, logger="mcp_celery_tasks.maintenance.gc"):
        sweep(store, [], sweep_settings)
    assert any("ALARM" in r.getMessage() for r in caplog.records)
    gc.collect_garbage(store)
    assert gc.gc_overdue(store, sweep_settings) is None


# ---- TTL: nothing readable disappears before createdAt + ttlMs ----------------------------------


async def test_a_finished_task_stays_readable_until_created_at_plus_its_reported_ttl(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    record = await create(api, new_task(retention_ms=5_000, ttl_ms=5_000))
    while_working = await api.get_task(record.task_id, OWNER)
    assert while_working is not None
    assert store.claim(record.job_id, ME, LEASE_S) is not None
    await asyncio.sleep(0.05)  # a run that takes a moment: the final TTL must cover the time it ran
    assert store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})

    done = await api.get_task(record.task_id, OWNER)
    assert done is not None and done.expires_at is not None
    ttl_ms = done.reported_ttl_ms()
    # Never shorter than a TTL reported earlier, and exactly where the collector will look.
    assert ttl_ms >= while_working.reported_ttl_ms()
    end = done.created_at.timestamp() * 1000 + ttl_ms
    assert abs(end - done.expires_at.timestamp() * 1000) < 1
    assert end > done.db_now.timestamp() * 1000

    assert gc.collect_garbage(store) == 0
    assert await api.get_task(record.task_id, OWNER) is not None
    move(db, record.task_id, "expires_at = now() - interval '1 millisecond'")
    assert gc.collect_garbage(store) == 1
    assert await api.get_task(record.task_id, OWNER) is None


async def test_the_collector_deletes_expired_sessions_only(
    db: Db, api: ApiStore, sweep_settings: Settings
) -> None:
    assert await api.create_session("fresh", OWNER, "2025-11-25", {}, None)
    assert await api.create_session("idle", OWNER, "2025-11-25", {}, None)
    assert await api.create_session("old", OWNER, "2025-11-25", {}, None)
    db.execute("UPDATE mcp_sessions SET last_used_at = now() - interval '2 hours' WHERE session_id = 'idle'")
    db.execute("UPDATE mcp_sessions SET created_at = now() - interval '8 days' WHERE session_id = 'old'")
    assert await api.get_session("idle", OWNER) is None  # expired: unknown at once
    store = WorkerStore(sweep_settings)
    gc.collect_garbage(store)
    store.close()
    left = [row["session_id"] for row in db.execute("SELECT session_id FROM mcp_sessions").fetchall()]
    assert left == ["fresh"]


async def test_collect_garbage_takes_a_task_steps_checkpoints_and_checkpoint_files_with_it(
    api: ApiStore, store: WorkerStore, db: Db, tmp_path: Path
) -> None:
    root = tmp_path / "checkpoints"
    expired, live = await claimed(api, store), await claimed(api, store)
    for record in (expired, live):
        assert store.record_step(record.task_id, ME, 1, "fetch", '{"rows": 1}')
        assert store.save_checkpoint(record.task_id, ME, "in-chunks", "g1", iter([b"abc"])) is not None
        files = DirectoryCheckpoints(store, root, record.task_id, record.job_id, ME)
        assert files.save("as-file", "g2", iter([b"weights"])) is not None
    (root / "young-orphan").mkdir()
    assert store.finish(expired.task_id, ME, "completed", result={"content": [], "isError": False})
    move(db, expired.task_id, "expires_at = now() - interval '1 second'")
    an_hour_ago = time.time() - 3600
    for job_id in (expired.job_id, live.job_id):
        os.utime(root / job_id, (an_hour_ago, an_hour_ago))

    assert gc.collect_garbage(store, checkpoint_dir=str(root)) == 1
    for table in ("mcp_task_steps", "mcp_task_checkpoints", "mcp_task_checkpoint_chunks"):
        rows = db.execute(f"SELECT DISTINCT task_id FROM {table}").fetchall()
        assert [row["task_id"] for row in rows] == [live.task_id], table
    assert sorted(entry.name for entry in root.iterdir()) == sorted([live.job_id, "young-orphan"])
    assert [path.name.split(".")[0] for path in (root / live.job_id).iterdir()] == ["as-file"]
