"""Which statements wait for the WAL flush: the claim does not, the outcome write does.

The claim commits asynchronously (``queries.ASYNC_COMMIT``): the setting must apply to the
claim's own transaction and never leak into the next statement on the same connection (the
outcome write, which must be durable before the Celery message is acknowledged).
"""

from __future__ import annotations

import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore, queries
from tests.integration.conftest import Db
from tests.integration.test_store import LEASE_S, ME, new_task, raw_row


def _setting(db: Db) -> str:
    row = db.execute("SELECT current_setting('synchronous_commit') AS value").fetchone()
    assert row is not None
    return str(row["value"])


async def test_the_claim_statement_turns_off_synchronous_commit_for_its_transaction_only(
    settings: Settings, db: Db
) -> None:
    api = ApiStore(settings)
    await api.open()
    try:
        task = await api.create_task(new_task())
    finally:
        await api.close()
    assert task is not None
    params = {"job_id": task.job_id, "worker": ME, "lease_s": LEASE_S, "grace_s": 5.0}
    with db.transaction():
        assert _setting(db) == "on"
        claimed = db.execute(queries.CLAIM, params).fetchall()
        assert [row["task_id"] for row in claimed] == [task.task_id]
        assert _setting(db) == "off"  # the claim's commit will not wait for the flush
    assert _setting(db) == "on"  # and the connection's next transaction does again


async def test_after_a_claim_the_outcome_write_on_the_same_connection_is_synchronous(
    settings: Settings, db: Db
) -> None:
    api = ApiStore(settings)
    await api.open()
    try:
        task = await api.create_task(new_task())
    finally:
        await api.close()
    assert task is not None
    store = WorkerStore(settings)
    try:
        assert store.claim(task.job_id, ME, LEASE_S) is not None
        assert store._fetch("SELECT current_setting('synchronous_commit') AS value", {}) == [{"value": "on"}]
        assert store.finish(task.task_id, ME, "completed", result={"content": [], "isError": False})
    finally:
        store.close()
    assert raw_row(db, task.task_id)["status"] == "completed"


@pytest.mark.parametrize("name", ["FINISH", "CREATE_TASK", "RECORD_ANSWERS", "CANCEL"])
def test_writes_that_must_survive_a_crash_never_turn_off_synchronous_commit(name: str) -> None:
    assert "synchronous_commit" not in getattr(queries, name)
