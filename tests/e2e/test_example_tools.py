"""The example tools of workers/ (train_model, search_logs, summarize_file), end to end on the
real API and prefork workers: a dedicated worker consumes the ``gpu`` queue for train_model."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp_types import jsonrpc as codes

from tests.support import Client, Proc, Stack, meta, start_worker, wait_until

# ---- helpers --------------------------------------------------------------------------------


def call(client: Client, name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """tools/call as a task-capable client; ``_meta`` and MRTR fields (inputResponses,
    requestState) go in ``extra``."""
    params: dict[str, Any] = {"name": name, "arguments": arguments, **extra}
    params.setdefault("_meta", meta())
    return client.request("tools/call", params).result


def structured(task: dict[str, Any]) -> dict[str, Any]:
    assert task["status"] == "completed", task
    assert task["result"]["isError"] is False, task["result"]
    return task["result"]["structuredContent"]  # type: ignore[no-any-return]


def tool_error(task: dict[str, Any]) -> str:
    assert task["status"] == "completed", task
    assert task["result"]["isError"] is True, task["result"]
    return str(task["result"]["content"][0]["text"])


def wait_for_question(client: Client, task_id: str, key: str, timeout: float = 30) -> dict[str, Any]:
    """The task once it is input_required with the request ``key`` outstanding."""

    def asked() -> dict[str, Any] | None:
        task = client.get(task_id).result
        assert task["status"] in ("working", "input_required"), task
        return task if key in (task.get("inputRequests") or {}) else None

    return wait_until(asked, timeout, what=f"the input request {key!r}")  # type: ignore[no-any-return]


def wait_worker_stopped(stack: Stack, task_id: str) -> dict[str, Any]:
    return wait_until(  # type: ignore[no-any-return]
        lambda: (row := stack.row(task_id))["finished_at"] is not None and row, 15, what="the job to stop"
    )


# ---- train_model (queue "gpu") ------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A prefork worker for the ``gpu`` queue (the stack's worker only consumes the default one)."""
    env = dict(stack.env, MCP_TASKS_DEFAULT_QUEUE="gpu")
    proc = start_worker("examples-gpu-worker", env)
    try:
        client = stack.client()
        probe = tmp_path_factory.mktemp("gpu-probe") / "probe.npz"
        task_id = client.start("train_model", {"model_path": str(probe), "epochs": 1, "samples": 10})
        if proc.popen.poll() is not None:
            raise AssertionError(f"the gpu worker exited: {proc.log.read_text()[-3000:]}")
        structured(client.wait_status(task_id, timeout=90))
        client.close()
        yield proc
    finally:
        proc.stop(signal.SIGQUIT, timeout=20)


def test_train_model_runs_on_the_gpu_queue_and_saves_a_model_whose_loss_decreased(
    gpu_worker: Proc, client: Client, stack: Stack, tmp_path: Path
) -> None:
    model_path = tmp_path / "models" / "moons.npz"
    task_id = client.start("train_model", {"model_path": str(model_path), "epochs": 20, "seed": 3})
    done = client.wait_status(task_id, timeout=60)
    result = structured(done)
    assert stack.row(task_id)["queue"] == "gpu"
    assert result["model_path"] == str(model_path)
    assert result["epochs"] == 20 and len(result["losses"]) == 20
    assert result["final_loss"] == result["losses"][-1]
    assert result["final_loss"] < result["losses"][0] < result["initial_loss"]
    assert result["accuracy"] > 0.8
    assert re.fullmatch(r"epoch 20/20: loss \d+\.\d{4}", done["statusMessage"])
    with np.load(model_path) as weights:
        assert sorted(weights.files) == ["b1", "b2", "w1", "w2"]
        assert weights["w1"].shape == (2, 16)
    assert [p.name for p in model_path.parent.iterdir()] == ["moons.npz"]  # no temp file left


def test_existing_model_file_makes_the_call_ask_first_then_the_accepted_answer_creates_the_task(
    gpu_worker: Proc, client: Client, tmp_path: Path
) -> None:
    model_path = tmp_path / "model.npz"
    model_path.write_bytes(b"previous model")
    arguments = {"model_path": str(model_path), "epochs": 3}
    asked = call(client, "train_model", arguments, _meta=meta(elicitation={}))
    assert asked["resultType"] == "input_required"
    assert "taskId" not in asked
    assert isinstance(asked["requestState"], str) and asked["requestState"]
    question = asked["inputRequests"]["overwrite"]
    assert question["method"] == "elicitation/create"
    assert str(model_path) in question["params"]["message"]
    assert question["params"]["requestedSchema"]["required"] == ["overwrite"]
    assert model_path.read_bytes() == b"previous model"  # nothing ran yet

    created = call(
        client,
        "train_model",
        arguments,
        _meta=meta(elicitation={}),
        inputResponses={"overwrite": {"action": "accept", "content": {"overwrite": True}}},
        requestState=asked["requestState"],
    )
    assert created["resultType"] == "task"
    result = structured(client.wait_status(created["taskId"], timeout=60))
    assert result["epochs"] == 3
    with np.load(model_path) as weights:
        assert "w1" in weights.files


