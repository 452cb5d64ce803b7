"""The worker registry and the demand view against real Postgres: the view's numbers are a hand
count of the rows (suspended tasks left out), a dead worker drops out by itself, a node name is
held by one live process at a time, and two beats are told apart from a beat's restart."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from mcp_celery_tasks.store.fleet import WorkerInfo
from tests import support
from tests.integration.conftest import Db

ACTIVE = "status IN ('working', 'input_required')"


@pytest.fixture
def store(db_url: str) -> Iterator[WorkerStore]:
    store = WorkerStore(Settings(database_url=db_url))
    yield store
    store.close()


def insert(db: Db, queue: str, state: str, *, worker: str | None = None) -> str:
    """A task row of ``queue`` in one of the view's states (or a terminal one)."""
    status = {"resident": "input_required", "suspended": "input_required"}.get(state, "working")
    status = state if state in ("completed", "cancelled") else status
    dispatched = state != "backlog"
    leased = state in ("running", "resident")
    task_id = uuid.uuid4().hex
    db.execute(
        """
        INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,
            poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities,
            dispatched_at, lease_until, worker, suspended_at, created_at)
        VALUES (%(task_id)s, %(job_id)s, 'anon', 'slow_compute', %(empty)s, %(status)s, 60000, 1000,
            %(queue)s, 3, '2026-07-28', %(empty)s,
            CASE WHEN %(dispatched)s THEN now() END,
            CASE WHEN %(leased)s THEN now() + interval '1 minute' END,
            %(worker)s, CASE WHEN %(suspended)s THEN now() END, now() - interval '90 seconds')
        """,
        {"task_id": task_id, "job_id": uuid.uuid4().hex, "empty": Jsonb({}), "status": status,
         "queue": queue, "dispatched": dispatched, "leased": leased, "suspended": state == "suspended",
         "worker": worker if leased else None},
    )  # fmt: skip
    return task_id


def info(node: str, *, instance: str = "one", queues: tuple[str, ...] = ("q1",), slots: int = 4,
         pids: tuple[int, ...] = (101, 102)) -> WorkerInfo:  # fmt: skip
    return WorkerInfo(
        node=node, hostname="host-a", pid=100, pids=pids, queues=queues, slots=slots, version="1.0",
        pool="prefork", instance=instance, started_at=dt.datetime.now(dt.UTC),
    )  # fmt: skip


def demand(db: Db) -> dict[str, dict[str, Any]]:
    return {row["queue"]: row for row in db.execute("SELECT * FROM mcp_queue_demand").fetchall()}


def test_the_view_splits_the_active_rows_and_leaves_suspended_ones_out_of_the_demand(
    db: Db, store: WorkerStore
) -> None:
    for state, n in (("backlog", 3), ("published", 2), ("running", 2), ("resident", 1), ("suspended", 4),
                     ("completed", 5), ("cancelled", 1)):  # fmt: skip
        for _ in range(n):
            insert(db, "q1", state, worker="host-a:101:n1")
    insert(db, "q2", "backlog")
    insert(db, "q2", "suspended")
    assert store.heartbeat(info("w1@host-a"), 30) is None

    rows = demand(db)
    q1 = rows["q1"]
    hand = db.execute(
        f"SELECT count(*) AS n FROM mcp_tasks WHERE queue = 'q1' AND {ACTIVE} AND suspended_at IS NULL"
    ).fetchone()
    assert hand is not None
    assert q1["demand_slots"] == hand["n"] == 8  # 3 + 2 + 2 + 1; the 4 suspended are not
    split = ("backlog", "published", "running", "waiting_resident", "waiting_suspended")
    assert tuple(q1[name] for name in split) == (3, 2, 2, 1, 4)
    # 4 slots - 2 running - 1 resident wait
    assert (q1["worker_slots"], q1["slots_available"], q1["workers"]) == (4, 1, 1)
    assert 85 <= q1["oldest_queued_s"] < 200
    q2 = rows["q2"]
    assert (q2["demand_slots"], q2["waiting_suspended"], q2["worker_slots"]) == (1, 1, 0)
    assert [row["queue"] for row in store.queue_demand()] == ["q1", "q2"]

    # What the worker runs now: the active rows claimed by one of its processes on its host.
    (listed,) = store.workers()
    jobs = listed["jobs"]
    assert isinstance(jobs, list)
    assert sorted(job["status"] for job in jobs) == ["input_required", "working", "working"]
    db.execute(
        "UPDATE mcp_tasks SET suspended_at = now(), lease_until = NULL, worker = NULL WHERE queue = 'q1'"
    )
    assert demand(db)["q1"]["demand_slots"] == 0  # a pool whose tasks all wait for humans scales to zero


def test_a_queue_with_only_workers_shows_its_slots_and_no_demand(db: Db, store: WorkerStore) -> None:
    assert store.heartbeat(info("w1@host-a", queues=("idle", "q1"), slots=3), 30) is None
    rows = demand(db)
    assert (rows["idle"]["demand_slots"], rows["idle"]["worker_slots"], rows["idle"]["slots_available"]) == (
        0,
        3,
        3,
    )


