"""Retries waiting in the backlog, against real Postgres (``store.retry_queries``): a job whose
retry is scheduled is a backlog row no release, place in line, claim, demand count or outage
failure touches until its time; the release of due retries; the fence and the cancel.

No broker: the tests play the worker with ``claim`` and ``schedule_retry`` (the whole path with a
worker is tests/e2e/test_retries.py).
"""

from __future__ import annotations

import json
from typing import LiteralString

import pytest

from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, TaskRecord, WorkerStore, queries, retry_queries
from mcp_celery_tasks.store import backlog as backlog_sql
from tests.integration.conftest import Db
from tests.integration.test_fair_dispatch import ALICE, BOB, QUEUE, backlog
from tests.integration.test_maintenance import LEASE_S, move
from tests.integration.test_store import raw_row

ME = "host:1:aaaa"
MESSAGE = "retrying in 60 s (attempt 2/3): TimeoutError: slow"


async def waiting_retry(api: ApiStore, store: WorkerStore, owner: str = ALICE) -> TaskRecord:
    """A task whose first attempt failed with a retryable error, its retry a minute away."""
    (record,) = await backlog(api, owner, 1)
    assert store.release_jobs(QUEUE, 10, 0) == [(record.job_id, QUEUE)]
    assert store.claim(record.job_id, ME, LEASE_S) is not None
    assert store.schedule_retry(record.task_id, ME, 60, MESSAGE, "retryable_error", "TimeoutError: slow")
    return record


