"""The runner's result path and artifacts (``worker.spill``), on the in-memory store: a small
result is recorded as it was, with no artifact call; a large one is recorded with links and
previews, its blocks stored; one over ``max_artifact_bytes`` ends with a tool error naming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mcp_celery_tasks import tool
from mcp_celery_tasks.json_types import as_array, as_object
from mcp_celery_tasks.testing import MemoryStore
from tests.unit.test_runner import Recorder, make_runner

PREFIX = "unit_spill_"


@tool(name=PREFIX + "small")
def _small() -> str:
    return "x" * 1000


@tool(name=PREFIX + "large")
def _large() -> str:
    return "y" * 300_000


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    yield MemoryStore()


def test_a_small_result_is_recorded_as_it_was_without_any_artifact_call(store: MemoryStore) -> None:
    row = store.add(PREFIX + "small")
    assert make_runner(store, Recorder()).run(row.job_id).status == "completed"
    assert row.result == {"content": [{"type": "text", "text": "x" * 1000}], "isError": False,
                          "resultType": "complete"}  # fmt: skip
    assert "write_artifact" not in store.calls and store.durables.get(row.task_id) is None


def test_a_result_over_the_inline_limit_is_recorded_with_a_link_and_a_preview(store: MemoryStore) -> None:
    row = store.add(PREFIX + "large")
    assert make_runner(store, Recorder(), inline_result_bytes=64_000).run(row.job_id).status == "completed"
    assert row.result is not None and row.result["isError"] is False
    link, preview = (as_object(block) for block in as_array(row.result["content"]))
    assert link["type"] == "resource_link" and link["size"] == 300_000
    assert str(preview["text"]).startswith("[preview of result-0.txt (300000 bytes)")
    ((name, mime, data),) = store.durables[row.task_id].artifacts.values()
    assert (name, mime, data) == ("result-0.txt", "text/plain; charset=utf-8", b"y" * 300_000)


def test_a_large_result_over_the_artifact_cap_ends_with_a_tool_error_naming_it(store: MemoryStore) -> None:
    row = store.add(PREFIX + "large")
    runner = make_runner(store, Recorder(), inline_result_bytes=64_000, max_artifact_bytes=100_000)
    assert runner.run(row.job_id).status == "completed"
    assert row.result is not None and row.result["isError"] is True
    said = str(as_object(as_array(row.result["content"])[0])["text"])
    assert "max_artifact_bytes" in said and "100000 bytes per artifact" in said
    kept = store.durables.get(row.task_id)
    assert kept is None or not kept.artifacts