def test_a_worker_that_stops_beating_drops_out_after_its_timeout(db: Db, store: WorkerStore) -> None:
    assert store.heartbeat(info("dying@host-a"), 0.5) is None
    assert store.heartbeat(info("alive@host-a", instance="two"), 30) is None
    assert demand(db)["q1"]["workers"] == 2
    support.wait_until(lambda: demand(db)["q1"]["workers"] == 1, 5, 0.1, what="the dead worker to drop out")
    assert [row["node"] for row in store.workers()] == ["alive@host-a"]
    dead = [row for row in store.workers(include_dead=True) if not row["alive"]]
    assert [row["node"] for row in dead] == ["dying@host-a"]
    assert store.delete_dead_workers(kept_s=0) == 1


def test_a_node_name_is_held_by_one_live_process_and_taken_over_once_it_died(store: WorkerStore) -> None:
    assert store.heartbeat(info("same@host-a", instance="first"), 0.5) is None
    holder = store.heartbeat(info("same@host-a", instance="second"), 30)
    assert holder is not None and holder["pid"] == 100
    support.wait_until(lambda: store.heartbeat(info("same@host-a", instance="second"), 30) is None, 5, 0.1)
    assert not store.deregister(info("same@host-a", instance="first"))  # not its row any more
    assert store.deregister(info("same@host-a", instance="second"))


def test_two_beats_at_once_are_seen_and_a_restarted_beat_is_not(store: WorkerStore) -> None:
    assert store.saw_beat("gen11@beat-a", 30, 0) == []
    assert store.saw_beat("gen11@beat-a", 30, 0) == []
    # A beat that started after the last job of the other one: a restart, not two beats.
    assert store.saw_beat("gen22@beat-b", 30, 0) == []
    # The first one sends again: both run at once, and each one's next job says so.
    assert store.saw_beat("gen11@beat-a", 30, 0) == ["gen22@beat-b"]
    assert store.saw_beat("gen22@beat-b", 30, 0) == ["gen11@beat-a"]
    beats = [row for row in store.workers() if row["kind"] == "beat"]
    assert {(row["hostname"], row["pid"]) for row in beats} == {("beat-a", 11), ("beat-b", 22)}


def test_the_workers_overview_shows_live_workers_their_devices_and_the_jobs_on_them(
    db: Db, store: WorkerStore
) -> None:
    gpu = WorkerInfo(
        node="gpu@host-a", hostname="host-a", pid=100, pids=(101, 102), queues=("gpu",), slots=2,
        version="1.0", pool="prefork", instance="one", started_at=dt.datetime.now(dt.UTC),
        devices=["0", "1"],
    )  # fmt: skip
    assert store.heartbeat(gpu, 30) is None
    assert store.heartbeat(info("cpu@host-a", instance="two", pids=(201,)), 30) is None
    assert store.heartbeat(info("gone@host-a", instance="three", pids=(301,)), 30) is None
    db.execute("UPDATE mcp_workers SET expires_at = now() - interval '1 second' WHERE node = 'gone@host-a'")
    on_device = {insert(db, "gpu", "running", worker="host-a:101:n1"): "1",
                 insert(db, "gpu", "resident", worker="host-a:102:n2"): "0"}  # fmt: skip
    for task_id, device in on_device.items():
        db.execute(
            "UPDATE mcp_tasks SET device = %s, started_at = now() WHERE task_id = %s", (device, task_id)
        )
    insert(db, "gpu", "running", worker="host-b:101:n3")  # same pid, another host: not this worker's
    insert(db, "q1", "running", worker="host-a:301:n4")  # the dead worker's process
    insert(db, "gpu", "completed", worker="host-a:101:n5")  # finished: runs nothing now

    rows = {row["node"]: row for row in db.execute("SELECT * FROM mcp_workers_overview").fetchall()}
    assert set(rows) == {"gpu@host-a", "cpu@host-a"}  # the dead one is left out
    row = rows["gpu@host-a"]
    assert (row["queues"], row["slots"], row["devices"], row["running"], row["free_slots"]) == (
        ["gpu"], 2, ["0", "1"], 2, 0,
    )  # fmt: skip
    assert dt.timedelta(0) <= row["heartbeat_age"] < dt.timedelta(seconds=10)
    assert sorted((job["status"], job["device"]) for job in row["jobs"]) == [
        ("input_required", "0"), ("working", "1"),
    ]  # fmt: skip
    assert {job["job_id"] for job in row["jobs"]} == {
        found["job_id"]
        for found in db.execute("SELECT job_id FROM mcp_tasks WHERE task_id = ANY(%s)", (list(on_device),))
    }
    idle = rows["cpu@host-a"]
    assert (idle["devices"], idle["running"], idle["free_slots"], idle["jobs"]) == (None, 0, 4, [])

    # The tasks overview names the device too (what tasks ls shows).
    devices = db.execute(
        "SELECT task_id, device FROM mcp_tasks_overview WHERE task_id = ANY(%s)", (list(on_device),)
    ).fetchall()
    assert {found["task_id"]: found["device"] for found in devices} == on_device
    listed = {found["task_id"]: found["device"] for found in store.admin_list(limit=50)}
    assert {task_id: listed[task_id] for task_id in on_device} == on_device
