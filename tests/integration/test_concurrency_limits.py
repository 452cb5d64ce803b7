"""Concurrency limits in the fair release pass, against real Postgres (``store.backlog.RELEASE``):
a group's jobs in flight never exceed its limit, a full group hides no other job, principals take
turns inside a group, admins' overrides and pauses apply, and every limit change is audited.

The tests play the worker with ``claim`` and ``finish``, as ``test_fair_dispatch`` does.
"""

from __future__ import annotations

import asyncio

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, TaskRecord, WorkerStore
from tests.integration.conftest import Db
from tests.integration.test_maintenance import LEASE_S, new_task

ALICE = "token:alice"
BOB = "token:bob"
QUEUE = "mcp.default"
TRAIN = "train_model"
ME = "host:1:aaaa"


async def make(
    api: ApiStore,
    count: int,
    *,
    owner: str = ALICE,
    tool: str = TRAIN,
    group: str | None = "",
    limit: int | None = 1,
) -> list[TaskRecord]:
    records = []
    for _ in range(count):
        task = new_task(owner=owner, tool_name=tool, concurrency_group=group, concurrency_limit=limit)
        record = await api.create_task(task)
        assert record is not None
        records.append(record)
    return records


def released_ids(store: WorkerStore, ahead: int = 10) -> list[str]:
    return [job for job, _ in store.release_jobs(QUEUE, ahead, 0)]


def run_all(store: WorkerStore, job_ids: list[str]) -> None:
    for job_id in job_ids:
        assert store.claim(job_id, ME, LEASE_S) is not None


def finish(store: WorkerStore, records: list[TaskRecord], job_id: str) -> None:
    task_id = next(r.task_id for r in records if r.job_id == job_id)
    assert store.finish(task_id, ME, "completed", result={"content": [], "isError": False})


async def test_one_run_per_key_and_both_keys_progress_in_one_pass(api: ApiStore, store: WorkerStore) -> None:
    # Ten of model a created first, then ten of b, all by one principal, on four slots: one pass
    # releases one of each (a full group hides nothing behind it), never a second of either.
    a = await make(api, 10, group="model=a")
    b = await make(api, 10, group="model=b")
    first = released_ids(store, ahead=4)
    assert first == [a[0].job_id, b[0].job_id]
    assert released_ids(store, ahead=4) == []  # both groups are full: room stays unused
    run_all(store, first)
    assert released_ids(store, ahead=4) == []  # running still counts
    finish(store, a, a[0].job_id)
    assert released_ids(store, ahead=4) == [a[1].job_id]


async def test_a_tool_wide_limit_and_other_tools_are_not_blocked(api: ApiStore, store: WorkerStore) -> None:
    limited = await make(api, 5, limit=2)
    others = await make(api, 3, tool="slow_compute", group=None, limit=None)
    released = released_ids(store, ahead=10)
    # The first pass of a queue that never had limited jobs releases the others first, then
    # learns the queue has limited ones and releases those it may in the same call.
    assert sorted(released) == sorted([limited[0].job_id, limited[1].job_id, *(r.job_id for r in others)])
    assert released_ids(store, ahead=10) == []


async def test_principals_take_turns_inside_a_group(api: ApiStore, store: WorkerStore) -> None:
    # Alice asked first for four runs, bob for four; two at once. The group's two places go one
    # to each (lowest turn: jobs in flight plus rank), and a freed place to whoever holds fewer.
    alice = await make(api, 4, owner=ALICE, group="model=a", limit=2)
    bob = await make(api, 4, owner=BOB, group="model=a", limit=2)
    first = released_ids(store)
    assert first == [alice[0].job_id, bob[0].job_id]
    run_all(store, first)
    finish(store, alice, alice[0].job_id)
    assert released_ids(store) == [alice[1].job_id]  # alice holds none now, bob one
    finish(store, bob, bob[0].job_id)
    assert released_ids(store) == [bob[1].job_id]


