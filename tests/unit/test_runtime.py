"""The runtime under a job's context: report coalescing, the lost flag, input keys, the lease
thread. Against the in-memory store double: no Postgres, no broker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mcp_celery_tasks import TaskCancelled
from mcp_celery_tasks.errors import InputTimedOut, JobSuspended
from mcp_celery_tasks.store.records import InputRecord
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore, Row
from mcp_celery_tasks.tools.inputs import ELICIT, elicit_params, params_hash
from mcp_celery_tasks.transient import Backoff
from mcp_celery_tasks.worker.leases import LeaseKeeper
from mcp_celery_tasks.worker.limits import JobLimits
from mcp_celery_tasks.worker.runtime import Runtime
from tests.support import wait_until

ME = "host:1:me"
ACCEPT = {"action": "accept", "content": {"confirm": True}}


def claimed_row(store: MemoryStore, **columns: Any) -> Row:
    row = store.add("some_tool", **columns)
    assert store.claim(row.job_id, ME, 30.0) is not None
    return row


def runtime_for(store: MemoryStore, row: Row, inbox: MemoryInbox | None = None, **options: Any) -> Runtime:
    box = inbox or MemoryInbox()
    return Runtime(
        store,
        task_id=row.task_id,
        job_id=row.job_id,
        tool_name=row.tool_name,
        worker=ME,
        inbox=lambda: box,
        **options,
    )


def question(message: str) -> tuple[str, dict[str, Any], str]:
    params = elicit_params(message, {"type": "object"})
    return ELICIT, params, params_hash(ELICIT, params)


def recorded(key: str, message: str, response: dict[str, Any] | None = None, **flags: bool) -> InputRecord:
    method, params, digest = question(message)
    return InputRecord(key, method, params, digest, response, flags.get("superseded", False))


# ---- status reports -----------------------------------------------------------------------------


def test_reports_are_coalesced_and_the_latest_lands() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, report_interval_s=60.0)
    runtime.report("step 1")
    runtime.report("step 2")
    runtime.report("step 3")
    assert store.calls.count("report") == 1 and row.status_message == "step 1"
    runtime.flush_if_due()  # not due within the interval
    assert row.status_message == "step 1"
    runtime.flush()
    assert store.calls.count("report") == 2 and row.status_message == "step 3"
    runtime.flush()  # nothing pending: no write
    assert store.calls.count("report") == 2


def test_a_pending_report_is_flushed_once_the_interval_passed() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, report_interval_s=0.05)
    runtime.report("first")
    runtime.report("latest")

    def flushed() -> bool:
        runtime.flush_if_due()
        return row.status_message == "latest"

    wait_until(flushed, 2, 0.01, what="a flush")


def test_a_report_is_cut_to_the_status_message_limit() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime_for(store, row, max_status_chars=5).report("0123456789")
    assert row.status_message == "01234"


def test_a_refused_report_marks_the_runtime_lost() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row)
    store.cancel(row.task_id)
    runtime.report("still going")
    assert runtime.lost and runtime.cancelled


# ---- the lost flag and cancel checks -------------------------------------------------------------


def test_cancel_checks_read_the_row_at_most_once_per_interval() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, check_interval_s=60.0)
    assert [runtime.cancelled for _ in range(5)] == [False] * 5
    assert store.calls.count("still_mine") == 1
    store.cancel(row.task_id)
    assert not runtime.cancelled  # cached until the interval passes


def test_a_cancel_is_noticed_at_the_next_check() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, check_interval_s=0.0)
    assert not runtime.cancelled
    store.cancel(row.task_id)
    assert runtime.cancelled and runtime.lost


def test_an_unreadable_row_is_not_a_cancel() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, check_interval_s=0.0)
    store.fail("still_mine")
    assert not runtime.cancelled and not runtime.lost


def test_a_refused_lease_renewal_marks_the_runtime_lost() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row)
    runtime.renew_lease(30.0)
    assert not runtime.lost
    row.worker = "host:2:someone-else"  # the lease ran out and another worker claimed the job
    runtime.renew_lease(30.0)
    assert runtime.lost


# ---- input keys ------------------------------------------------------------------------------------


def test_an_ask_opens_the_rows_and_returns_the_answers() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    inbox = MemoryInbox(lambda task_id: store.answer(task_id, "q", ACCEPT))
    answers = runtime_for(store, row, inbox).ask({"q": question("Sure?")}, 5.0)
    assert answers == {"q": ACCEPT}
    assert inbox.declared == 1 and row.inbox == inbox.name
    assert row.status == "working" and store.outstanding(row.task_id) == []


def test_a_recorded_answer_is_replayed_without_asking_again() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    row.inputs["q"] = recorded("q", "Sure?", ACCEPT)
    inbox = MemoryInbox()
    assert runtime_for(store, row, inbox).ask({"q": question("Sure?")}, 5.0) == {"q": ACCEPT}
    assert inbox.declared == 0 and "open_inputs" not in store.calls


def test_a_rerun_waits_on_its_earlier_outstanding_request_under_the_same_key() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    row.inputs["q"] = recorded("q", "Sure?")
    inbox = MemoryInbox(lambda task_id: store.answer(task_id, "q", ACCEPT))
    assert runtime_for(store, row, inbox).ask({"q": question("Sure?")}, 5.0) == {"q": ACCEPT}
    assert sorted(row.inputs) == ["q"]


def test_an_automatic_key_whose_question_changed_supersedes_the_old_request() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    old = recorded("", "Attempt 1?")
    old_key = f"1-{old.params_hash}"
    row.inputs[old_key] = recorded(old_key, "Attempt 1?")
    new = question("Attempt 2?")
    new_key = f"1-{new[2]}"
    inbox = MemoryInbox(lambda task_id: store.answer(task_id, new_key, ACCEPT))
    assert runtime_for(store, row, inbox).ask({new_key: new}, 5.0) == {new_key: ACCEPT}
    assert row.inputs[old_key].superseded and row.inputs[old_key].response is None


def test_an_explicit_key_that_named_another_request_is_asked_anew_with_a_suffix() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    row.inputs["name"] = recorded("name", "Attempt 1?", ACCEPT)
    row.inputs["name~2"] = recorded("name~2", "Attempt 2?")
    inbox = MemoryInbox(lambda task_id: store.answer(task_id, "name~3", ACCEPT))
    answers = runtime_for(store, row, inbox).ask({"name": question("Attempt 3?")}, 5.0)
    assert answers == {"name": ACCEPT}  # the author's key, whatever the row's key is
    assert row.inputs["name~3"].params_hash == question("Attempt 3?")[2]
    assert row.inputs["name~2"].superseded and not row.inputs["name"].superseded  # answered stays


def test_a_cancel_during_the_wait_raises_task_cancelled_and_marks_lost() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, MemoryInbox(store.cancel))
    with pytest.raises(TaskCancelled):
        runtime.ask({"q": question("Sure?")}, 5.0)
    assert runtime.lost


def test_an_ask_on_a_task_that_is_no_longer_ours_raises_task_cancelled() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    store.cancel(row.task_id)
    runtime = runtime_for(store, row)
    with pytest.raises(TaskCancelled):
        runtime.ask({"q": question("Sure?")}, 5.0)
    assert runtime.lost and "q" not in row.inputs


def test_an_unanswered_ask_times_out_and_its_keys_are_superseded() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    with pytest.raises(InputTimedOut):
        runtime_for(store, row).ask({"q": question("Sure?")}, 0.05)
    assert row.inputs["q"].superseded and row.status == "working"


# ---- suspend ------------------------------------------------------------------------------------


def limits(suspend_after_s: float | None) -> JobLimits:
    return JobLimits(None, None, None, 60.0, 60.0, 5.0, suspend_after_s)


def test_a_wait_past_suspend_after_gives_the_slot_back() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, limits=limits(0.05))
    with pytest.raises(JobSuspended):
        runtime.ask({"q": question("Sure?")}, 5.0)
    assert runtime.suspended and runtime.lost
    assert (row.worker, row.suspended_at is not None, row.attempts, row.status) == (
        None,
        True,
        0,
        "input_required",
    )


def test_a_wait_suspends_at_once_when_the_queue_needs_the_slot() -> None:
    store = MemoryStore()
    store.demand = True
    row = claimed_row(store)
    started = time.monotonic()
    with pytest.raises(JobSuspended):
        runtime_for(store, row, limits=limits(600.0)).ask({"q": question("Sure?")}, 5.0)
    assert time.monotonic() - started < 1.0


def test_an_answer_before_suspend_after_keeps_the_job_resident() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    inbox = MemoryInbox(lambda task_id: store.answer(task_id, "q", ACCEPT))
    assert runtime_for(store, row, inbox, limits=limits(600.0)).ask({"q": question("Sure?")}, 5.0) == {
        "q": ACCEPT
    }
    assert row.suspended_at is None and row.worker == ME


def test_a_job_that_stays_resident_never_suspends() -> None:
    store = MemoryStore()
    store.demand = True
    row = claimed_row(store)
    with pytest.raises(InputTimedOut):
        runtime_for(store, row, limits=limits(None)).ask({"q": question("Sure?")}, 0.2)
    assert "suspend" not in store.calls and "suspend_now" not in store.calls


def test_a_refused_suspend_waits_on_without_spinning() -> None:
    """The principal has its most suspended tasks: the job stays resident and keeps waiting, asking
    again at each re-read (every few seconds), not in a tight loop."""
    store = MemoryStore(max_suspended=1)
    other = store.add("other")
    other.suspended_at = 0.0
    row = claimed_row(store)
    with pytest.raises(InputTimedOut):
        runtime_for(store, row, limits=limits(0.0)).ask({"q": question("Sure?")}, 0.5)
    assert store.calls.count("suspend") == 1 and row.worker == ME


# ---- the lease thread ----------------------------------------------------------------------------


def test_the_lease_thread_renews_and_flushes_until_released() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row, report_interval_s=0.05)
    keeper = LeaseKeeper(lease_s=0.3, tick_s=0.02, retry=Backoff(0.05, 0.05))
    first_lease = row.lease_until
    assert first_lease is not None
    runtime.report("one")
    runtime.report("two")  # pending: only the lease thread can write it
    keeper.watch(runtime)
    try:
        wait_until(lambda: row.status_message == "two", 5, 0.02, what="the lease thread's flush")
        wait_until(lambda: store.calls.count("renew_lease") >= 2, 5, 0.02, what="two renewals")
        assert row.lease_until is not None and row.lease_until != first_lease
    finally:
        keeper.release(runtime)


def test_the_lease_thread_marks_a_runtime_lost_when_its_renewal_is_refused() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row)
    keeper = LeaseKeeper(lease_s=0.3, tick_s=0.02, retry=Backoff(0.05, 0.05))
    keeper.watch(runtime)
    try:
        store.cancel(row.task_id)
        wait_until(lambda: runtime.lost, 5, 0.02, what="the refused renewal")
    finally:
        keeper.release(runtime)


def test_the_lease_thread_survives_a_database_outage() -> None:
    store = MemoryStore()
    row = claimed_row(store)
    runtime = runtime_for(store, row)
    keeper = LeaseKeeper(lease_s=0.3, tick_s=0.02, retry=Backoff(0.05, 0.05))
    store.fail("renew_lease", times=2)
    keeper.watch(runtime)
    try:
        wait_until(lambda: store.calls.count("renew_lease") >= 3, 5, 0.02, what="renewals after the outage")
        assert not runtime.lost
    finally:
        keeper.release(runtime)
