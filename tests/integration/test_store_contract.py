"""One contract, two stores: the SQL ``WorkerStore`` on a migrated Postgres and the shipped
``MemoryStore`` (``mcp_celery_tasks.testing``) pass the same tests of what the job runner and a
running job's runtime rely on.

Each side plays the API's part its own way: on Postgres through ``ApiStore`` (create, cancel,
answer) and raw SQL only to move a lease's clock; in memory through the store's test helpers.
The assertions read the worker store's own answers, or the row through ``Side.row``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from typing import Any, Protocol

import psycopg
import pytest
from psycopg.rows import dict_row

from mcp_celery_tasks import TaskContext, tool
from mcp_celery_tasks.errors import CheckpointTooLarge
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, TaskError, WorkerStore
from mcp_celery_tasks.store.records import InputItem
from mcp_celery_tasks.store.step_queries import CheckpointRecord
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore
from mcp_celery_tasks.tools.inputs import ELICIT, elicit_params, params_hash
from mcp_celery_tasks.worker.runner import JobRunner, JobStore
from tests.integration.test_store import OWNER, new_task

ME = "host-a:101:aaaa1111"
RIVAL = "host-b:202:bbbb2222"
LEASE_S = 30.0
INBOX = "mcp.inbox.host-a.101"
ACCEPT = {"action": "accept", "content": {"ok": True}}


class Side(Protocol):
    """One store under the contract, and the API's part played against it."""

    @property
    def store(self) -> JobStore: ...

    def add(self, max_attempts: int = 3, tool_name: str = "slow_compute") -> tuple[str, str]:
        """A new active task, as ``tools/call`` creates it: ``(task_id, job_id)``."""
        ...

    def cancel(self, task_id: str) -> None: ...

    def answer(self, task_id: str, key: str, response: dict[str, Any]) -> None: ...

    def lapse_lease(self, task_id: str) -> None:
        """The holder's lease ran out long ago (its process died)."""
        ...

    def row(self, task_id: str) -> dict[str, Any]:
        """``status``, ``status_message``, ``result``, ``error``, ``worker`` and ``suspended``."""
        ...


class PostgresSide:
    def __init__(self, settings: Settings, db: psycopg.Connection[dict[str, Any]]) -> None:
        self.store = WorkerStore(settings)
        self._settings = settings
        self._db = db

    def _api(self, call: Any) -> Any:
        async def run() -> Any:
            api = ApiStore(self._settings)
            await api.open()
            try:
                return await call(api)
            finally:
                await api.close()

        return asyncio.run(run())

    def add(self, max_attempts: int = 3, tool_name: str = "slow_compute") -> tuple[str, str]:
        task = new_task(max_attempts=max_attempts, tool_name=tool_name)
        self._api(lambda api: api.create_task(task))
        return task.task_id, task.job_id

    def cancel(self, task_id: str) -> None:
        self._api(lambda api: api.request_cancel(task_id, OWNER))

    def answer(self, task_id: str, key: str, response: dict[str, Any]) -> None:
        self._api(lambda api: api.record_answers(task_id, {key: response}))

    def lapse_lease(self, task_id: str) -> None:
        self._db.execute(
            "UPDATE mcp_tasks SET lease_until = now() - interval '1 hour' WHERE task_id = %s", (task_id,)
        )

    def row(self, task_id: str) -> dict[str, Any]:
        found = self._db.execute(
            "SELECT status, status_message, result, error, worker, suspended_at IS NOT NULL AS suspended"
            " FROM mcp_tasks WHERE task_id = %s",
            (task_id,),
        ).fetchone()
        assert found is not None
        return dict(found)


class MemorySide:
    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.store = self.memory

    def add(self, max_attempts: int = 3, tool_name: str = "slow_compute") -> tuple[str, str]:
        row = self.memory.add(tool_name, {"seconds": 1, "label": "x"}, max_attempts=max_attempts)
        return row.task_id, row.job_id

    def cancel(self, task_id: str) -> None:
        self.memory.cancel(task_id)

    def answer(self, task_id: str, key: str, response: dict[str, Any]) -> None:
        self.memory.answer(task_id, key, response)

    def lapse_lease(self, task_id: str) -> None:
        self.memory.rows[task_id].lease_until = -3600.0

    def row(self, task_id: str) -> dict[str, Any]:
        row = self.memory.rows[task_id]
        return {
            "status": row.status,
            "status_message": row.status_message,
            "result": row.result,
            "error": row.error,
            "worker": row.worker,
            "suspended": row.suspended_at is not None,
        }


