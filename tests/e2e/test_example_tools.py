"""The example tools of workers/ (train_model, search_logs, summarize_file, count_words), end to
end on the real API and prefork workers: a dedicated worker consumes the ``gpu`` queue for
train_model. The stack confines them to its own MCP_EXAMPLES_FILES_ROOT and
MCP_EXAMPLES_MODELS_DIR; every attack on their path arguments ends the task with ``isError`` and
a message that says what is allowed, and writes nothing."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from mcp_types import jsonrpc as codes

from tests.support import Client, Proc, Stack, meta, start_worker, wait_until
from workers.model_files import principal_folder

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
    content: dict[str, Any] = task["result"]["structuredContent"]
    return content


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

    return wait_until(asked, timeout, what=f"the input request {key!r}")


def wait_worker_stopped(stack: Stack, task_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (row := stack.row(task_id))["finished_at"] is not None and row, 15, what="the job to stop"
    )


def files_root(stack: Stack) -> Path:
    return Path(stack.env["MCP_EXAMPLES_FILES_ROOT"])


def models_root(stack: Stack) -> Path:
    """The models folder of the stack's caller (``anon``: the stack has no auth)."""
    return Path(stack.env["MCP_EXAMPLES_MODELS_DIR"]) / principal_folder("anon")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def files(stack: Stack) -> Path:
    """A directory of this test's own inside the stack's files root."""
    directory = files_root(stack) / unique("test")
    directory.mkdir()
    return directory


def inside(stack: Stack, path: Path) -> str:
    """``path`` as a caller names it: relative to the files root."""
    return str(path.relative_to(files_root(stack)))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside both roots, with a file a tool must never read or replace."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.log").write_text("ERROR password=hunter2\n")
    return directory


def file_attacks(stack: Stack, files: Path, outside: Path) -> list[str]:
    """Paths a hostile caller sends to a tool that reads one file (symlinks planted in ``files``)."""
    (files / "innocent.txt").symlink_to(outside / "secret.log")
    (files / "outside-dir").symlink_to(outside)
    return [
        "/etc/passwd",
        f"{inside(stack, files)}/../../secret.log",
        "../" * 12 + str(outside / "secret.log").lstrip("/"),
        f"{inside(stack, files)}/innocent.txt",
        f"{inside(stack, files)}/outside-dir/secret.log",
        "/proc/self/environ",
        "/dev/zero",
        "file:///etc/shadow",
        str(outside / "secret.log"),
    ]


def read_artifact(client: Client, uri: str) -> bytes:
    """An artifact's bytes, read with ``resources/read`` (base64 ``blob`` or ``text``)."""
    [content] = client.request("resources/read", {"uri": uri}, name=uri).result["contents"]
    return base64.b64decode(content["blob"]) if "blob" in content else str(content["text"]).encode()


def refusals(client: Client, task_ids: list[str]) -> list[str]:
    return [tool_error(client.wait_status(task_id, timeout=60)) for task_id in task_ids]


# ---- train_model (queue "gpu") ------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_worker(stack: Stack) -> Iterator[Proc]:
    """A prefork worker for the ``gpu`` queue (the stack's worker only consumes the default one)."""
    env = dict(stack.env, MCP_TASKS_DEFAULT_QUEUE="gpu")
    proc = start_worker("examples-gpu-worker", env)
    try:
        client = stack.client()
        task_id = client.start("train_model", {"model": unique("probe"), "epochs": 1, "samples": 10})
        if proc.popen.poll() is not None:
            raise AssertionError(f"the gpu worker exited: {proc.log.read_text()[-3000:]}")
        structured(client.wait_status(task_id, timeout=90))
        client.close()
        yield proc
    finally:
        proc.stop(signal.SIGQUIT, timeout=20)


@pytest.fixture
def model_dir(stack: Stack) -> str:
    """A name of this test's own for a directory under the stack's models directory."""
    return unique("test")


def test_train_model_runs_on_the_gpu_queue_and_saves_a_model_whose_loss_decreased(
    gpu_worker: Proc, client: Client, stack: Stack, model_dir: str
) -> None:
    task_id = client.start("train_model", {"model": f"{model_dir}/moons", "epochs": 20, "seed": 3})
    done = client.wait_status(task_id, timeout=60)
    result = structured(done)
    model_path = models_root(stack) / model_dir / "moons.npz"
    assert stack.row(task_id)["queue"] == "gpu"
    assert result["model"] == f"{model_dir}/moons.npz" and result["model_path"] == str(model_path)
    assert result["epochs"] == 20 and len(result["losses"]) == 20
    assert result["final_loss"] == result["losses"][-1]
    assert result["final_loss"] < result["losses"][0] < result["initial_loss"]
    assert result["accuracy"] > 0.8
    assert "statusMessage" not in done  # finished: its last progress text is gone
    with np.load(model_path) as weights:
        assert sorted(weights.files) == ["b1", "b2", "w1", "w2"]
        assert weights["w1"].shape == (2, 16)
    assert [p.name for p in model_path.parent.iterdir()] == ["moons.npz"]  # no temp file left
    [link] = [block for block in done["result"]["content"] if block["type"] == "resource_link"]
    assert link["name"] == "moons.npz" and result["weights"] == link["uri"]
    assert read_artifact(client, link["uri"]) == model_path.read_bytes()


