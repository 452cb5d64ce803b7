"""Fair dispatch against real Postgres: the release pass (``store.backlog.RELEASE``), the
waiting-for-input rule, putting jobs back, and the place in line shown to a waiting task.

No broker, but for the last test: the store's release marks jobs published and returns them; the
tests play the worker with ``claim`` and ``finish``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from mcp_celery_tasks.backlog.publisher import FairPublisher
from mcp_celery_tasks.backlog.release import BrokerUnavailable, release_and_publish
from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.broker.channel import CircuitBreaker, Publisher
from mcp_celery_tasks.errors import TooManyWaiting
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, TaskRecord, WorkerStore
from mcp_celery_tasks.store.records import InputItem
from tests import support
from tests.integration.conftest import Db
from tests.integration.test_maintenance import LEASE_S, new_task
from tests.integration.test_store import raw_row

ALICE = "token:alice"
BOB = "token:bob"
CAROL = "token:carol"
QUEUE = "mcp.default"


async def backlog(api: ApiStore, owner: str, count: int, queue: str = QUEUE) -> list[TaskRecord]:
    records = []
    for _ in range(count):
        record = await api.create_task(new_task(owner=owner, queue=queue))
        assert record is not None
        records.append(record)
    return records


def owners_of(released: list[tuple[str, str]], records: list[TaskRecord]) -> list[str]:
    by_job = {r.job_id: r.owner for r in records}
    return [by_job[job_id] for job_id, _ in released]


async def test_release_alternates_between_principals_oldest_first_and_marks_published(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    alice = await backlog(api, ALICE, 10)
    bob = await backlog(api, BOB, 2)  # created after all of alice's

    released = store.release_jobs(QUEUE, 4, 0)

    assert [job for job, _ in released] == [alice[0].job_id, bob[0].job_id, alice[1].job_id, bob[1].job_id]
    assert all(queue == QUEUE for _, queue in released)
    for record in (alice[0], bob[0], alice[1], bob[1]):
        assert raw_row(db, record.task_id)["dispatched_at"] is not None
    assert raw_row(db, alice[2].task_id)["dispatched_at"] is None


async def test_release_keeps_at_most_ahead_jobs_queued_and_refills_as_workers_start_them(
    api: ApiStore, store: WorkerStore
) -> None:
    alice = await backlog(api, ALICE, 20)
    first = store.release_jobs(QUEUE, 3, 0)
    assert len(first) == 3
    assert store.release_jobs(QUEUE, 3, 0) == []  # three wait in the broker: none more
    for job_id, _ in first[:2]:
        assert store.claim(job_id, "host:1:aaaa", LEASE_S) is not None
    assert [job for job, _ in store.release_jobs(QUEUE, 3, 0)] == [alice[3].job_id, alice[4].job_id]
    # Other queues have their own room.
    gpu = await backlog(api, ALICE, 1, queue="gpu")
    assert store.release_jobs("gpu", 3, 0) == [(gpu[0].job_id, "gpu")]


async def test_a_late_principal_goes_next_however_long_the_other_backlog(
    api: ApiStore, store: WorkerStore
) -> None:
    # Alice fills the pool (two running, two queued) and has hundreds more waiting; bob's one
    # job is the next to leave once a worker starts one of alice's queued jobs.
    alice = await backlog(api, ALICE, 300)
    released = store.release_jobs(QUEUE, 2, 0)
    for job_id, _ in released:
        assert store.claim(job_id, "host:1:aaaa", LEASE_S) is not None
    queued = store.release_jobs(QUEUE, 2, 0)
    assert len(queued) == 2
    bob = await backlog(api, BOB, 1)
    assert store.release_jobs(QUEUE, 2, 0) == []  # the broker holds two of alice's: full
    assert store.claim(queued[0][0], "host:1:bbbb", LEASE_S) is not None

    assert store.release_jobs(QUEUE, 2, 0) == [(bob[0].job_id, QUEUE)]
    # Then alice again (bob has nothing left), and carol before alice once she shows up.
    carol = await backlog(api, CAROL, 2)
    assert store.claim(queued[1][0], "host:1:cccc", LEASE_S) is not None
    assert owners_of(store.release_jobs(QUEUE, 2, 0), [*alice, *carol]) == [CAROL]


async def test_cancelled_and_finished_jobs_free_their_place_and_are_never_released(
    api: ApiStore, store: WorkerStore
) -> None:
    alice = await backlog(api, ALICE, 3)
    await api.request_cancel(alice[0].task_id, ALICE)
    released = store.release_jobs(QUEUE, 1, 0)
    assert released == [(alice[1].job_id, QUEUE)]
    await api.request_cancel(alice[1].task_id, ALICE)  # cancelled while queued: room again
    assert store.release_jobs(QUEUE, 1, 0) == [(alice[2].job_id, QUEUE)]


async def test_a_principal_with_max_waiting_inputs_gets_nothing_more_until_one_is_answered(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    asking = await backlog(api, ALICE, 1)
    alice = await backlog(api, ALICE, 5)
    bob = await backlog(api, BOB, 5)
    assert store.release_jobs(QUEUE, 1, 1) == [(asking[0].job_id, QUEUE)]
    assert store.claim(asking[0].job_id, "host:1:aaaa", LEASE_S) is not None
    assert store.open_inputs(asking[0].task_id, "host:1:aaaa", "inbox", [
        {"key": "k", "method": "elicitation/create", "params": {}, "params_hash": "h"}
    ])  # fmt: skip

    # Alice waits on one question (the limit): only bob's jobs leave, however many are free.
    released = store.release_jobs(QUEUE, 4, 1)
    assert owners_of(released, [*alice, *bob]) == [BOB] * 4
    # An admin override raises alice's limit: her jobs are eligible again.
    store.set_principal_limits(ALICE, max_waiting_inputs=2)
    for job_id, _ in released:
        assert store.claim(job_id, "host:1:bbbb", LEASE_S) is not None
    # Fewest jobs in flight first: alice (one) before bob (four).
    assert owners_of(store.release_jobs(QUEUE, 2, 1), [*alice, *bob]) == [ALICE, ALICE]
    # The answer (input_required -> working) lifts the default limit too.
    store.clear_principal_limits(ALICE)
    db.execute("UPDATE mcp_tasks SET status = 'working' WHERE task_id = %s", (asking[0].task_id,))
    assert len(store.release_jobs(QUEUE, 4, 1)) == 2  # two were still queued: two more free


async def test_undispatch_puts_a_released_job_back_in_its_place(api: ApiStore, store: WorkerStore) -> None:
    alice = await backlog(api, ALICE, 3)
    released = store.release_jobs(QUEUE, 2, 0)
    assert store.undispatch([job for job, _ in released]) == 2
    assert store.release_jobs(QUEUE, 1, 0) == [(alice[0].job_id, QUEUE)]


async def test_queue_position_estimates_the_jobs_ahead_round_robin(api: ApiStore, store: WorkerStore) -> None:
    alice = await backlog(api, ALICE, 6)
    bob = await backlog(api, BOB, 2)
    carol = await backlog(api, CAROL, 10)
    store.release_jobs(QUEUE, 3, 0)  # alice[0], bob[0], carol[0] wait in the broker
    # alice[4]: alice's 1-3 ahead, then per other principal up to as many plus one (bob 1,
    # carol 4), plus the three queued.
    assert await api.queue_position(alice[4].task_id) == (3 + 1 + 4 + 3, False)
    assert await api.queue_position(bob[1].task_id) == (0 + 1 + 1 + 3, False)
    assert await api.queue_position(alice[0].task_id) is None  # already published
    assert await api.queue_position(carol[9].task_id, cap=5) == (5 + 5 + 1 + 3, True)


ITEM: InputItem = {"key": "k", "method": "elicitation/create", "params": {}, "params_hash": "h"}


async def test_an_input_request_over_the_principal_s_waiting_limit_is_a_tool_error(
    api: ApiStore, store_settings: Settings
) -> None:
    # Jobs released before the first question was asked may ask too: the ask itself is refused
    # past the limit (the call ends isError), so they cannot hold every slot of the queue.
    store = WorkerStore(store_settings.model_copy(update={"max_waiting_inputs_per_principal": 1}))
    try:
        first, second = await backlog(api, ALICE, 2)
        (other_queue,) = await backlog(api, ALICE, 1, queue="gpu")
        (bobs,) = await backlog(api, BOB, 1)
        for record in (first, second, other_queue, bobs):
            store.release_jobs(record.queue, 4, 0)
            assert store.claim(record.job_id, "host:1:aaaa", LEASE_S) is not None
        assert store.open_inputs(first.task_id, "host:1:aaaa", "inbox", [ITEM])
        # Asking again while it already waits (a re-run) is not counted against itself.
        assert store.open_inputs(first.task_id, "host:1:aaaa", "inbox", [ITEM])

        with pytest.raises(TooManyWaiting, match=r"at most 1\b"):
            store.open_inputs(second.task_id, "host:1:aaaa", "inbox", [ITEM])
        waiting = await api.get_task(second.task_id, ALICE)
        assert waiting is not None and waiting.status == "working"
        # Other queues and other principals have their own count.
        assert store.open_inputs(other_queue.task_id, "host:1:aaaa", "inbox", [ITEM])
        assert store.open_inputs(bobs.task_id, "host:1:aaaa", "inbox", [ITEM])
        # An admin override lets alice have two.
        store.set_principal_limits(ALICE, max_waiting_inputs=2)
        assert store.open_inputs(second.task_id, "host:1:aaaa", "inbox", [ITEM])
    finally:
        store.close()


async def test_a_release_whose_batch_fails_goes_back_to_the_backlog_whole(
    api: ApiStore, store: WorkerStore, store_settings: Settings
) -> None:
    alice = await backlog(api, ALICE, 3)
    buffered: list[str] = []

    @contextlib.contextmanager
    def refused_at_flush() -> Iterator[None]:
        yield
        raise ConnectionError("the pipeline did not go through")

    with pytest.raises(BrokerUnavailable):
        release_and_publish(
            store,
            store_settings,
            lambda job, _q, _h: buffered.append(job),
            queues={QUEUE: 3},
            batch=refused_at_flush,
        )
    assert buffered == [r.job_id for r in alice]
    # Every job of the release is back in its place (a message that did reach the broker is a
    # duplicate the claim turns away).
    assert store.release_jobs(QUEUE, 3, 0) == [(r.job_id, QUEUE) for r in alice]


async def test_the_api_publishes_a_release_to_redis_in_one_batch(
    api: ApiStore, store_settings: Settings
) -> None:
    queue = f"mcpt.fair.{uuid.uuid4().hex[:8]}"
    settings = store_settings.model_copy(update={"broker_url": support.REDIS_URL, "dispatch_ahead": 3})
    records = await backlog(api, ALICE, 5, queue=queue)
    publisher = FairPublisher(
        create_app(settings),
        settings,
        Publisher(
            create_app(settings), on_published=lambda _ids: None, deadline_s=5, breaker=CircuitBreaker(3, 1)
        ),
    )
    broker = redis.Redis.from_url(support.REDIS_URL)
    try:
        published, waiting = release_and_publish(
            publisher._store, settings, publisher._publish, queues={queue: 5}, batch=publisher._batch
        )
        assert (published, waiting) == (3, True)
        ids = [json.loads(m)["headers"]["id"] for m in reversed(broker.lrange(queue, 0, -1))]
        assert ids == [r.job_id for r in records[:3]]  # in line order
    finally:
        broker.delete(queue)
        broker.close()
        publisher._store.close()
