"""Durable steps and checkpoints on the in-memory store, through the real runner and context:
a re-run replays recorded steps and loads the last checkpoint; the order check, the size caps and
the fence each end in a clear error with nothing recorded. The SQL side is the contract suite's
(tests/integration/test_store_contract.py); a real worker killed mid-run is tests/e2e/test_steps.py.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_celery_tasks import TaskContext, tool
from mcp_celery_tasks.errors import (
    CheckpointTooLarge,
    StepOrderError,
    StepResultError,
    ToolError,
    WorkerStopping,
)
from mcp_celery_tasks.json_types import as_array, as_object
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore, Row, run_tool
from mcp_celery_tasks.tools.context import TaskContext as Context
from mcp_celery_tasks.worker.runner import JobRunner
from workers.model_files import principal_folder
from workers.train_model import train_model

PREFIX = "unit_steps_"

CALLS: list[str] = []
"""What the step functions of the running test did, in order."""
PLAN: dict[str, Any] = {}
"""How the tools of the running test behave (set by each test)."""


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    CALLS.clear()
    PLAN.clear()
    yield
    CALLS.clear()
    PLAN.clear()


def _work(label: str, value: Any) -> Any:
    CALLS.append(label)
    return value


def _stop_on_first_run() -> None:
    """The first run is cut short the way a deploy cuts it (given back, run again)."""
    if not PLAN.get("stopped"):
        PLAN["stopped"] = True
        raise WorkerStopping("the worker is stopping")


@tool(name=PREFIX + "two_steps")
def _two_steps(ctx: TaskContext) -> dict[str, Any]:
    first = ctx.step("fetch", _work, "fetch", {"rows": 3, "pair": (1, 2)})
    second = ctx.step("fit", _work, "fit", first["rows"] * 2)
    _stop_on_first_run()
    return {"first": first, "second": second}


@tool(name=PREFIX + "ordered")
def _ordered(ctx: TaskContext) -> str:
    for name in PLAN["names"].pop(0):
        ctx.step(name, _work, name, name)
    _stop_on_first_run()
    return "done"


@tool(name=PREFIX + "returns")
def _returns(ctx: TaskContext) -> Any:
    ctx.step("small", _work, "small", "ok")
    return ctx.step("big", _work, "big", PLAN["value"])


@tool(name=PREFIX + "nested")
def _nested(ctx: TaskContext) -> Any:
    return ctx.step("outer", lambda: ctx.step("inner", _work, "inner", 1))


@tool(name=PREFIX + "epochs")
def _epochs(ctx: TaskContext, epochs: int = 5, stop_after: int = 0) -> dict[str, Any]:
    saved = ctx.checkpoint.load("state")
    state = json.loads(saved) if saved is not None else {"epoch": 0, "total": 0}
    resumed = state["epoch"]
    for epoch in range(resumed + 1, epochs + 1):
        CALLS.append(f"epoch {epoch}")
        state = {"epoch": epoch, "total": state["total"] + epoch}
        ctx.checkpoint.save("state", json.dumps(state).encode())
        if epoch == stop_after:
            _stop_on_first_run()
    return {"resumed_after": resumed, **state}


@tool(name=PREFIX + "checkpoint_cap")
def _checkpoint_cap(ctx: TaskContext, size: int) -> str:
    ctx.checkpoint.save("state", b"epoch 1")
    ctx.checkpoint.save("state", b"x" * size)
    return "saved"


@tool(name=PREFIX + "checkpoint_kinds")
def _checkpoint_kinds(ctx: TaskContext, folder: str) -> dict[str, Any]:
    source = Path(folder) / "weights.bin"
    source.write_bytes(bytes(range(256)) * 9000)  # 2.3 MB: three chunks
    info = ctx.checkpoint.save("from-path", source)
    with source.open("rb") as handle:
        ctx.checkpoint.save("from-file", handle)
    ctx.checkpoint.save("from-bytes", io.BytesIO(b"abc").getvalue())
    copied = Path(folder) / "copy.bin"
    assert ctx.checkpoint.load_to("from-file", copied)
    missing = Path(folder) / "missing.bin"
    return {
        "size": info.size,
        "storage": info.storage,
        "same_file": copied.read_bytes() == source.read_bytes(),
        "bytes": (ctx.checkpoint.load("from-bytes") or b"").decode(),
        "none": ctx.checkpoint.load("never-saved") is None,
        "load_to_none": ctx.checkpoint.load_to("never-saved", missing) is False and not missing.exists(),
        "info": ctx.checkpoint.info("from-path") == info,
        "deleted": ctx.checkpoint.delete("from-bytes") and ctx.checkpoint.load("from-bytes") is None,
        "deleted_again": ctx.checkpoint.delete("from-bytes"),
    }


def runs(
    name: str, settings: Settings | None = None, times: int = 2, **arguments: Any
) -> tuple[Row, MemoryStore]:
    """Run the job up to ``times`` times on one store (a run the tool cuts short is given back)."""
    store = MemoryStore()
    row = store.add(PREFIX + name, arguments)
    runner = JobRunner(store, settings or Settings(), lambda: MemoryInbox())
    for _ in range(times):
        if row.status != "working":
            break
        runner.run(row.job_id)
    return row, store


def text_of(row: Row) -> str:
    assert row.result is not None
    return str(as_object(as_array(row.result["content"])[0])["text"])


# ---- steps --------------------------------------------------------------------------------------


def test_a_rerun_returns_the_recorded_steps_without_running_them() -> None:
    row, store = runs("two_steps")
    assert row.status == "completed" and row.redeliveries == 1
    assert CALLS == ["fetch", "fit"]  # each ran once, on the first run
    # Returned as JSON decodes it, on the first run as on the replay (the tuple is a list).
    assert row.result is not None
    assert row.result["structuredContent"] == {"first": {"rows": 3, "pair": [1, 2]}, "second": 6}
    assert store.step_index(row.task_id) == [(1, "fetch"), (2, "fit")]


def test_a_step_met_at_another_position_fails_the_run_clearly() -> None:
    PLAN["names"] = [["load", "fit"], ["fit", "load"]]
    row, store = runs("ordered")
    assert row.status == "completed" and row.result is not None and row.result["isError"]
    assert store.step_index(row.task_id) == [(1, "load"), (2, "fit")]
    assert text_of(row) == (
        "step 'fit' was recorded as step 2 but this run reached it as step 1: "
        "steps must run in the same order on every run"
    )
    assert row.error_kind == "step_order" and CALLS == ["load", "fit"]  # nothing reused, nothing re-ran


def test_another_step_at_a_recorded_position_fails_the_run_clearly() -> None:
    PLAN["names"] = [["load", "fit"], ["load", "score"]]
    row, _ = runs("ordered")
    assert text_of(row) == (
        "step 2 was recorded as 'fit' but this run reached 'score' there: "
        "steps must run in the same order on every run"
    )
    assert CALLS == ["load", "fit"]


def test_a_rerun_may_go_past_the_recorded_steps() -> None:
    PLAN["names"] = [["load"], ["load", "fit"]]
    row, store = runs("ordered")
    assert row.status == "completed" and row.result is not None and not row.result["isError"]
    assert CALLS == ["load", "fit"]
    assert store.step_index(row.task_id) == [(1, "load"), (2, "fit")]


def test_a_step_result_over_the_cap_is_a_tool_error_and_nothing_is_recorded() -> None:
    PLAN["value"] = "x" * 200
    row, store = runs("returns", Settings(max_step_result_bytes=100))
    assert text_of(row) == (
        "step 'big' returned 202 bytes of JSON, more than the limit of 100 (max_step_result_bytes): "
        "save large data with ctx.checkpoint"
    )
    assert store.step_index(row.task_id) == [(1, "small")] and row.error_kind == "step_result"


def test_a_step_result_that_is_not_json_is_a_tool_error_and_nothing_is_recorded() -> None:
    for value in ({"when": object()}, float("nan")):
        PLAN["value"] = value
        run = run_tool(PREFIX + "returns")
        assert run.is_error and "step 'big' returned a result that is not JSON" in run.text, run.text
    PLAN["value"] = "\\u0000 is six characters here"
    assert run_tool(PREFIX + "returns").text == "\\u0000 is six characters here"


def test_steps_cannot_be_nested() -> None:
    run = run_tool(PREFIX + "nested")
    assert run.is_error and CALLS == []


def test_the_errors_are_tool_errors() -> None:
    for error in (StepOrderError, StepResultError, CheckpointTooLarge):
        assert issubclass(error, ToolError)


def test_a_context_without_a_task_says_steps_need_one() -> None:
    ctx = Context(task_id="t", job_id="j", tool_name="x", attempt=1, preflight=None, runtime=None)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="durable steps need a task"):
        ctx.step("a", _work, "a", 1)
    with pytest.raises(ToolError, match="durable steps need a task"):
        ctx.checkpoint.load("a")


def test_a_step_write_the_fence_refuses_cancels_the_run() -> None:
    store = MemoryStore()
    row = store.add(PREFIX + "two_steps")
    original = store.record_step

    def taken(task_id: str, worker: str, seq: int, name: str, result: str) -> bool | None:
        store.rows[task_id].worker = "someone-else"  # the lease went to another worker meanwhile
        return original(task_id, worker, seq, name, result)

    store.record_step = taken  # type: ignore[method-assign]
    JobRunner(store, Settings(), lambda: MemoryInbox()).run(row.job_id)
    assert store.step_index(row.task_id) == [] and row.result is None  # nothing written


# ---- checkpoints ----------------------------------------------------------------------------------


def test_a_rerun_resumes_after_the_last_checkpointed_epoch() -> None:
    row, _ = runs("epochs", epochs=5, stop_after=2)
    assert CALLS == ["epoch 1", "epoch 2", "epoch 3", "epoch 4", "epoch 5"]  # none ran twice
    assert row.result is not None
    assert row.result["structuredContent"] == {"resumed_after": 2, "epoch": 5, "total": 15}


def test_a_checkpoint_over_the_cap_is_a_tool_error_and_the_previous_one_stays() -> None:
    row, store = runs("checkpoint_cap", Settings(max_checkpoint_bytes=1000), size=1001)
    assert text_of(row) == (
        "checkpoint 'state' is larger than the limit of 1000 bytes (max_checkpoint_bytes; 1001 read so "
        "far): nothing was saved, the previous checkpoint stays"
    )
    assert row.error_kind == "checkpoint_too_large"
    record = store.checkpoint(row.task_id, "state")
    assert record is not None and b"".join(store.checkpoint_chunks(row.task_id, record)) == b"epoch 1"


def test_checkpoints_take_bytes_paths_and_files_and_stream_back(tmp_path: Path) -> None:
    run = run_tool(PREFIX + "checkpoint_kinds", {"folder": str(tmp_path)})
    assert not run.is_error, run.text
    assert run.structured == {
        "size": 256 * 9000,
        "storage": "postgres",
        "same_file": True,
        "bytes": "abc",
        "none": True,
        "load_to_none": True,
        "info": True,
        "deleted": True,
        "deleted_again": False,
    }


def test_checkpoints_in_a_shared_directory_are_files_written_atomically(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    settings = Settings(checkpoint_dir=str(tmp_path / "ckpt"))
    run = run_tool(PREFIX + "checkpoint_kinds", {"folder": str(folder)}, settings=settings)
    assert not run.is_error, run.text
    assert run.structured is not None and run.structured["storage"] == "directory"
    (job_dir,) = (tmp_path / "ckpt").iterdir()
    # One file per live checkpoint (the deleted one is gone, no temporary file is left).
    names = sorted(path.name.split(".")[0] for path in job_dir.iterdir())
    assert names == ["from-file", "from-path"]


@tool(name=PREFIX + "checkpoint_after_a_crash")
def _checkpoint_after_a_crash(ctx: TaskContext, folder: str) -> list[str]:
    # What a run killed mid-save leaves in the job's folder: a temporary file and a generation
    # renamed into place but never recorded.
    (job_dir,) = Path(folder).iterdir()
    (job_dir / ".saving-killed.tmp").write_bytes(b"half")
    (job_dir / "state.0123456789abcdef.ckpt").write_bytes(b"never recorded")
    ctx.checkpoint.save("state", b"second")
    ctx.checkpoint.save("a.b", b"dotted")  # its own stem: never swept as "a_b"
    return sorted(path.name.split(".")[0] for path in job_dir.iterdir())


def test_a_directory_checkpoint_save_sweeps_what_a_killed_save_left(tmp_path: Path) -> None:
    settings = Settings(checkpoint_dir=str(tmp_path))
    store = MemoryStore()
    row = store.add(PREFIX + "checkpoint_after_a_crash", {"folder": str(tmp_path)})
    (tmp_path / row.job_id).mkdir()
    (tmp_path / row.job_id / "a_b.0123456789abcdef.ckpt").write_bytes(b"another name's file")
    runner = JobRunner(store, settings, lambda: MemoryInbox())
    runner.run(row.job_id)
    assert row.result is not None and not row.result["isError"], row.result
    left: Any = row.result["structuredContent"]
    left = left["result"] if isinstance(left, dict) else left
    assert left[0] == "a_b" and left[1].startswith("a_b-") and left[2:] == ["state"], left


def test_train_model_resumes_after_its_last_checkpoint_and_trains_as_if_never_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_EXAMPLES_MODELS_DIR", str(tmp_path))
    arguments = {"model": "m", "epochs": 6, "samples": 200}
    whole = run_tool(train_model, arguments)
    assert not whole.is_error, whole.text
    (tmp_path / principal_folder("anon") / "m.npz").unlink()  # the caller's models folder
    # The same task run twice: the first run stops after its third checkpoint.
    store = MemoryStore()
    row = store.add("train_model", arguments)
    saves = store.save_checkpoint

    def stop_after_three(*args: Any) -> Any:
        saved = saves(*args)
        if len(CALLS) == 2 and not PLAN.get("stopped"):
            PLAN["stopped"] = True
            raise WorkerStopping("the worker is stopping")
        CALLS.append("saved")
        return saved

    store.save_checkpoint = stop_after_three  # type: ignore[method-assign,assignment]
    runner = JobRunner(store, Settings(), lambda: MemoryInbox())
    runner.run(row.job_id)
    assert row.status == "working" and row.redeliveries == 1
    runner.run(row.job_id)
    assert row.result is not None and not row.result["isError"], row.result
    resumed: Any = row.result["structuredContent"]
    assert resumed["resumed_after_epoch"] == 3 and whole.structured["resumed_after_epoch"] == 0
    for key in ("final_loss", "losses", "accuracy"):
        assert resumed[key] == whole.structured[key]


@tool(name=PREFIX + "missing_file")
def _missing_file(ctx: TaskContext, path: str) -> str:
    ctx.checkpoint.save("state", path)
    return "saved"


def test_a_checkpoint_of_a_file_that_cannot_be_read_is_a_clear_tool_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.bin"
    run = run_tool(PREFIX + "missing_file", {"path": str(missing)})
    assert (
        run.is_error and run.text == f"cannot read the checkpoint file {missing}: No such file or directory"
    )


def test_steps_run_and_replayed_and_checkpoint_bytes_are_counted_per_tool() -> None:
    def value(counter: Any, tool_name: str) -> float:
        return float(counter.labels(tool_name)._value.get())

    two, epochs = PREFIX + "two_steps", PREFIX + "epochs"
    before = (value(metrics.steps_run, two), value(metrics.steps_replayed, two))
    saved_before = value(metrics.checkpoint_bytes_saved, epochs)
    runs("two_steps")
    assert (value(metrics.steps_run, two), value(metrics.steps_replayed, two)) == (
        before[0] + 2,
        before[1] + 2,
    )
    PLAN.clear()
    row, _ = runs("epochs", epochs=2)
    assert row.status == "completed"
    sizes = sum(len(json.dumps({"epoch": n, "total": t}).encode()) for n, t in ((1, 1), (2, 3)))
    assert value(metrics.checkpoint_bytes_saved, epochs) == saved_before + sizes
