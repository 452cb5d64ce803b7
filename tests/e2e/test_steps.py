"""Durable steps and checkpoints on a real stack: a prefork worker child SIGKILLed mid-run, and
the re-run resumes from the record instead of redoing the work.

The stack (its own database, Redis, one prefork worker with two children, and one for the ``gpu``
queue) has a 3 s lease, so the job redelivered after the kill is claimed again within seconds.
Each tool marks what it ran in files (tests/fixtures/durable.py), counted across the task's runs;
``train_model`` is checked against an uninterrupted run of itself. The gpu worker keeps its
checkpoints in a directory (``MCP_TASKS_CHECKPOINT_DIR``), the other in Postgres.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcp_celery_tasks.testing import run_tool
from tests import support
from tests.support import LOG_DIR, Client, Stack, wait_until
from workers.train_model import train_model

MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024
TOOLS = '["tests.fixtures.conformance", "tests.fixtures.durable", "workers"]'
REDIS_URL = support.REDIS_URL.rsplit("/", 1)[0] + "/9"
"""A Redis database of this module's own: ``train_model``'s queue is plainly ``gpu``, and no other
stack's gpu worker may take its jobs."""


@pytest.fixture(scope="module")
def steps_stack(template_db: str) -> Iterator[Stack]:
    name = f"mcpt_steps_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name, template=template_db)
    extra: dict[str, Any] = {
        "MCP_TASKS_TOOL_MODULES": TOOLS,
        "MCP_TASKS_LEASE_SECONDS": "3",
        "MCP_TASKS_LEASE_GRACE_SECONDS": "1",
        "MCP_TASKS_MAX_CHECKPOINT_BYTES": str(MAX_CHECKPOINT_BYTES),
    }
    try:
        with support.running_stack("steps", dsn, REDIS_URL, f"s{uuid.uuid4().hex[:6]}", **extra) as stack:
            files = LOG_DIR.parent / f"steps-checkpoints-{uuid.uuid4().hex[:6]}"
            gpu_env = dict(stack.env, MCP_TASKS_DEFAULT_QUEUE="gpu", MCP_TASKS_CHECKPOINT_DIR=str(files))
            gpu = support.start_worker("steps-gpu-worker", gpu_env, 1)
            stack.env["TEST_CHECKPOINT_DIR"] = str(files)
            try:
                yield stack
            finally:
                gpu.stop(signal.SIGQUIT, timeout=20)
                shutil.rmtree(files, ignore_errors=True)
    finally:
        support.drop_database(name)


@pytest.fixture
def marks() -> Iterator[Path]:
    folder = LOG_DIR.parent / f"steps-marks-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


@pytest.fixture
def client(steps_stack: Stack) -> Iterator[Client]:
    with_client = steps_stack.client()
    yield with_client
    with_client.close()


def kill_when_stalled(marks: Path) -> int:
    """SIGKILL the pool child that stalled in the tool (its first run); its pid."""
    pid = int(
        wait_until(lambda: (marks / "pid").exists() and (marks / "pid").read_text(), 30, what="the stall")
    )
    os.kill(pid, signal.SIGKILL)
    return pid


def lines(marks: Path, name: str) -> list[str]:
    return (marks / name).read_text().splitlines()


def steps_of(stack: Stack, task_id: str) -> list[tuple[int, str, Any]]:
    with stack.db() as conn:
        rows = conn.execute(
            "SELECT seq, name, result FROM mcp_task_steps WHERE task_id = %s ORDER BY seq", (task_id,)
        ).fetchall()
    return [(seq, name, result) for seq, name, result in rows]


def checkpoint_bytes(stack: Stack, task_id: str, name: str) -> bytes | None:
    """A checkpoint as Postgres holds it: the current generation's chunks, in order (one statement,
    so one snapshot: a save meanwhile replaces the generation and its chunks)."""
    with stack.db() as conn:
        rows = conn.execute(
            "SELECT c.size, c.chunks, k.data FROM mcp_task_checkpoints c"
            " JOIN mcp_task_checkpoint_chunks k USING (task_id, name, generation)"
            " WHERE c.task_id = %s AND c.name = %s ORDER BY k.seq",
            (task_id, name),
        ).fetchall()
    if not rows:
        return None
    data = b"".join(bytes(chunk) for _, _, chunk in rows)
    assert len(rows) == rows[0][1] and len(data) == rows[0][0]
    return data


def checkpoint_file(stack: Stack, task_id: str, name: str) -> bytes | None:
    """A checkpoint kept as a file: the one its row names (None while there is none, or when a
    save replaced it between the two reads)."""
    with stack.db() as conn:
        found = conn.execute(
            "SELECT storage, path, size FROM mcp_task_checkpoints WHERE task_id = %s AND name = %s",
            (task_id, name),
        ).fetchone()
    if found is None:
        return None
    storage, path, size = found
    assert storage == "directory", storage
    try:
        data = (Path(stack.env["TEST_CHECKPOINT_DIR"]) / str(path)).read_bytes()
    except FileNotFoundError:
        return None
    assert len(data) == size
    return data