@pytest.mark.parametrize(
    "answer",
    [{"action": "decline"}, {"action": "accept", "content": {"overwrite": False}}],
    ids=["declined", "accepted-with-no"],
)
def test_refusing_the_overwrite_ends_the_task_with_is_error_and_keeps_the_file(
    gpu_worker: Proc, client: Client, tmp_path: Path, answer: dict[str, Any]
) -> None:
    model_path = tmp_path / "model.npz"
    model_path.write_bytes(b"previous model")
    arguments = {"model_path": str(model_path)}
    asked = call(client, "train_model", arguments, _meta=meta(elicitation={}))
    created = call(
        client,
        "train_model",
        arguments,
        _meta=meta(elicitation={}),
        inputResponses={"overwrite": answer},
        requestState=asked["requestState"],
    )
    message = tool_error(client.wait_status(created["taskId"], timeout=60))
    assert "declined" in message
    assert model_path.read_bytes() == b"previous model"


def test_overwrite_question_needs_a_client_that_can_answer_it(client: Client, tmp_path: Path) -> None:
    model_path = tmp_path / "model.npz"
    model_path.write_bytes(b"previous model")
    reply = client.call_tool("train_model", {"model_path": str(model_path)})
    assert reply.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert reply.error["data"] == {"requiredCapabilities": {"elicitation": {}}}


def test_cancelling_training_mid_run_ends_cancelled_and_writes_no_model(
    gpu_worker: Proc, client: Client, stack: Stack, tmp_path: Path
) -> None:
    model_path = tmp_path / "never.npz"
    task_id = client.start("train_model", {"model_path": str(model_path), "epochs": 1_000_000})
    wait_until(
        lambda: re.match(
            r"epoch [1-9]\d*/1000000: loss", client.get(task_id).result.get("statusMessage", "")
        ),
        30,
        what="training to be under way",
    )
    client.cancel(task_id)
    assert client.get(task_id).result["status"] == "cancelled"
    row = wait_worker_stopped(stack, task_id)
    assert row["status"] == "cancelled" and row["result"] is None
    assert not model_path.exists()


# ---- search_logs ---------------------------------------------------------------------------------

PATTERN = r"ERROR \[db\] connection reset id=\d+"
LOG_FILES = {"app.log": 120_000, "nested/web.log": 100_000, "nested/deeper/worker.log": 80_000}


def _log_line(i: int) -> str:
    if i % 997 == 5:
        return f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d} ERROR [db] connection reset id={i}"
    if i % 991 == 0:
        return f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d} ERROR [db] connection refused id={i}"
    return f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d} INFO [web] GET /items/{i} 200 {i % 89}ms"


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """300k lines in three files (nested), a decoy with another extension, and the matches that
    a plain line-by-line search finds, in scan order (files sorted by directory walk)."""
    root = tmp_path_factory.mktemp("logs")
    for name, count in LOG_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(_log_line(i) + "\n" for i in range(count)))
    (root / "notes.txt").write_text(_log_line(5) + "\n")
    regex = re.compile(PATTERN)
    expected = []
    for name in LOG_FILES:  # the order of a sorted directory walk
        with open(root / name) as handle:
            for number, line in enumerate(handle, start=1):
                if regex.search(line):
                    expected.append({"file": name, "line": number, "text": line.rstrip("\n")})
    return root, expected


def test_search_logs_finds_exactly_the_matches_of_every_matching_file(
    client: Client, log_dir: tuple[Path, list[dict[str, Any]]]
) -> None:
    root, expected = log_dir
    task_id = client.start("search_logs", {"directory": str(root), "pattern": PATTERN, "max_matches": 5000})
    done = client.wait_status(task_id, timeout=60)
    result = structured(done)
    assert result["files"] == result["files_scanned"] == 3
    assert result["lines_scanned"] == sum(LOG_FILES.values())
    assert result["match_count"] == len(expected) > 250
    assert result["matches"] == expected
    assert result["stopped_early"] is False and result["matches_truncated"] is False
    assert done["statusMessage"] == f"{sum(LOG_FILES.values())} lines scanned, {len(expected)} matches"


