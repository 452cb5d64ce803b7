"""Every write waits for the WAL flush, the claim included; only fair dispatch's release does not.

An asynchronous claim would halve its latency (docs/PERFORMANCE.md), but a claim lost in a
Postgres crash leaves a row that looks never started while its body runs: the sweeper would
publish the job again and a second worker run it beside the live first one, which the
containment guarantee forbids (a job whose process lives is never run a second time).

A lost release is different (``store.backlog.ASYNC_COMMIT``): its jobs look unpublished, a later
pass publishes them again, and the claim turns the duplicate message away.
"""

from __future__ import annotations

import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, TaskRecord, WorkerStore, backlog, queries
from tests.integration.conftest import Db
from tests.integration.test_store import LEASE_S, ME, RIVAL, new_task, raw_row


async def created(settings: Settings) -> TaskRecord:
    """A task as the API creates it."""
    api = ApiStore(settings)
    await api.open()
    try:
        task = await api.create_task(new_task())
    finally:
        await api.close()
    assert task is not None
    return task


def _commits_synchronously(store: WorkerStore) -> bool:
    """The store's connection, outside any transaction, waits for the WAL flush."""
    return store._fetch("SELECT current_setting('synchronous_commit') AS value", {}) == [{"value": "on"}]


async def test_after_a_claim_the_outcome_write_on_the_same_connection_is_synchronous(
    settings: Settings, db: Db
) -> None:
    task = await created(settings)
    store = WorkerStore(settings)
    try:
        assert store.claim(task.job_id, ME, LEASE_S) is not None
        assert _commits_synchronously(store)
        assert store.finish(task.task_id, ME, "completed", result={"content": [], "isError": False})
    finally:
        store.close()
    assert raw_row(db, task.task_id)["status"] == "completed"


@pytest.mark.parametrize("name", ["CLAIM", "FINISH", "CREATE_TASK", "RECORD_ANSWERS", "CANCEL"])
def test_writes_that_must_survive_a_crash_never_turn_off_synchronous_commit(name: str) -> None:
    assert "synchronous_commit" not in getattr(queries, name)


async def test_a_release_commits_asynchronously_but_leaves_its_connection_synchronous(
    settings: Settings, db: Db
) -> None:
    task = await created(settings)
    store = WorkerStore(settings)
    try:
        assert store.release_jobs(task.queue, 4, 0) == [(task.job_id, task.queue)]
        # SET LOCAL ended with the release's transaction: the claim on the same connection waits
        # for the flush again.
        assert _commits_synchronously(store)
        assert store.claim(task.job_id, ME, LEASE_S) is not None
    finally:
        store.close()
    assert "SET LOCAL" in backlog.ASYNC_COMMIT  # never a session-wide SET on a pooled connection


async def test_a_release_lost_in_a_crash_costs_a_duplicate_message_that_the_claim_turns_away(
    settings: Settings, db: Db
) -> None:
    task = await created(settings)
    store = WorkerStore(settings)
    try:
        first = store.release_jobs(task.queue, 4, 0)
        # Postgres crashed before flushing the release: the row looks unpublished again.
        db.execute("UPDATE mcp_tasks SET dispatched_at = NULL WHERE task_id = %s", (task.task_id,))
        again = store.release_jobs(task.queue, 4, 0)
        assert first == again == [(task.job_id, task.queue)]  # two messages for one job
        assert store.claim(task.job_id, ME, LEASE_S) is not None
        assert store.claim(task.job_id, RIVAL, LEASE_S) is None  # the duplicate, while it runs
        assert store.finish(task.task_id, ME, "completed", result={"content": [], "isError": False})
        assert store.claim(task.job_id, RIVAL, LEASE_S) is None  # the duplicate, after it ran
    finally:
        store.close()
    row = raw_row(db, task.task_id)
    assert (row["status"], row["attempts"], row["worker"]) == ("completed", 1, ME)