# ---- steps --------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_step_runs_once_and_the_run_after_a_kill_resumes_past_it(
    steps_stack: Stack, client: Client, marks: Path
) -> None:
    task_id = client.start("d_step_then_stall", {"marks": str(marks)})
    killed = kill_when_stalled(marks)
    done = client.wait_status(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    result = done["result"]["structuredContent"]
    # The step ran once, in the killed process; the re-run (a second attempt, in another child)
    # got its recorded result back.
    assert lines(marks, "prepare") == [str(killed)]
    assert result["prepare_runs"] == 1 and result["attempt"] == 2 and result["pid"] != killed
    assert result["prepared"] == {"rows": 1234, "pid": killed, "runs_then": 1}
    assert steps_of(steps_stack, task_id) == [(1, "prepare", result["prepared"])]


# ---- checkpoints --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_run_after_a_kill_mid_training_resumes_after_the_last_checkpointed_epoch(
    steps_stack: Stack, client: Client, marks: Path
) -> None:
    task_id = client.start("d_epochs", {"marks": str(marks), "epochs": 6, "stall_after": 3})
    kill_when_stalled(marks)
    done = client.wait_status(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    # Epochs 1-3 ran on the first attempt and were checkpointed; the second resumed at 4.
    assert lines(marks, "epochs") == ["1 1", "1 2", "1 3", "2 4", "2 5", "2 6"]
    result = done["result"]["structuredContent"]
    assert result == {"resumed_after": 3, "epoch": 6, "weights": [10.5, 10.5]}
    saved = checkpoint_bytes(steps_stack, task_id, "state")
    assert saved is not None and b'"epoch": 6' in saved


@pytest.mark.timeout(180)
def test_train_model_killed_mid_training_resumes_at_its_last_checkpoint_file_and_trains_as_if_never_stopped(
    steps_stack: Stack, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arguments = {"model": f"resume-{uuid.uuid4().hex[:6]}", "epochs": 200, "samples": 20_000}
    task_id = client.start("train_model", arguments)

    def epoch_saved() -> int:
        saved = checkpoint_file(steps_stack, task_id, "training")
        if saved is None:
            return 0
        with np.load(io.BytesIO(saved)) as state:
            return int(state["epoch"])

    wait_until(lambda: epoch_saved() >= 20, 60, interval=0.02, what="20 epochs checkpointed")
    pid = int(steps_stack.row(task_id)["worker"].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    at_kill = epoch_saved()  # the dead process saves nothing more; the re-run waits out its lease
    assert 20 <= at_kill < 200
    done = client.wait_status(task_id, timeout=120)
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    resumed = done["result"]["structuredContent"]
    assert resumed["resumed_after_epoch"] == at_kill and resumed["epochs"] == 200
    row = steps_stack.row(task_id)
    assert row["attempts"] == 2
    # One file is left, the last epoch's: each save replaced the one before, no temporary file stays.
    (left,) = (Path(steps_stack.env["TEST_CHECKPOINT_DIR"]) / row["job_id"]).iterdir()
    assert left.name.startswith("training.") and left.name.endswith(".ckpt")
    final = checkpoint_file(steps_stack, task_id, "training")
    assert final is not None and final == left.read_bytes()
    # The same training, uninterrupted (in this process, in memory): the very same numbers.
    monkeypatch.setenv("MCP_EXAMPLES_MODELS_DIR", str(tmp_path))
    whole = run_tool(train_model, arguments)
    assert whole.structured is not None and whole.structured["resumed_after_epoch"] == 0
    for key in ("initial_loss", "final_loss", "losses", "accuracy"):
        assert resumed[key] == whole.structured[key], key


# ---- the caps -----------------------------------------------------------------------------------


def test_a_checkpoint_over_the_cap_is_a_clear_tool_error_and_the_previous_checkpoint_stays(
    steps_stack: Stack, client: Client
) -> None:
    task_id = client.start("d_oversized", {"what": "checkpoint", "size": MAX_CHECKPOINT_BYTES + 1})
    done = client.wait_status(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"] is True
    (block,) = done["result"]["content"]
    assert block["text"] == (
        f"checkpoint 'state' is larger than the limit of {MAX_CHECKPOINT_BYTES} bytes "
        f"(max_checkpoint_bytes; {MAX_CHECKPOINT_BYTES + 1} read so far): nothing was saved, the "
        "previous checkpoint stays"
    )
    assert checkpoint_bytes(steps_stack, task_id, "state") == b"epoch 1 " * 262_144
    with steps_stack.db() as conn:
        chunks = conn.execute(
            "SELECT count(*) FROM mcp_task_checkpoint_chunks WHERE task_id = %s", (task_id,)
        ).fetchone()
    assert chunks == (2,)  # none of the refused save's chunks is left behind
    assert steps_of(steps_stack, task_id) == [(1, "small", "kept")]


def test_a_step_result_over_the_cap_is_a_clear_tool_error_and_nothing_is_recorded(
    steps_stack: Stack, client: Client
) -> None:
    task_id = client.start("d_oversized", {"what": "step", "size": 2_000_000})
    done = client.wait_status(task_id, timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"] is True
    (block,) = done["result"]["content"]
    assert block["text"] == (
        "step 'big' returned 2000002 bytes of JSON, more than the limit of 1048576 "
        "(max_step_result_bytes): save large data with ctx.checkpoint"
    )
    assert steps_of(steps_stack, task_id) == [(1, "small", "kept")]
    assert checkpoint_bytes(steps_stack, task_id, "state") == b"epoch 1 " * 262_144
