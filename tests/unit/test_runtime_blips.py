"""Blips under a running job: the runtime rides out database and broker failures (reports, input
waits, the inbox), tool code never sees them, a stop signal waits for our own store call, and the
lease thread keeps what it could not write and retries a failed renewal within a second."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis.exceptions

from mcp_celery_tasks.errors import BrokerUnreachable, InfrastructureError, WorkerStopping
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore, answer_everything
from mcp_celery_tasks.transient import LEASE_RENEWAL, Backoff, OutageTooLong
from mcp_celery_tasks.worker.leases import LeaseKeeper
from mcp_celery_tasks.worker.runtime import Runtime
from tests.support import wait_until
from tests.unit.test_runtime import ACCEPT, ME, claimed_row, question, runtime_for


def test_a_report_during_a_database_blip_lands_and_the_tool_never_sees_it() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, outage_backoff=Backoff(0.01, 5.0))
    store.fail("report", 2)
    runtime.report("step 1")  # no exception: retried inside the runtime
    assert row.status_message == "step 1" and store.calls.count("report") == 3


def test_every_read_and_write_of_an_input_wait_rides_out_a_blip() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(
        store, row, MemoryInbox(answer_everything(store, ACCEPT)), outage_backoff=Backoff(0.01, 5.0)
    )
    for method in ("all_inputs", "open_inputs", "input_state"):
        store.fail(method, 1)
    answers = runtime.ask({"q": question("Sure?")}, timeout_s=30)
    assert answers == {"q": ACCEPT}
    assert [store.calls.count(m) for m in ("all_inputs", "open_inputs")] == [2, 2]


class DeadBroker(MemoryInbox):
    """An inbox whose broker is down: declare and wait raise what ``channel.Inbox`` raises (the
    redis-py error wrapped; tests/unit/test_broker.py checks the real one)."""

    def declare(self) -> None:
        self.declared += 1
        cause = redis.exceptions.ConnectionError("Error 111 connecting to redis. Connection refused.")
        raise BrokerUnreachable("the broker failed (declaring)") from cause

    def wait(self, job_id: str, timeout_s: float, task_id: str = "") -> bool:
        self.waits += 1
        cause = redis.exceptions.ConnectionError("Connection closed by server.")
        raise BrokerUnreachable("the broker failed (waiting)") from cause


def test_an_unreachable_broker_turns_an_input_wait_into_polling_the_row() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    inbox = DeadBroker()
    runtime = runtime_for(store, row, inbox, inbox_down_poll_s=0.05)

    def client() -> None:
        wait_until(lambda: store.outstanding(row.task_id), 15, 0.01, what="the question")
        for key in store.outstanding(row.task_id):
            store.answer(row.task_id, key, ACCEPT)

    answering = threading.Thread(target=client)
    answering.start()
    started = time.monotonic()
    answers = runtime.ask({"q": question("Sure?")}, timeout_s=30)
    answering.join()
    assert answers == {"q": ACCEPT}
    assert inbox.declared == 1 and inbox.waits >= 1
    assert time.monotonic() - started < 15  # polled every 0.05 s, not stuck until the timeout


def test_an_outage_past_the_budget_ends_in_outage_too_long() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, outage_budget_s=0.2, outage_backoff=Backoff(0.02, 5.0))
    store.fail("report", 1000)
    started = time.monotonic()
    with pytest.raises(OutageTooLong):
        runtime.report("step 1")
    assert 0.2 <= time.monotonic() - started < 3


def test_a_message_the_lease_thread_could_not_write_stays_pending() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, report_interval_s=60.0)
    runtime.report("first")
    runtime.report("latest")
    runtime._last_write = 0.0  # due now
    store.fail("report", 1)
    with pytest.raises(InfrastructureError):
        runtime.flush_if_due()  # the lease thread: one try, no waiting
    assert row.status_message == "first"
    runtime.flush()
    assert row.status_message == "latest"


class StopsDuringReport(MemoryStore):
    """A store whose ``report`` is interrupted by the stop signal (SIGTERM mid-statement)."""

    runtime: Runtime | None = None

    def report(
        self,
        task_id: str,
        worker: str,
        message: str,
        progress: float | None = None,
        total: float | None = None,
    ) -> bool:
        assert self.runtime is not None
        self.runtime.stop_signalled()  # must not raise inside our own store call
        return super().report(task_id, worker, message, progress, total)


def test_a_stop_signal_waits_for_our_own_store_call_then_raises() -> None:
    store = StopsDuringReport()
    row = claimed_row(store)
    runtime = store.runtime = runtime_for(store, row)
    with pytest.raises(WorkerStopping):
        runtime.report("step 1")
    assert row.status_message == "step 1"  # the write completed first


def test_a_stop_signal_in_tool_code_raises_at_once() -> None:
    store = MemoryStore()
    runtime = runtime_for(store, claimed_row(store))
    with pytest.raises(WorkerStopping):
        runtime.stop_signalled()
    assert runtime.stopping
    with pytest.raises(WorkerStopping):
        _ = runtime.cancelled  # every later checkpoint says so too


def test_the_lease_thread_retries_a_failed_renewal_within_a_second() -> None:
    assert LEASE_RENEWAL.pause(1) <= 1.0  # the default; the keeper here retries faster
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row)
    keeper = LeaseKeeper(
        lease_s=30.0, tick_s=0.02, retry=Backoff(0.1, 0.1)
    )  # renews every 10 s when all is well
    keeper.watch(runtime)
    try:
        store.fail("renew_lease", 1)
        keeper._jobs[row.task_id].renewed = 0.0  # a renewal is due now; it fails
        wait_until(lambda: store.calls.count("renew_lease") >= 2, 3, 0.05, what="a fast retry")
        before = row.lease_until
        assert before is not None and before > time.monotonic() + 25  # renewed by the retry
    finally:
        keeper.release(runtime)


def _answers(store: MemoryStore, task_id: str) -> dict[str, Any]:
    return {key: rec.response for key, rec in store.rows[task_id].inputs.items()}


def test_stop_signal_during_an_input_wait_leaves_the_question_outstanding() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime: Runtime | None = None

    def on_wait(task_id: str) -> None:
        assert runtime is not None
        runtime.stop_signalled()  # SIGTERM while blocked on the inbox

    runtime = runtime_for(store, row, MemoryInbox(on_wait))
    with pytest.raises(WorkerStopping):
        runtime.ask({"q": question("Sure?")}, timeout_s=30)
    assert store.outstanding(row.task_id) == ["q"] and _answers(store, row.task_id) == {"q": None}
    assert row.worker == ME and row.status == "input_required"


def test_once_the_tool_is_done_a_stop_no_longer_interrupts_the_outcome_write() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, report_interval_s=60.0)
    runtime.report("first")
    runtime.report("last words")
    runtime._stopping = True  # signalled while the tool was swallowing every exception
    runtime.tool_done()
    runtime.flush()  # the runner's flush before the outcome: no WorkerStopping
    assert row.status_message == "last words"