async def test_a_waiting_retry_holds_no_place_in_line_and_is_neither_released_nor_claimed(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    retry = await waiting_retry(api, store)
    row = raw_row(db, retry.task_id)
    assert row["dispatched_at"] is None and row["worker"] is None and row["lease_until"] is None
    assert row["retry_at"] is not None and row["attempts"] == 1 and row["status_message"] == MESSAGE
    (other,) = await backlog(api, BOB, 1)

    assert store.backlog_queues() == [QUEUE]  # bob's job; alice's retry is not backlog yet
    assert store.release_jobs(QUEUE, 10, 0) == [(other.job_id, QUEUE)]
    assert store.backlog_queues() == []
    assert store.queue_position(retry.task_id) is None  # tasks/get keeps the retry's message
    assert store.claim(retry.job_id, "host:2:bbbb", LEASE_S) is None  # a stale message waits too
    demand = {r["queue"]: r for r in await api.queue_demand()}
    assert demand[QUEUE]["backlog"] == 0 and demand[QUEUE]["demand_slots"] == 1  # bob's, queued


async def test_a_long_waiting_retry_is_not_failed_as_unqueued_after_a_broker_outage(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    retry = await waiting_retry(api, store)
    (stuck,) = await backlog(api, BOB, 1)
    for task_id in (retry.task_id, stuck.task_id):
        move(db, task_id, "created_at = now() - interval '1 hour'")
    failed = store.fail_undispatched(600, {"code": -32603, "message": "not queued"}, "not queued")
    assert failed == 1
    assert raw_row(db, stuck.task_id)["status"] == "failed"
    assert raw_row(db, retry.task_id)["status"] == "working"


async def test_a_due_retry_joins_the_backlog_in_its_owners_turn_and_runs_as_the_next_attempt(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    retry = await waiting_retry(api, store)
    later = await backlog(api, ALICE, 1)
    queues, due_in = store.release_due_retries()
    assert queues == set() and due_in is not None and 55 < due_in <= 60

    move(db, retry.task_id, "retry_at = now() - interval '1 second'")
    assert store.release_due_retries() == ({QUEUE}, None)
    row = raw_row(db, retry.task_id)
    assert (
        row["retry_at"] is None and row["status_message"] == "retrying now (attempt 2/3): TimeoutError: slow"
    )
    # Older than alice's other job: it goes first.
    assert store.release_jobs(QUEUE, 1, 0) == [(retry.job_id, QUEUE)]
    claimed = store.claim(retry.job_id, "host:2:bbbb", LEASE_S)
    assert claimed is not None and claimed.attempts == 2
    assert store.release_jobs(QUEUE, 10, 0) == [(later[0].job_id, QUEUE)]


async def test_scheduling_a_retry_is_fenced_by_the_worker_and_refused_when_cancelled_or_out_of_attempts(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    (record,) = await backlog(api, ALICE, 1)
    store.release_jobs(QUEUE, 10, 0)
    assert store.claim(record.job_id, ME, LEASE_S) is not None
    assert not store.schedule_retry(record.task_id, "host:9:zzzz", 1, MESSAGE, "k", "d")  # not its worker
    db.execute("UPDATE mcp_tasks SET attempts = max_attempts WHERE task_id = %s", (record.task_id,))
    assert not store.schedule_retry(record.task_id, ME, 1, MESSAGE, "k", "d")  # that was the last
    db.execute("UPDATE mcp_tasks SET attempts = 1 WHERE task_id = %s", (record.task_id,))
    await api.request_cancel(record.task_id, ALICE)
    assert not store.schedule_retry(record.task_id, ME, 1, MESSAGE, "k", "d")
    assert raw_row(db, record.task_id)["retry_at"] is None


async def test_cancel_of_a_waiting_retry_ends_it_at_once_and_it_never_comes_due(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    retry = await waiting_retry(api, store)
    await api.request_cancel(retry.task_id, ALICE)
    row = raw_row(db, retry.task_id)
    assert row["status"] == "cancelled" and row["finished_at"] is not None  # no process to stop
    assert row["expires_at"] is not None  # its retention runs from now, as any terminal task's
    move(db, retry.task_id, "retry_at = now() - interval '1 second'")
    assert store.release_due_retries() == (set(), None)
    assert store.release_jobs(QUEUE, 10, 0) == []


async def test_retry_now_makes_only_a_still_waiting_retry_due_and_never_reopens_a_finished_task(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    # The Django admin's "Retry now" (``WorkerStore.retry_now``).
    retry = await waiting_retry(api, store)
    cancelled = await waiting_retry(api, store, BOB)
    await api.request_cancel(cancelled.task_id, BOB)
    (queued,) = await backlog(api, ALICE, 1)  # never scheduled for a retry
    (done,) = await backlog(api, BOB, 1)
    db.execute("UPDATE mcp_tasks SET status = 'failed', retry_at = now() + interval '1 hour' "
               "WHERE task_id = %s", (done.task_id,))  # fmt: skip
    ids = [retry.task_id, cancelled.task_id, queued.task_id, done.task_id, "no-such-task"]

    assert store.retry_now(ids) == [retry.task_id]
    assert store.retry_now(ids) == []  # already due: nothing more to do
    assert raw_row(db, done.task_id)["status"] == "failed"
    assert raw_row(db, cancelled.task_id)["status"] == "cancelled"
    assert store.release_due_retries()[0] == {QUEUE}
    assert raw_row(db, retry.task_id)["retry_at"] is None
    assert (retry.job_id, QUEUE) in store.release_jobs(QUEUE, 10, 0)


@pytest.mark.parametrize("index", ["ix_mcp_tasks_backlog", "ix_mcp_tasks_retry_wait"])
def test_the_retry_indexes_exist_with_their_predicates(db: Db, index: str) -> None:
    found = db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (index,)).fetchone()
    assert found is not None and "retry_at IS" in found["indexdef"]


@pytest.mark.parametrize(
    ("sql", "params", "index"),
    [
        (backlog_sql.BACKLOG_QUEUES, {}, "ix_mcp_tasks_backlog"),
        (backlog_sql.RELEASE, {"queue": QUEUE, "ahead": 4, "max_waiting": 0}, "ix_mcp_tasks_backlog"),
        (retry_queries.RELEASE_DUE, {"limit": 100}, "ix_mcp_tasks_retry_wait"),
    ],
)
def test_the_release_statements_read_through_their_partial_indexes(
    db: Db, sql: LiteralString, params: dict[str, object], index: str
) -> None:
    # Without row counts the planner would scan a tiny table; forbidding that shows whether the
    # statement's predicates match the partial index at all (a missing ``retry_at IS NULL`` does not).
    db.execute("SET enable_seqscan = off")
    try:
        plan = db.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()
    finally:
        db.execute("RESET enable_seqscan")
    assert plan is not None and index in json.dumps(plan)


async def test_the_sweeper_leaves_a_waiting_retry_alone_through_an_outage_and_publishes_it_when_due(
    api: ApiStore, store: WorkerStore, db: Db, store_settings: Settings
) -> None:
    published: list[tuple[str, str]] = []

    def sweep() -> int:
        return gc.sweep(
            store,
            lambda job, queue: published.append((job, queue)),
            store_settings,
            queue_depth=lambda _: 100,
        )

    retry = await waiting_retry(api, store)
    move(db, retry.task_id, "created_at = now() - interval '2 hours'")
    # The broker has been unreachable for longer than the fail threshold: backlog jobs that old
    # fail as unqueued, a retry waiting for its time does not.
    store.broker_down(True)
    db.execute(
        "UPDATE mcp_maintenance SET last_run_at = now() - interval '1 hour' WHERE job = %s",
        (queries.BROKER_DOWN_JOB,),
    )
    assert sweep() == 0 and published == []
    assert raw_row(db, retry.task_id)["status"] == "working"
    store.broker_down(False)

    move(db, retry.task_id, "retry_at = now()")
    assert sweep() == 1 and published == [(retry.job_id, QUEUE)]
    row = raw_row(db, retry.task_id)
    assert row["retry_at"] is None and row["dispatched_at"] is not None
