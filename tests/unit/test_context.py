"""TaskContext, the tool authors' API, over a runtime on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_celery_tasks import InputNotSupported, TaskCancelled, TaskContext
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore, Row, answer_everything
from mcp_celery_tasks.tools.inputs import ELICIT, elicit_params, params_hash
from mcp_celery_tasks.worker.runtime import Runtime

ME = "host:1:me"
ACCEPT = {"action": "accept", "content": {"confirm": True}}
SCHEMA = {"type": "object", "properties": {"confirm": {"type": "boolean"}}}


def context_for(
    store: MemoryStore, inbox: MemoryInbox | None = None, **options: Any
) -> tuple[TaskContext, Row]:
    row = store.add("some_tool")
    store.claim(row.job_id, ME, 30.0)
    box = inbox or MemoryInbox()
    runtime = Runtime(
        store,
        task_id=row.task_id,
        job_id=row.job_id,
        tool_name=row.tool_name,
        worker=ME,
        inbox=lambda: box,
        check_interval_s=0.0,
    )
    ctx = TaskContext(
        task_id=row.task_id,
        job_id=row.job_id,
        tool_name=row.tool_name,
        attempt=1,
        preflight={"name": {"action": "accept"}},
        runtime=runtime,
        client_capabilities={"elicitation": {}},
        sleep_slice_s=0.01,
        **options,
    )
    return ctx, row


def test_report_and_cancelled_go_through_the_runtime() -> None:
    store = MemoryStore()
    ctx, row = context_for(store)
    ctx.report("halfway")
    assert row.status_message == "halfway"
    assert not ctx.cancelled
    store.cancel(row.task_id)
    assert ctx.cancelled
    with pytest.raises(TaskCancelled):
        ctx.raise_if_cancelled()


def test_sleep_wakes_early_with_task_cancelled() -> None:
    store = MemoryStore()
    ctx, row = context_for(store)
    store.cancel(row.task_id)
    with pytest.raises(TaskCancelled):
        ctx.sleep(60)


def test_an_automatic_key_is_the_ordinal_and_the_request_hash() -> None:
    store = MemoryStore()
    ctx, row = context_for(store, MemoryInbox(answer_everything(store, ACCEPT)))
    assert ctx.elicit("Sure?", SCHEMA).action == "accept"
    digest = params_hash(ELICIT, elicit_params("Sure?", SCHEMA))
    assert list(row.inputs) == [f"1-{digest}"]


def test_an_explicit_key_reused_for_another_request_raises() -> None:
    store = MemoryStore()
    ctx, _ = context_for(store, MemoryInbox(answer_everything(store, ACCEPT)))
    ctx.elicit("A?", SCHEMA, key="same")
    with pytest.raises(ValueError, match="already used"):
        ctx.elicit("B?", {"type": "object"}, key="same")


def test_an_input_kind_the_client_did_not_declare_is_refused() -> None:
    ctx, row = context_for(MemoryStore())
    with pytest.raises(InputNotSupported):
        ctx.list_roots()
    assert row.inputs == {}


def test_the_context_exposes_the_jobs_identity_and_preflight() -> None:
    ctx, row = context_for(MemoryStore())
    assert (ctx.task_id, ctx.job_id, ctx.tool_name, ctx.attempt) == (row.task_id, row.job_id, "some_tool", 1)
    assert ctx.preflight == {"name": {"action": "accept"}}


# ---- progress, logs and answers offered up front (issue 16) -----------------------------------


def test_report_carries_progress_and_total_and_keeps_them_when_a_report_has_none() -> None:
    store = MemoryStore()
    ctx, row = context_for(store)
    ctx.report("step 1", progress=1, total=4)
    ctx.flush()
    assert (row.status_message, row.progress, row.progress_total) == ("step 1", 1, 4)
    ctx.report("thinking")
    ctx.flush()
    assert (row.status_message, row.progress, row.progress_total) == ("thinking", 1, 4)


def test_log_reaches_the_caller_only_at_or_above_the_level_it_asked_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    ctx, row = context_for(store, log_level="warning")
    with caplog.at_level("DEBUG", logger="mcp_celery_tasks.tool"):
        ctx.log("info", "routine")
        ctx.log("error", "broken", {"disk": "full"})
    assert row.logs == [("error", "some_tool", {"message": "broken", "data": {"disk": "full"}})]
    assert [r.getMessage() for r in caplog.records] == ["routine", "broken"]  # the worker log has both
    with pytest.raises(ValueError, match="unknown log level"):
        ctx.log("loud", "no")


def test_log_without_a_level_stays_in_the_worker_log() -> None:
    store = MemoryStore()
    ctx, row = context_for(store)
    ctx.log("emergency", "everything is on fire")
    assert row.logs == [] and "log" not in store.calls


def test_an_answer_offered_up_front_is_used_when_it_fits_the_question() -> None:
    store = MemoryStore()
    offered = {"confirm": ACCEPT, "unrelated": ACCEPT}
    ctx, row = context_for(store)
    ctx._given = dict(offered)  # what the runner's preflight carries under GIVEN_KEY
    assert ctx.elicit("Sure?", SCHEMA, key="confirm").action == "accept"
    assert row.inputs == {}  # nothing was asked


def test_an_offered_answer_that_does_not_fit_is_ignored_and_the_question_asked() -> None:
    store = MemoryStore()
    ctx, row = context_for(store, inbox=MemoryInbox(answer_everything(store, ACCEPT)))
    ctx._given = {"confirm": {"action": "accept", "content": {"confirm": "not a boolean"}}}
    assert ctx.elicit("Sure?", SCHEMA, key="confirm").action == "accept"
    assert list(row.inputs) == ["confirm"]


def test_log_entries_for_the_caller_are_bounded_and_json() -> None:
    store = MemoryStore()
    ctx, row = context_for(store, log_level="debug")
    ctx.log("info", "big", {"blob": "x" * 100_000})
    ctx.log("info", "odd", {"value": object()})
    (_, _, big), (_, _, odd) = row.logs
    assert isinstance(big, str) and big.startswith("big") and len(big) < 17 * 1024
    assert odd == "odd"


def test_progress_must_be_a_finite_number() -> None:
    ctx, _ = context_for(MemoryStore())
    with pytest.raises(ValueError, match="finite"):
        ctx.report("x", progress=float("nan"))