def existing_model(stack: Stack, model_dir: str) -> tuple[str, Path]:
    """A model name whose file exists, and that file."""
    model_path = models_root(stack) / model_dir / "model.npz"
    model_path.parent.mkdir(parents=True)
    model_path.write_bytes(b"previous model")
    return f"{model_dir}/model", model_path


def test_existing_model_file_makes_the_call_ask_first_then_the_accepted_answer_creates_the_task(
    gpu_worker: Proc, client: Client, stack: Stack, model_dir: str
) -> None:
    name, model_path = existing_model(stack, model_dir)
    arguments = {"model": name, "epochs": 3}
    asked = call(client, "train_model", arguments, _meta=meta(elicitation={}))
    assert asked["resultType"] == "input_required"
    assert "taskId" not in asked
    assert isinstance(asked["requestState"], str) and asked["requestState"]
    question = asked["inputRequests"]["overwrite"]
    assert question["method"] == "elicitation/create"
    assert f"{name}.npz already exists" in question["params"]["message"]
    # One question: accepting it is the consent (no field asking it again).
    assert question["params"]["requestedSchema"] == {"type": "object", "properties": {}}
    assert model_path.read_bytes() == b"previous model"  # nothing ran yet

    created = call(
        client,
        "train_model",
        arguments,
        _meta=meta(elicitation={}),
        inputResponses={"overwrite": {"action": "accept"}},
        requestState=asked["requestState"],
    )
    assert created["resultType"] == "task"
    result = structured(client.wait_status(created["taskId"], timeout=60))
    assert result["epochs"] == 3
    with np.load(model_path) as weights:
        assert "w1" in weights.files


@pytest.mark.parametrize(
    "answer",
    [{"action": "decline"}, {"action": "cancel"}, {"action": "accept", "content": {"overwrite": False}}],
    ids=["declined", "dismissed", "accepted-with-no"],
)
def test_refusing_the_overwrite_completes_without_is_error_and_keeps_the_file(
    gpu_worker: Proc, client: Client, stack: Stack, model_dir: str, answer: dict[str, Any]
) -> None:
    name, model_path = existing_model(stack, model_dir)
    arguments = {"model": name}
    asked = call(client, "train_model", arguments, _meta=meta(elicitation={}))
    created = call(
        client,
        "train_model",
        arguments,
        _meta=meta(elicitation={}),
        inputResponses={"overwrite": answer},
        requestState=asked["requestState"],
    )
    result = structured(client.wait_status(created["taskId"], timeout=60))
    assert result["kept_existing"] is True and result["message"].startswith(f"kept the existing model {name}")
    assert "epochs" not in result  # nothing was trained
    assert model_path.read_bytes() == b"previous model"


def test_overwrite_question_needs_a_client_that_can_answer_it(
    client: Client, stack: Stack, model_dir: str
) -> None:
    name, _ = existing_model(stack, model_dir)
    reply = client.call_tool("train_model", {"model": name})
    assert reply.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert reply.error["data"] == {"requiredCapabilities": {"elicitation": {}}}


def test_cancelling_training_mid_run_ends_cancelled_and_writes_no_model(
    gpu_worker: Proc, client: Client, stack: Stack, model_dir: str
) -> None:
    task_id = client.start("train_model", {"model": f"{model_dir}/never", "epochs": 100_000})
    wait_until(
        lambda: re.match(r"epoch [1-9]\d*/100000: loss", client.get(task_id).result.get("statusMessage", "")),
        30,
        what="training to be under way",
    )
    client.cancel(task_id)
    assert client.get(task_id).result["status"] == "cancelled"
    row = wait_worker_stopped(stack, task_id)
    assert row["status"] == "cancelled" and row["result"] is None
    assert list((models_root(stack) / model_dir).iterdir()) == []  # neither the model nor a temp file