@pytest.fixture(params=["postgres", "memory"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "memory":
        yield MemorySide()
        return
    settings: Settings = request.getfixturevalue("settings")
    with psycopg.connect(settings.database_url, autocommit=True, row_factory=dict_row) as db:
        postgres = PostgresSide(settings, db)
        yield postgres
        postgres.store.close()


def question(key: str, text: str = "Go on?") -> InputItem:
    params = elicit_params(text, {"type": "object", "properties": {"ok": {"type": "boolean"}}})
    return {"key": key, "method": ELICIT, "params": params, "params_hash": params_hash(ELICIT, params)}


def claimed(side: Side, max_attempts: int = 3) -> str:
    task_id, job_id = side.add(max_attempts)
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    return task_id


# ---- claim and lease ---------------------------------------------------------------------------


def test_claim_takes_an_active_job_for_one_worker_at_a_time(side: Side) -> None:
    task_id, job_id = side.add()
    job = side.store.claim(job_id, ME, LEASE_S)
    assert job is not None
    assert (job.task_id, job.job_id, job.tool_name, job.attempts) == (task_id, job_id, "slow_compute", 1)
    assert side.store.claim(job_id, RIVAL, LEASE_S) is None
    assert side.row(task_id)["worker"] == ME
    state = side.store.job_state(job_id)
    assert state is not None and state["status"] == "working" and state["lease_left_s"] > 0


def test_claim_of_an_unknown_job_is_refused(side: Side) -> None:
    assert side.store.claim("no-such-job", ME, LEASE_S) is None
    assert side.store.job_state("no-such-job") is None


def test_a_lapsed_lease_goes_to_the_next_worker_and_fences_the_first(side: Side) -> None:
    task_id, job_id = side.add()
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    side.lapse_lease(task_id)
    job = side.store.claim(job_id, RIVAL, LEASE_S)
    assert job is not None and job.attempts == 2
    assert not side.store.still_mine(task_id, ME)
    assert not side.store.renew_lease(task_id, ME, LEASE_S)
    assert not side.store.report(task_id, ME, "late")
    assert not side.store.finish(task_id, ME, "completed", result={"content": []})
    assert side.store.renew_lease(task_id, RIVAL, LEASE_S)
    assert side.row(task_id)["status"] == "working"


def test_claim_stops_at_max_attempts(side: Side) -> None:
    task_id, job_id = side.add(max_attempts=1)
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    side.lapse_lease(task_id)
    assert side.store.claim(job_id, RIVAL, LEASE_S) is None
    error: TaskError = {"code": -32603, "message": "gave up"}
    assert side.store.fail_exhausted(job_id, error, "gave up")
    assert side.row(task_id)["status"] == "failed" and side.row(task_id)["error"] == error


def test_a_given_back_job_is_claimed_again_without_counting_an_attempt(side: Side) -> None:
    task_id, job_id = side.add()
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    assert side.store.give_back(task_id, ME)
    assert not side.store.give_back(task_id, ME)
    job = side.store.claim(job_id, RIVAL, LEASE_S)
    assert job is not None and job.attempts == 1


def test_a_scheduled_retry_frees_the_job_is_fenced_and_waits_for_its_time(side: Side) -> None:
    task_id, job_id = side.add(max_attempts=3)
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    message = "retrying in 60 s (attempt 2/3): TimeoutError: slow"
    assert not side.store.schedule_retry(task_id, RIVAL, 60, message, "retryable_error", "slow")
    assert side.store.schedule_retry(task_id, ME, 60, message, "retryable_error", "slow")
    row = side.row(task_id)
    assert row["status"] == "working" and row["worker"] is None and row["status_message"] == message
    assert not side.store.schedule_retry(task_id, ME, 60, message, "retryable_error", "slow")  # not ours
    assert side.store.claim(job_id, RIVAL, LEASE_S) is None  # not before its time


def test_no_retry_is_scheduled_on_the_last_attempt_or_after_a_cancel(side: Side) -> None:
    task_id, job_id = side.add(max_attempts=1)
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    assert not side.store.schedule_retry(task_id, ME, 1, "m", "k", "d")
    task_id, job_id = side.add(max_attempts=3)
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    side.cancel(task_id)
    assert not side.store.schedule_retry(task_id, ME, 1, "m", "k", "d")
    assert side.row(task_id)["status"] == "cancelled"


# ---- while running ------------------------------------------------------------------------------


def test_report_sets_the_status_message_for_the_holder_only(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.report(task_id, ME, "1/3 done", 1, 3)
    assert not side.store.report(task_id, RIVAL, "not mine")
    assert side.row(task_id)["status_message"] == "1/3 done"
    assert side.store.finish(task_id, ME, "failed", error={"code": -32603, "message": "x"}, message="gave up")
    assert side.row(task_id)["status_message"] == "gave up"


def test_input_rows_open_answer_and_supersede(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.open_inputs(task_id, ME, INBOX, [question("go")])
    assert side.row(task_id)["status"] == "input_required"
    assert side.store.input_state(task_id, ME, ["go"]) == (True, {})
    (record,) = side.store.all_inputs(task_id).values()
    assert (record.key, record.method, record.response, record.superseded) == ("go", ELICIT, None, False)

    side.answer(task_id, "go", ACCEPT)
    assert side.store.input_state(task_id, ME, ["go"]) == (True, {"go": ACCEPT})
    assert side.row(task_id)["status"] == "working"

    assert side.store.open_inputs(task_id, ME, INBOX, [question("next", "Really?")])
    assert side.store.open_inputs(task_id, ME, INBOX, [question("next~2", "Sure?")], supersede=["next"])
    inputs = side.store.all_inputs(task_id)
    assert inputs["next"].superseded and not inputs["next~2"].superseded
    assert inputs["go"].response == ACCEPT and not inputs["go"].superseded


def test_an_answer_to_a_superseded_request_is_ignored(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.open_inputs(task_id, ME, INBOX, [question("old")])
    assert side.store.open_inputs(task_id, ME, INBOX, [question("new")], supersede=["old"])
    side.answer(task_id, "old", ACCEPT)
    assert side.store.input_state(task_id, ME, ["old", "new"]) == (True, {})


def test_expired_inputs_stop_being_outstanding(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.open_inputs(task_id, ME, INBOX, [question("go")])
    side.store.expire_inputs(task_id, ME, ["go"])
    assert side.store.all_inputs(task_id)["go"].superseded
    assert side.row(task_id)["status"] == "working"


# ---- the outcome --------------------------------------------------------------------------------


def test_the_outcome_is_recorded_once(side: Side) -> None:
    task_id = claimed(side)
    result: JSONObject = {"content": [{"type": "text", "text": "done"}], "isError": False}
    assert side.store.finish(task_id, ME, "completed", result=result)
    assert not side.store.finish(task_id, ME, "failed", error={"code": -32603, "message": "again"})
    assert not side.store.report(task_id, ME, "after the end")
    row = side.row(task_id)
    assert (row["status"], row["result"], row["error"]) == ("completed", result, None)
    assert not side.store.still_mine(task_id, ME)


def test_a_cancel_is_seen_by_the_running_job(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.open_inputs(task_id, ME, INBOX, [question("go")])
    side.cancel(task_id)
    assert not side.store.still_mine(task_id, ME)
    assert side.store.input_state(task_id, ME, ["go"])[0] is False
    assert not side.store.report(task_id, ME, "still going")
    assert not side.store.open_inputs(task_id, ME, INBOX, [question("more")])
    assert not side.store.finish(task_id, ME, "completed", result={"content": []})
    side.store.mark_stopped(task_id, ME)
    assert side.row(task_id)["status"] == "cancelled"


def test_a_cancelled_job_is_never_claimed(side: Side) -> None:
    task_id, job_id = side.add()
    side.cancel(task_id)
    assert side.store.claim(job_id, ME, LEASE_S) is None
    state = side.store.job_state(job_id)
    assert state is not None and state["status"] == "cancelled"


# ---- the job runner on either store -------------------------------------------------------------


@tool(name="contract_label")
def label(ctx: TaskContext, seconds: float, label: str) -> str:
    ctx.report(f"labelling {label}")
    ctx.raise_if_cancelled()
    return f"{label}: {seconds:g} s"


def test_the_job_runner_records_one_outcome_on_either_store(side: Side) -> None:
    task_id, job_id = side.add(tool_name="contract_label")
    runner = JobRunner(side.store, Settings(report_min_interval_seconds=0.0), MemoryInbox)
    assert runner.run(job_id).status == "completed"
    assert runner.run(job_id).status == "skipped"  # a duplicate delivery finds the outcome recorded
    row = side.row(task_id)
    assert row["status"] == "completed"
    assert row["status_message"] is None  # how it ended, never the last progress text
    assert row["result"] == {
        "content": [{"type": "text", "text": "x: 1 s"}],
        "isError": False,
        "resultType": "complete",
    }


def test_logs_are_kept_for_the_holder_up_to_the_cap(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.log(task_id, ME, "info", "tool", {"n": 1}, 2)
    assert not side.store.log(task_id, RIVAL, "info", "tool", {"n": 2}, 2)
    assert side.store.log(task_id, ME, "info", "tool", {"n": 2}, 2)
    assert not side.store.log(task_id, ME, "info", "tool", {"n": 3}, 2)


def test_a_cancel_leaves_no_request_outstanding(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.open_inputs(task_id, ME, INBOX, [question("go")])
    side.cancel(task_id)
    side.answer(task_id, "go", ACCEPT)
    record = side.store.all_inputs(task_id)["go"]
    assert record.response is None and record.superseded


# ---- suspend --------------------------------------------------------------------------------------


def test_a_suspended_job_frees_its_lease_and_runs_again_once_answered(side: Side) -> None:
    task_id, job_id = side.add()
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    assert side.store.open_inputs(task_id, ME, INBOX, [question("go")], may_suspend=True)
    assert side.store.suspend(task_id, ME)
    row = side.row(task_id)
    assert (row["status"], row["worker"], row["suspended"]) == ("input_required", None, True)
    assert not side.store.suspend(task_id, ME)  # not ours any more
    assert not side.store.report(task_id, ME, "late")
    assert side.store.claim(job_id, RIVAL, LEASE_S) is None  # a stray delivery runs nothing
    state = side.store.job_state(job_id)
    assert state is not None and state["attempts"] == 0  # the suspended run was no attempt

    side.answer(task_id, "go", ACCEPT)
    row = side.row(task_id)
    assert (row["status"], row["suspended"]) == ("working", False)
    job = side.store.claim(job_id, RIVAL, LEASE_S)
    assert job is not None and job.attempts == 1 and job.resumed_for_s is not None
    assert side.store.all_inputs(task_id)["go"].response == ACCEPT


def test_a_job_is_not_suspended_once_answered_or_cancelled(side: Side) -> None:
    answered = claimed(side)
    assert side.store.open_inputs(answered, ME, INBOX, [question("go")], may_suspend=True)
    side.answer(answered, "go", ACCEPT)
    assert not side.store.suspend(answered, ME)
    assert side.row(answered)["worker"] == ME  # still resident: it reads its answer
    cancelled = claimed(side)
    assert side.store.open_inputs(cancelled, ME, INBOX, [question("go")], may_suspend=True)
    side.cancel(cancelled)
    assert not side.store.suspend(cancelled, ME)


def test_a_partial_answer_keeps_the_task_suspended(side: Side) -> None:
    task_id, job_id = side.add()
    assert side.store.claim(job_id, ME, LEASE_S) is not None
    assert side.store.open_inputs(
        task_id, ME, INBOX, [question("a"), question("b", "And?")], may_suspend=True
    )
    assert side.store.suspend(task_id, ME)
    side.answer(task_id, "a", ACCEPT)
    assert side.row(task_id)["suspended"] and side.store.claim(job_id, ME, LEASE_S) is None
    side.answer(task_id, "b", ACCEPT)
    assert side.store.claim(job_id, ME, LEASE_S) is not None


@tool(name="contract_asks_at_once", suspend_after=0)
def asks_at_once(ctx: TaskContext, seconds: float, label: str) -> str:
    answer = ctx.elicit("Go on?", {"type": "object", "properties": {"ok": {"type": "boolean"}}}, key="go")
    return f"{label}: {answer.action}"


def test_the_job_runner_suspends_and_resumes_on_either_store(side: Side) -> None:
    task_id, job_id = side.add(tool_name="contract_asks_at_once")
    settings = Settings(report_min_interval_seconds=0.0, strict_input_capabilities=False)
    runner = JobRunner(side.store, settings, MemoryInbox)
    assert runner.run(job_id).status == "suspended"
    assert side.row(task_id)["suspended"] and side.row(task_id)["worker"] is None
    assert runner.run(job_id).status == "skipped"  # a stray delivery while suspended
    side.answer(task_id, "go", ACCEPT)
    assert runner.run(job_id).status == "completed"
    assert side.row(task_id)["result"]["content"][0]["text"] == "x: accept"


# ---- durable steps and checkpoints (``ctx.step``, ``ctx.checkpoint``) ------------------------------


def test_steps_are_recorded_once_by_position_and_name_for_the_holder_only(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.record_step(task_id, ME, 1, "fetch", '{"rows":3}') is True
    assert side.store.record_step(task_id, ME, 1, "other", "1") is None  # the position is taken
    assert side.store.record_step(task_id, ME, 2, "fetch", "1") is None  # so is the name
    assert side.store.record_step(task_id, RIVAL, 2, "fit", "1") is False  # not the holder
    assert side.store.record_step(task_id, ME, 2, "fit", '["a",null,"\\\\u0000"]') is True
    assert side.store.step_index(task_id) == [(1, "fetch"), (2, "fit")]
    assert side.store.step_result(task_id, 1) == {"rows": 3}
    assert side.store.step_result(task_id, 2) == ["a", None, "\\u0000"]  # a backslash, not a NUL
    with pytest.raises(LookupError):
        side.store.step_result(task_id, 3)
    side.cancel(task_id)
    assert side.store.record_step(task_id, ME, 3, "late", "1") is False
    assert side.store.step_index(task_id) == [(1, "fetch"), (2, "fit")]


def test_a_recorded_step_decodes_exactly_as_it_was_written(side: Side) -> None:
    task_id = claimed(side)
    written = '{"b":1,"a":1e+20,"nul":"\\u0000","n":1.0}'
    assert side.store.record_step(task_id, ME, 1, "exact", written) is True
    replayed = side.store.step_result(task_id, 1)
    assert replayed == {"b": 1, "a": 1e20, "nul": "\x00", "n": 1.0}
    assert list(replayed) == ["b", "a", "nul", "n"]  # keys in their order (jsonb would sort them)
    assert isinstance(replayed["a"], float) and isinstance(replayed["n"], float)  # jsonb: 1e+20 an int


def _chunks(*parts: bytes, fail: Exception | None = None) -> Iterator[bytes]:
    yield from parts
    if fail is not None:
        raise fail


def test_a_checkpoint_save_replaces_the_previous_one_whole_or_not_at_all(side: Side) -> None:
    task_id = claimed(side)
    saved = side.store.save_checkpoint(task_id, ME, "state", "g1", _chunks(b"ab", b"cd"))
    assert saved is not None
    first, previous = saved
    assert previous is None
    assert (first.size, first.chunks, first.storage, first.generation) == (4, 2, "postgres", "g1")
    assert first.sha256 == hashlib.sha256(b"abcd").hexdigest() and first.saved_at is not None
    # A save whose source fails half way (a size cap) changes nothing.
    with pytest.raises(CheckpointTooLarge):
        side.store.save_checkpoint(task_id, ME, "state", "g2", _chunks(b"xy", fail=CheckpointTooLarge("big")))
    assert side.store.checkpoint(task_id, "state") == first
    assert b"".join(side.store.checkpoint_chunks(task_id, first)) == b"abcd"
    saved = side.store.save_checkpoint(task_id, ME, "state", "g3", _chunks(b"new"))
    assert saved is not None and saved[1] is not None and saved[1].generation == "g1"
    latest = side.store.checkpoint(task_id, "state")
    assert latest is not None and latest.generation == "g3"
    assert b"".join(side.store.checkpoint_chunks(task_id, latest)) == b"new"
    with pytest.raises(LookupError):  # the previous generation's chunks went with the flip
        b"".join(side.store.checkpoint_chunks(task_id, first))
    assert side.store.checkpoint(task_id, "other") is None


def test_checkpoint_writes_are_fenced_by_the_lease(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.save_checkpoint(task_id, ME, "state", "g1", _chunks(b"kept")) is not None
    assert side.store.save_checkpoint(task_id, RIVAL, "state", "g2", _chunks(b"rival")) is None
    file = CheckpointRecord("state", "g3", "directory", 1, "00", 1, "job/state.g3.ckpt")
    assert side.store.record_checkpoint(task_id, RIVAL, file) is None
    assert side.store.delete_checkpoint(task_id, RIVAL, "state") is False
    kept = side.store.checkpoint(task_id, "state")
    assert kept is not None and b"".join(side.store.checkpoint_chunks(task_id, kept)) == b"kept"


def test_a_checkpoint_kept_as_a_file_replaces_one_kept_in_chunks_and_is_deleted(side: Side) -> None:
    task_id = claimed(side)
    assert side.store.save_checkpoint(task_id, ME, "state", "g1", _chunks(b"chunks")) is not None
    file = CheckpointRecord("state", "g2", "directory", 5, "ab", 1, "job/state.g2.ckpt")
    flipped = side.store.record_checkpoint(task_id, ME, file)
    assert flipped is not None and flipped[1] is not None and flipped[1].storage == "postgres"
    found = side.store.checkpoint(task_id, "state")
    assert found is not None and (found.storage, found.path, found.size) == (
        "directory",
        "job/state.g2.ckpt",
        5,
    )
    gone = side.store.delete_checkpoint(task_id, ME, "state")
    assert isinstance(gone, CheckpointRecord) and gone.path == "job/state.g2.ckpt"
    assert side.store.delete_checkpoint(task_id, ME, "state") is None
    assert side.store.checkpoint(task_id, "state") is None
