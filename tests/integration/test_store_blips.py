"""The store's side of blips against real Postgres: giving a job back (a redelivery, not an
attempt), the redelivery cap, leases that lapsed before the server (re)started, and ``stopping``
tasks that nobody runs any more."""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from collections.abc import AsyncIterator, Iterator

import pytest
from mcp_types import jsonrpc as codes
from psycopg_pool import PoolTimeout

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, TaskError, WorkerStore
from tests.integration.conftest import Db
from tests.integration.test_store import LEASE_S, ME, RIVAL, create, new_task, raw_row, running, set_columns


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


async def test_a_job_given_back_keeps_its_attempt_count_and_is_free_at_once(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    record = await running(api, worker_store)
    assert raw_row(db, record.task_id)["attempts"] == 1
    assert worker_store.give_back(record.task_id, ME)
    row = raw_row(db, record.task_id)
    assert (row["attempts"], row["redeliveries"], row["worker"]) == (0, 1, None)
    assert row["status"] == "working" and row["lease_until"] is not None  # lapsed, for the sweeper
    claimed = worker_store.claim(record.job_id, RIVAL, LEASE_S)  # no waiting for a grace
    assert claimed is not None and claimed.attempts == 1
    assert not worker_store.give_back(record.task_id, ME)  # fenced: not ours any more


async def test_a_job_given_back_too_often_is_refused_and_failed(
    api: ApiStore, settings: Settings, db: Db
) -> None:
    store = WorkerStore(settings.model_copy(update={"max_redeliveries": 2}))
    try:
        record = await create(api, new_task())
        for _ in range(2):
            assert store.claim(record.job_id, ME, LEASE_S) is not None
            assert store.give_back(record.task_id, ME)
        assert store.claim(record.job_id, ME, LEASE_S) is None
        state = store.job_state(record.job_id)
        assert state is not None and state["redeliveries"] == 2 and state["lease_left_s"] == 0
        error: TaskError = {"code": codes.INTERNAL_ERROR, "message": "handed back"}
        assert store.fail_exhausted(record.job_id, error, "handed back", "redeliveries_exhausted")
        row = raw_row(db, record.task_id)
        assert (row["status"], row["error_kind"]) == ("failed", "redeliveries_exhausted")
    finally:
        store.close()


async def test_a_lease_counts_as_lapsed_only_a_grace_after_the_server_started(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    # As if the lease ran out long before the server (re)started: nobody could renew it then.
    record = await running(api, worker_store)
    set_columns(db, record.task_id, "lease_until = now() - interval '100 years'")
    up = db.execute("SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())::float AS s").fetchone()
    assert up is not None
    # A grace longer than the server has been up: the lapse counts from the start, not before.
    assert worker_store.lost_leases(up["s"] + 60.0, 10) == []
    # A grace shorter than that: lost, and another worker may claim it.
    assert worker_store.lost_leases(1.0, 10) == [(record.job_id, "mcp.default")]
    assert worker_store.claim(record.job_id, RIVAL, LEASE_S) is not None


async def test_stopping_ends_when_nobody_runs_the_job(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    alive = await running(api, worker_store)
    dead = await running(api, worker_store)
    given_back = await running(api, worker_store)
    assert worker_store.give_back(given_back.task_id, ME)
    for record in (alive, dead, given_back):
        assert worker_store.admin_cancel(record.job_id, "cancelled by an admin").found
    set_columns(db, dead.task_id, "lease_until = now() - interval '1 minute'")  # its worker died
    assert worker_store.end_unattended_stops() == 2
    assert raw_row(db, dead.task_id)["finished_at"] is not None
    assert raw_row(db, given_back.task_id)["finished_at"] is not None
    assert raw_row(db, alive.task_id)["finished_at"] is None  # a live lease: its worker stops it
    shown = db.execute(
        "SELECT task_id, status FROM mcp_tasks_overview WHERE task_id = ANY(%s)",
        ([alive.task_id, dead.task_id, given_back.task_id],),
    ).fetchall()
    assert {r["task_id"]: r["status"] for r in shown} == {
        alive.task_id: "stopping",
        dead.task_id: "cancelled",
        given_back.task_id: "cancelled",
    }
    assert worker_store.end_unattended_stops() == 0


async def test_a_sweep_that_could_not_reach_the_database_holds_back_lost_lease_reclaims(
    api: ApiStore, settings: Settings, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep_settings = settings.model_copy(update={"lease_grace_seconds": 1.0, "lease_seconds": 30.0})
    store = WorkerStore(sweep_settings)
    monkeypatch.setattr(gc, "_missed", False)
    published: list[tuple[str, str]] = []

    def sweep() -> int:
        return gc.sweep(store, lambda job, queue: published.append((job, queue)), sweep_settings,
                        queue_depth=lambda queue: 100)  # fmt: skip

    try:
        record = await create(api, new_task())
        assert store.mark_dispatched([record.job_id]) == 1
        assert store.claim(record.job_id, ME, LEASE_S) is not None
        set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")
        sweep()  # a normal sweep: the lease is lost, the job published again
        assert published == [(record.job_id, "mcp.default")]
        published.clear()
        # Handed back once (fair dispatch): claimed again, and its lease lapses again.
        assert store.claim(record.job_id, ME, LEASE_S) is not None
        set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")

        def unreachable(*args: object, **kwargs: object) -> int:
            raise InfrastructureError("the task database is unavailable")

        with monkeypatch.context() as patched:
            patched.setattr(store, "seconds_since_run", unreachable)  # the sweep's first read
            with pytest.raises(InfrastructureError):
                sweep()
        sweep()  # the database is back: a lapsed lease may be a live worker's that could not renew
        assert published == []
        gap = db.execute("SELECT 1 FROM mcp_maintenance WHERE job = %s", (gc.GAP,)).fetchone()
        assert gap is not None
        db.execute(
            "UPDATE mcp_maintenance SET last_run_at = now() - interval '1 hour' WHERE job = %s", (gc.GAP,)
        )
        sweep()  # a lease and its grace after the gap: a lapsed lease means a dead worker again
        assert published == [(record.job_id, "mcp.default")]
    finally:
        store.close()


async def test_statements_beyond_the_pool_wait_their_turn_and_a_full_pool_answers_within_the_bound(
    settings: Settings,
) -> None:
    """``ApiStore`` queues statements on its slots (one per pooled connection): many more than
    the pool all get answers; when every slot stays busy, a waiter gives up after the connect
    bound as the pool would (a 503 upstream), not after the busy statements end."""
    bound_s = 0.4
    store = ApiStore(
        settings.model_copy(
            update={"db_pool_min": 1, "db_pool_max": 2, "db_connect_timeout_seconds": bound_s}
        )
    )
    await store.open()
    try:
        record = await create(store, new_task())
        assert record is not None
        reads = await asyncio.gather(*(store.get_task(record.task_id, record.owner) for _ in range(40)))
        assert all(read is not None and read.task_id == record.task_id for read in reads)

        busy = [asyncio.create_task(store._fetch("SELECT pg_sleep(3)", {})) for _ in range(2)]
        await asyncio.sleep(0.3)  # both slots taken
        started = time.monotonic()
        with pytest.raises(InfrastructureError) as raised:
            await store.get_task(record.task_id, record.owner)
        waited = time.monotonic() - started
        assert bound_s * 0.9 <= waited < 2.0, waited
        assert isinstance(raised.value.__cause__, PoolTimeout)
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
    finally:
        await store.close()


async def test_the_watchdog_keeps_a_cancelled_jobs_lease_while_its_process_lives(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    # issue 28: with the lease short and the cancel grace long, the lease used to lapse after the
    # cancel and the sweeper ended the job as nobody's while its body still ran.
    record = await running(api, worker_store)
    assert worker_store.admin_cancel(record.job_id, "cancelled by an admin").found
    set_columns(db, record.task_id, "lease_until = now() + interval '1 second'")  # about to lapse
    jobs = [{"job_id": record.job_id, "holder": ME, "renew": True}]
    seen = worker_store.watch_jobs(jobs, LEASE_S)[f"{record.job_id} {ME}"]
    assert (seen["status"], seen["ours"], seen["finished"]) == ("cancelled", True, False)
    left = db.execute(
        "SELECT EXTRACT(EPOCH FROM lease_until - now())::float AS s FROM mcp_tasks WHERE task_id = %s",
        (record.task_id,),
    ).fetchone()
    assert left is not None and left["s"] > LEASE_S - 5  # renewed, though the task is cancelled
    assert worker_store.end_unattended_stops() == 0  # a live lease: the watchdog stops it
    assert raw_row(db, record.task_id)["finished_at"] is None


async def test_a_cancelled_job_the_sweeper_ended_is_still_the_watchdogs_to_stop(
    api: ApiStore, worker_store: WorkerStore, db: Db
) -> None:
    # The lease lapsed all the same (the database was out of reach, or the child was frozen):
    # the sweeper's "nobody was running it" is not the child saying it stopped.
    record = await running(api, worker_store)
    assert worker_store.admin_cancel(record.job_id, "cancelled by an admin").found
    set_columns(db, record.task_id, "lease_until = now() - interval '1 minute'")
    assert worker_store.end_unattended_stops() == 1
    jobs = [{"job_id": record.job_id, "holder": ME, "renew": True}]
    seen = worker_store.watch_jobs(jobs, LEASE_S)[f"{record.job_id} {ME}"]
    assert (seen["ours"], seen["finished"]) == (True, False)
    assert worker_store.force_stopped(record.task_id, ME, "did not stop within 5 s of the cancel")
    row = raw_row(db, record.task_id)
    assert row["stop_reason"] == "did not stop within 5 s of the cancel" and row["finished_at"] is not None
    seen = worker_store.watch_jobs(jobs, LEASE_S)[f"{record.job_id} {ME}"]
    assert seen["finished"] is True


async def test_the_watchdog_recognises_the_exact_identity_a_child_claimed_as(
    api: ApiStore, worker_store: WorkerStore
) -> None:
    record = await running(api, worker_store)
    other_process = "host-a:101:cccc3333"  # the same pid, another process (another nonce)
    jobs = [{"job_id": record.job_id, "holder": h, "renew": False} for h in (ME, other_process)]
    seen = worker_store.watch_jobs(jobs, LEASE_S)
    assert seen[f"{record.job_id} {ME}"]["ours"] is True
    assert seen[f"{record.job_id} {other_process}"]["ours"] is False


def test_a_child_forked_after_the_parent_connected_lets_go_of_the_parents_socket(
    worker_store: WorkerStore,
) -> None:
    """A pool child that replaces a stopped one inherits the main process's connection. Its copy
    of the socket must go (without a goodbye to the server, which would end the parent's
    session): after a failover the parent connects anew, and a copy kept by the child would
    hold the dead primary's socket in CLOSE_WAIT for the child's whole life."""
    assert worker_store.job_state("no-such-job") is None  # connects
    assert worker_store._conn is not None
    socket_fd = worker_store._conn.pgconn.socket
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: only os._exit from here on
        code = 3
        try:
            worker_store.forget_after_fork()
            try:
                os.fstat(socket_fd)
                code = 1  # still open in the child
            except OSError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child kept the parent's socket open"
    assert worker_store.job_state("no-such-job") is None  # the parent's session goes on
    assert worker_store._conn.pgconn.socket == socket_fd  # on the same connection