def test_train_model_refuses_every_name_outside_the_models_directory_and_writes_nothing(
    gpu_worker: Proc, client: Client, stack: Stack, model_dir: str, outside: Path
) -> None:
    (models_root(stack) / model_dir).mkdir()
    (models_root(stack) / model_dir / "linked").symlink_to(outside)
    escape = unique("escape")
    attacks = [
        f"/tmp/{escape}",
        f"../{escape}",
        f"{model_dir}/../../{escape}",
        f"{model_dir}/linked/{escape}",
        f"{model_dir}/linked/secret.log",
        str(outside / "secret.log"),
        "/proc/self/environ",
    ]
    task_ids = [client.start("train_model", {"model": name, "epochs": 1, "samples": 10}) for name in attacks]
    for name, message in zip(attacks, refusals(client, task_ids), strict=True):
        assert "cannot write" in message, name
        assert "without '..'" in message or "symbolic links are not followed" in message, message
    assert sorted(p.name for p in outside.iterdir()) == ["secret.log"]
    assert (outside / "secret.log").read_text() == "ERROR password=hunter2\n"
    assert not Path(f"/tmp/{escape}.npz").exists()
    assert not (models_root(stack).parent / f"{escape}.npz").exists()
    assert [p.name for p in (models_root(stack) / model_dir).iterdir()] == ["linked"]


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
def log_dir(stack: Stack) -> tuple[str, list[dict[str, Any]]]:
    """300k lines in three files (nested) inside the files root, a decoy with another extension,
    and the matches that a plain line-by-line search finds, in scan order (files sorted by
    directory walk). The directory is given as callers name it: relative to the root."""
    root = files_root(stack) / unique("logs")
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
    return inside(stack, root), expected


def test_search_logs_finds_exactly_the_matches_of_every_matching_file(
    client: Client, log_dir: tuple[str, list[dict[str, Any]]]
) -> None:
    root, expected = log_dir
    task_id = client.start("search_logs", {"directory": root, "pattern": PATTERN, "max_matches": 5000})
    done = client.wait_status(task_id, timeout=60)
    result = structured(done)
    assert result["files"] == result["files_scanned"] == 3
    assert result["lines_scanned"] == sum(LOG_FILES.values())
    assert result["match_count"] == len(expected) > 250
    assert result["stopped_early"] is False and result["matches_truncated"] is True
    assert "statusMessage" not in done  # finished: its last progress text is gone
    # More than fit inline: the first 20 in the result, every match in the linked NDJSON file.
    assert result["matches"] == expected[:20]
    [link] = [block for block in done["result"]["content"] if block["type"] == "resource_link"]
    assert link["name"] == "matches.ndjson" and link["mimeType"] == "application/x-ndjson"
    assert result["matches_file"]["uri"] == link["uri"] and result["matches_file"]["complete"] is True
    data = read_artifact(client, link["uri"])
    assert len(data) == link["size"]
    assert [json.loads(line) for line in data.decode().splitlines()] == expected


def test_search_logs_asks_whether_to_continue_after_max_matches_and_stops_with_partial_results(
    client: Client, log_dir: tuple[str, list[dict[str, Any]]]
) -> None:
    root, expected = log_dir
    created = call(
        client,
        "search_logs",
        {"directory": root, "pattern": PATTERN, "max_matches": 100},
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
    client: Client, log_dir: tuple[str, list[dict[str, Any]]]
) -> None:
    root, expected = log_dir
    task_id = client.start("search_logs", {"directory": root, "pattern": PATTERN, "max_matches": 50})
    result = structured(client.wait_status(task_id))
    assert result["stopped_early"] is True and result["match_count"] == 50
    assert result["matches"] == expected[:50]
    assert result["stop_reason"] == "reached 50 matches; the client cannot be asked to continue"


def test_search_logs_reports_a_bad_pattern_as_a_tool_error(client: Client, stack: Stack, files: Path) -> None:
    task_id = client.start("search_logs", {"directory": inside(stack, files), "pattern": "(unclosed"})
    assert "invalid regular expression" in tool_error(client.wait_status(task_id))


def _open_in_worker(stack: Stack, path: Path) -> bool:
    """Whether a process of the stack's worker (the main one or a pool child) has ``path`` open."""
    main = psutil.Process(stack.worker.popen.pid)
    return any(
        f.path == str(path) for proc in [main, *main.children(recursive=True)] for f in proc.open_files()
    )


def test_cancelling_search_logs_mid_scan_stops_reading(client: Client, stack: Stack, files: Path) -> None:
    # Ten million lines that all match: each match costs a step in Python, so the scan is still
    # reading long after its first progress report, when the cancel arrives.
    log = files / "big.log"
    log.write_bytes(b"x\n" * 10_000_000)
    arguments = {"directory": inside(stack, files), "pattern": "x", "max_matches": 10**9}
    task_id = client.start("search_logs", arguments)
    wait_until(
        lambda: re.match(r"[1-9]\d* lines scanned", client.get(task_id).result.get("statusMessage", "")),
        30,
        what="the scan to be under way",
    )
    assert _open_in_worker(stack, log)
    client.cancel(task_id)
    assert client.get(task_id).result["status"] == "cancelled"
    row = wait_worker_stopped(stack, task_id)
    assert row["status"] == "cancelled" and row["result"] is None
    wait_until(lambda: not _open_in_worker(stack, log), 10, what="the worker to close the log")