async def test_a_cancelled_waiting_job_never_runs_and_frees_nothing_it_never_held(
    api: ApiStore, store: WorkerStore
) -> None:
    jobs = await make(api, 3, group="model=a")
    assert released_ids(store) == [jobs[0].job_id]
    await api.request_cancel(jobs[1].task_id, ALICE)  # waiting for its group: ends at once
    cancelled = await api.get_task(jobs[1].task_id, ALICE)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert released_ids(store) == []  # the running one still holds the group
    run_all(store, [jobs[0].job_id])
    finish(store, jobs, jobs[0].job_id)
    assert released_ids(store) == [jobs[2].job_id]


async def test_overrides_raise_lower_and_pause_a_group_and_each_change_is_audited(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    jobs = await make(api, 6, group="model=a", limit=1)
    store.set_tool_limit(TRAIN, 3, actor="ops-alice", note="bigger GPUs")  # every group of the tool
    assert len(released_ids(store)) == 3
    store.set_tool_limit(TRAIN, 0, group="model=a", actor="ops-bob")  # this group: paused
    run_all(store, [r.job_id for r in jobs[:3]])
    for record in jobs[:3]:
        finish(store, jobs, record.job_id)
    assert released_ids(store) == []
    assert store.clear_tool_limit(TRAIN, group="model=a", actor="ops-bob")
    assert len(released_ids(store)) == 3  # back to the tool's override
    assert not store.clear_tool_limit(TRAIN, group="model=zzz", actor="ops-bob")

    changes = store.limit_changes()
    summary = [(c["target"], c["field"], c["old_value"], c["new_value"]) for c in reversed(changes)]
    assert summary == [
        ("tool train_model", "concurrency", None, "3"),
        ("tool train_model", "note", None, "bigger GPUs"),
        ("tool train_model for model=a", "concurrency", None, "0"),
        ("tool train_model for model=a", "concurrency", "0", None),
    ]
    assert str(changes[-1]["actor"]).startswith("ops-alice (db role ")
    assert [row["concurrency_group"] for row in store.tool_limits()] == ["*"]


async def test_principal_limit_changes_are_audited_old_to_new(store: WorkerStore) -> None:
    store.set_principal_limits(ALICE, actor="ops", max_active_tasks=5)
    store.set_principal_limits(ALICE, actor="ops", max_active_tasks=7, note="launch week")
    store.set_principal_limits(ALICE, actor="ops", max_active_tasks=7)  # no change: no row
    assert store.clear_principal_limits(ALICE, actor="ops")
    summary = [(c["field"], c["old_value"], c["new_value"]) for c in reversed(store.limit_changes())]
    assert summary == [
        ("max_active_tasks", None, "5"),
        ("max_active_tasks", "5", "7"),
        ("note", None, "launch week"),
        ("max_active_tasks", "7", None),
        ("note", "launch week", None),
    ]


async def test_a_waiting_task_says_what_it_waits_for(api: ApiStore, store: WorkerStore) -> None:
    jobs = await make(api, 2, group="model=moons")
    released_ids(store)
    assert await api.group_wait(jobs[1].task_id) == (TRAIN, "model=moons", 1, 1)
    assert await api.group_wait(jobs[0].task_id) is None  # published: not waiting
    store.set_tool_limit(TRAIN, 2, actor="ops")
    assert await api.group_wait(jobs[1].task_id) == (TRAIN, "model=moons", 2, 1)


async def test_a_suspended_job_holds_no_place_in_its_group(api: ApiStore, store: WorkerStore, db: Db) -> None:
    jobs = await make(api, 2, group="model=a")
    (first,) = released_ids(store)
    run_all(store, [first])
    # As ``SUSPEND`` leaves it: no lease, no worker, waiting for an answer.
    db.execute(
        "UPDATE mcp_tasks SET status = 'input_required', worker = NULL, lease_until = NULL,"
        " suspended_at = now() WHERE job_id = %s",
        (first,),
    )
    assert released_ids(store) == [jobs[1].job_id]


# ---- creates per second across API replicas (``queries.CREATE_TASK``'s shared bucket) ----------


async def test_the_creates_bucket_is_shared_by_every_api_process(
    api: ApiStore, store_settings: Settings
) -> None:
    other = ApiStore(store_settings)  # a second replica on the same database
    await other.open()
    try:
        made = []
        for store in (api, other, api):  # the burst of 3, spent across both
            made.append(await store.create_task(new_task(owner=ALICE), rate=0.5, burst=3))
        assert all(record is not None for record in made)
        assert await other.create_task(new_task(owner=ALICE), rate=0.5, burst=3) is None
        assert await api.create_task(new_task(owner=ALICE), rate=0.5, burst=3) is None
        wait = await api.bucket_wait(ALICE, 0.5, 3)
        assert wait is not None and 0 < wait <= 2.0
        assert await other.create_task(new_task(owner=BOB), rate=0.5, burst=3) is not None  # his own
        assert await api.create_task(new_task(owner=ALICE)) is not None  # rate 0: no bucket at all
    finally:
        await other.close()


async def test_a_refill_gives_tokens_back_at_the_rate(api: ApiStore) -> None:
    assert await api.create_task(new_task(owner=ALICE), rate=20, burst=1) is not None
    assert await api.create_task(new_task(owner=ALICE), rate=20, burst=1) is None
    await asyncio.sleep(0.08)  # 1.6 tokens' worth, capped at the burst of 1
    assert await api.create_task(new_task(owner=ALICE), rate=20, burst=1) is not None
    assert await api.create_task(new_task(owner=ALICE), rate=20, burst=1) is None


async def test_a_keyed_replay_takes_no_token(api: ApiStore) -> None:
    keyed = new_task(owner=ALICE, idempotency_key="k-1", request_digest="d")
    first = await api.create_task(keyed, rate=0.01, burst=1)
    assert first is not None
    again = await api.create_task(
        new_task(owner=ALICE, idempotency_key="k-1", request_digest="d"), rate=0.01, burst=1
    )
    assert again is not None and again.task_id == first.task_id  # found, not refused by the empty bucket
    assert await api.create_task(new_task(owner=ALICE), rate=0.01, burst=1) is None  # empty indeed


async def test_the_collector_forgets_idle_buckets_only(api: ApiStore, store: WorkerStore, db: Db) -> None:
    await api.create_task(new_task(owner=ALICE), rate=1, burst=5)
    await api.create_task(new_task(owner=BOB), rate=1, burst=5)
    db.execute(
        "UPDATE mcp_principal_buckets SET stamp = now() - interval '2 hours' WHERE principal = %s", (BOB,)
    )
    assert store.delete_idle_buckets(100) == 1
    rows = db.execute("SELECT principal FROM mcp_principal_buckets").fetchall()
    assert [row["principal"] for row in rows] == [ALICE]


async def test_a_create_refused_for_active_tasks_takes_no_token(api: ApiStore) -> None:
    assert await api.create_task(new_task(owner=ALICE), max_active=1, rate=0.01, burst=2) is not None
    assert await api.create_task(new_task(owner=ALICE), max_active=1, rate=0.01, burst=2) is None
    assert await api.bucket_wait(ALICE, 0.01, 2) == 0  # the second token is still there
    assert await api.create_task(new_task(owner=ALICE), max_active=5, rate=0.01, burst=2) is not None


# ---- requests in progress across API replicas (``tasks.shared_load``) --------------------------


async def test_replicas_see_each_others_requests_in_progress_and_forget_the_silent(
    api: ApiStore, db: Db
) -> None:
    assert await api.share_load("a", {ALICE: 2, BOB: 1}, 5.0) == {}
    assert await api.share_load("b", {ALICE: 1}, 5.0) == {ALICE: 2, BOB: 1}
    assert await api.share_load("a", {ALICE: 3}, 5.0) == {ALICE: 1}  # a's own rows replaced, b's seen
    assert await api.share_load("b", {}, 5.0) == {ALICE: 3}  # bob is gone from a
    db.execute("UPDATE mcp_api_load SET updated_at = now() - interval '10 seconds' WHERE replica = 'a'")
    assert await api.share_load("b", {}, 5.0) == {}  # a went silent: no longer counted
    db.execute("UPDATE mcp_api_load SET updated_at = now() - interval '2 minutes' WHERE replica = 'a'")
    await api.share_load("b", {ALICE: 1}, 5.0)
    rows = db.execute("SELECT replica FROM mcp_api_load").fetchall()
    assert [row["replica"] for row in rows] == ["b"]  # a's rows deleted on the way
    await api.forget_load("b")
    assert db.execute("SELECT replica FROM mcp_api_load").fetchall() == []