def test_search_logs_asks_whether_to_continue_after_max_matches_and_stops_with_partial_results(
    client: Client, log_dir: tuple[Path, list[dict[str, Any]]]
) -> None:
    root, expected = log_dir
    created = call(
        client,
        "search_logs",
        {"directory": str(root), "pattern": PATTERN, "max_matches": 100},
        _meta=meta(elicitation={}),
    )
    task_id = created["taskId"]
    first = wait_for_question(client, task_id, "continue-after-100")
    assert first["status"] == "input_required"
    request = first["inputRequests"]["continue-after-100"]
    assert request["method"] == "elicitation/create"
    assert request["params"]["requestedSchema"]["properties"]["continue"] == {
        "type": "boolean",
        "description": "Keep searching",
    }
    assert "100 matches" in request["params"]["message"]
    client.update(task_id, {"continue-after-100": {"action": "accept", "content": {"continue": True}}})

    second = wait_for_question(client, task_id, "continue-after-200")
    assert "200 matches" in second["inputRequests"]["continue-after-200"]["params"]["message"]
    client.update(task_id, {"continue-after-200": {"action": "accept", "content": {"continue": False}}})

    result = structured(client.wait_status(task_id))
    assert result["stopped_early"] is True
    assert result["match_count"] == 200
    assert result["matches"] == expected[:200]
    assert result["stop_reason"] == "reached 200 matches; the user chose to stop"
    # Scanned up to the 200th match: every line of the files before its file, then its line.
    last = expected[199]
    order = list(LOG_FILES)
    before = sum(LOG_FILES[name] for name in order[: order.index(last["file"])])
    assert result["lines_scanned"] == before + last["line"]


def test_search_logs_without_elicitation_stops_at_max_matches_and_says_why(
    client: Client, log_dir: tuple[Path, list[dict[str, Any]]]
) -> None:
    root, expected = log_dir
    task_id = client.start("search_logs", {"directory": str(root), "pattern": PATTERN, "max_matches": 50})
    result = structured(client.wait_status(task_id))
    assert result["stopped_early"] is True and result["match_count"] == 50
    assert result["matches"] == expected[:50]
    assert result["stop_reason"] == "reached 50 matches; the client cannot be asked to continue"


def test_search_logs_reports_a_bad_pattern_as_a_tool_error(client: Client, tmp_path: Path) -> None:
    task_id = client.start("search_logs", {"directory": str(tmp_path), "pattern": "(unclosed"})
    assert "invalid regular expression" in tool_error(client.wait_status(task_id))


def test_cancelling_search_logs_mid_scan_stops_reading(client: Client, stack: Stack, tmp_path: Path) -> None:
    # A named pipe as the log file: the scan cannot reach its end before the cancel, and the
    # writer learns (EPIPE) when the worker closes it.
    fifo = tmp_path / "live.log"
    os.mkfifo(fifo)
    stopped_reading = threading.Event()
    stop_writer = threading.Event()

    def write_forever() -> None:
        batch = "".join(_log_line(i) + "\n" for i in range(10_000)).encode()
        try:
            with open(fifo, "wb") as pipe:
                while not stop_writer.is_set():
                    pipe.write(batch)
        except BrokenPipeError:
            stopped_reading.set()

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    arguments = {"directory": str(tmp_path), "pattern": PATTERN, "max_matches": 10**9}
    task_id = client.start("search_logs", arguments)
    try:
        wait_until(
            lambda: re.match(r"[1-9]\d* lines scanned", client.get(task_id).result.get("statusMessage", "")),
            30,
            what="the scan to be under way",
        )
        client.cancel(task_id)
        assert client.get(task_id).result["status"] == "cancelled"
        row = wait_worker_stopped(stack, task_id)
        assert row["status"] == "cancelled" and row["result"] is None
        assert stopped_reading.wait(10), "the worker kept the log open"
    finally:
        stop_writer.set()
        if not stopped_reading.is_set():
            # Unblock a writer still waiting for a reader (the job never opened the pipe).
            with open(fifo, "rb", buffering=0) as reader:
                reader.read(1)
        writer.join(10)


# ---- summarize_file (sampling) ---------------------------------------------------------------------


def test_summarize_file_asks_the_clients_model_and_returns_its_summary(
    client: Client, tmp_path: Path
) -> None:
    document = tmp_path / "release-notes.txt"
    document.write_text("Version 2.0 adds tasks.\nWorkers run on Celery.\nTasks live in Postgres.\n")
    created = call(
        client, "summarize_file", {"path": str(document), "max_tokens": 50}, _meta=meta(sampling={})
    )
    task_id = created["taskId"]
    asked = wait_for_question(client, task_id, "summary")
    assert asked["status"] == "input_required"
    request = asked["inputRequests"]["summary"]
    assert request["method"] == "sampling/createMessage"
    assert request["params"]["maxTokens"] == 50
    prompt = request["params"]["messages"][0]["content"]["text"]
    assert "release-notes.txt" in prompt and "Workers run on Celery." in prompt
    assert request["params"]["systemPrompt"]

    reply = {"role": "assistant", "content": {"type": "text", "text": "short summary"}, "model": "test-model"}
    client.update(task_id, {"summary": reply})
    result = structured(client.wait_status(task_id))
    assert result["summary"] == "short summary"
    assert result["model"] == "test-model"
    assert result["input_truncated"] is False


def test_summarize_file_without_the_sampling_capability_is_a_tool_error(
    client: Client, tmp_path: Path
) -> None:
    document = tmp_path / "doc.txt"
    document.write_text("something to summarize")
    task_id = client.start("summarize_file", {"path": str(document)})
    assert "'sampling' capability" in tool_error(client.wait_status(task_id))