def test_search_logs_refuses_every_directory_outside_the_root(
    client: Client, stack: Stack, files: Path, outside: Path
) -> None:
    (files / "outside-dir").symlink_to(outside)
    attacks = ["/etc", "/proc/self", "/dev", "/", "..", f"{inside(stack, files)}/outside-dir", str(outside)]
    task_ids = [
        client.start("search_logs", {"directory": d, "pattern": "ERROR", "glob": "*"}) for d in attacks
    ]
    for directory, message in zip(attacks, refusals(client, task_ids), strict=True):
        assert f"outside the allowed directory {files_root(stack)} (MCP_EXAMPLES_FILES_ROOT)" in message, (
            directory
        )


def test_search_logs_skips_symlinks_that_lead_out_and_never_shows_what_they_hold(
    client: Client, stack: Stack, files: Path, outside: Path
) -> None:
    (files / "app.log").write_text("ERROR disk full\n")
    (files / "innocent.log").symlink_to(outside / "secret.log")
    (files / "outside-dir").symlink_to(outside)
    (files / "environ.log").symlink_to("/proc/self/environ")
    os.mkfifo(files / "pipe.log")  # no writer: a blocking open would hang the job
    task_id = client.start("search_logs", {"directory": inside(stack, files), "pattern": "ERROR|PATH|MCP"})
    result = structured(client.wait_status(task_id))
    assert [(m["file"], m["text"]) for m in result["matches"]] == [("app.log", "ERROR disk full")]
    assert result["files"] == 2 and result["files_scanned"] == 1
    assert len(result["unreadable_files"]) == 1 and "named pipe" in result["unreadable_files"][0]
    assert "hunter2" not in str(result)


def test_search_logs_runs_a_backtracking_pattern_in_linear_time_and_refuses_lookaround(
    client: Client, stack: Stack, files: Path
) -> None:
    (files / "long.log").write_text("a" * 100_000 + "\n")
    task_id = client.start("search_logs", {"directory": inside(stack, files), "pattern": "(.+)+X"})
    result = structured(client.wait_status(task_id, timeout=10))
    assert result["match_count"] == 0 and result["lines_scanned"] == 1
    row = stack.row(task_id)
    assert (row["finished_at"] - row["started_at"]).total_seconds() < 2  # Python's re: forever

    task_id = client.start("search_logs", {"directory": inside(stack, files), "pattern": "(?<=a)b"})
    assert "lookaround" in tool_error(client.wait_status(task_id))


# ---- summarize_file (sampling) ---------------------------------------------------------------------


def test_summarize_file_asks_the_clients_model_and_returns_its_summary(
    client: Client, stack: Stack, files: Path
) -> None:
    document = files / "release-notes.txt"
    document.write_text("Version 2.0 adds tasks.\nWorkers run on Celery.\nTasks live in Postgres.\n")
    arguments = {"path": inside(stack, document), "max_tokens": 50}
    created = call(client, "summarize_file", arguments, _meta=meta(sampling={}))
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
    client: Client, stack: Stack, files: Path
) -> None:
    document = files / "doc.txt"
    document.write_text("something to summarize")
    task_id = client.start("summarize_file", {"path": inside(stack, document)})
    assert "'sampling' capability" in tool_error(client.wait_status(task_id))


def test_summarize_file_refuses_every_path_outside_the_root_before_asking_anything(
    client: Client, stack: Stack, files: Path, outside: Path
) -> None:
    attacks = file_attacks(stack, files, outside)
    task_ids = [
        call(client, "summarize_file", {"path": path}, _meta=meta(sampling={}))["taskId"] for path in attacks
    ]
    for path, message in zip(attacks, refusals(client, task_ids), strict=True):
        assert f"outside the allowed directory {files_root(stack)} (MCP_EXAMPLES_FILES_ROOT)" in message, path
        assert "hunter2" not in message


# ---- count_words (the README's example) ------------------------------------------------------------


def test_count_words_counts_files_named_inside_the_root(client: Client, stack: Stack, files: Path) -> None:
    (files / "doc.txt").write_text("one two three\nfour")
    path = inside(stack, files / "doc.txt")
    url = f"file://{files}/doc.txt"
    result = structured(client.wait_status(client.start("count_words", {"paths": [path, url]})))
    assert result == {path: 4, url: 4}


def test_count_words_refuses_every_path_outside_the_root(
    client: Client, stack: Stack, files: Path, outside: Path
) -> None:
    attacks = file_attacks(stack, files, outside)
    task_ids = [client.start("count_words", {"paths": [path]}) for path in attacks]
    for path, message in zip(attacks, refusals(client, task_ids), strict=True):
        assert f"outside the allowed directory {files_root(stack)} (MCP_EXAMPLES_FILES_ROOT)" in message, path
