"""The example tools run by ``run_tool`` (no services): what they read and write, and every attack on
their path arguments refused with a message, before anything is read or written.

The end-to-end versions, through the API and a real worker, are in tests/e2e/test_example_tools.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcp_celery_tasks.testing import ToolRun, run_tool
from mcp_celery_tasks.tools.registry import get_tool
from workers.example import count_words
from workers.model_files import principal_folder
from workers.search_logs import search_logs
from workers.summarize import summarize_file
from workers.train_model import _ask_overwrite, train_model


@dataclass
class Dirs:
    files: Path
    models: Path
    outside: Path


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dirs:
    """The two roots (set in the environment, as ``dev`` does) and a directory outside both."""
    found = Dirs(tmp_path / "files", tmp_path / "models", tmp_path / "outside")
    (found.files / "logs").mkdir(parents=True)
    found.outside.mkdir()
    (found.files / "notes.txt").write_text("four words in here\n")
    (found.files / "logs" / "app.log").write_text("INFO up\nERROR disk full\n")
    (found.outside / "secret.txt").write_text("ERROR password=hunter2\n")
    (found.files / "linked-out.txt").symlink_to(found.outside / "secret.txt")
    (found.files / "outside-dir").symlink_to(found.outside)
    monkeypatch.setenv("MCP_EXAMPLES_FILES_ROOT", str(found.files))
    monkeypatch.setenv("MCP_EXAMPLES_MODELS_DIR", str(found.models))
    return found


def attacks(dirs: Dirs) -> list[str]:
    """Paths a hostile caller sends to a tool that reads one file."""
    return [
        "/etc/passwd",
        "../outside/secret.txt",
        "linked-out.txt",
        "outside-dir/secret.txt",
        "/proc/self/environ",
        "/dev/zero",
        "file:///etc/shadow",
        str(dirs.outside / "secret.txt"),
    ]


def called(tool: Callable[..., Any], preflight: dict[str, Any] | None = None, **arguments: Any) -> ToolRun:
    """The tool run as a worker runs it, for a client that declares no input kind."""
    return run_tool(tool, arguments, capabilities={}, preflight=preflight)


def result(tool: Callable[..., Any], preflight: dict[str, Any] | None = None, **arguments: Any) -> Any:
    run = called(tool, preflight, **arguments)
    assert not run.is_error and run.status == "completed", run.result
    return run.structured


def refused(tool: Callable[..., Any], preflight: dict[str, Any] | None = None, **arguments: Any) -> str:
    """The tool error a call ends in (found well within two seconds: /dev/zero is never read)."""
    started = time.monotonic()
    run = called(tool, preflight, **arguments)
    assert time.monotonic() - started < 2
    assert run.is_error, run.result
    return run.text


# ---- count_words ---------------------------------------------------------------------------------


def test_count_words_reads_relative_paths_and_file_urls_inside_the_root(dirs: Dirs) -> None:
    url = f"file://{dirs.files}/notes.txt"
    assert result(count_words, paths=["notes.txt", url]) == {"notes.txt": 4, url: 4}


def test_count_words_refuses_every_path_outside_the_root(dirs: Dirs) -> None:
    for path in attacks(dirs):
        message = refused(count_words, paths=["notes.txt", path])
        assert f"outside the allowed directory {dirs.files} (MCP_EXAMPLES_FILES_ROOT)" in message, path


def test_an_example_without_its_root_names_the_variable_to_set(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MCP_EXAMPLES_FILES_ROOT")
    assert "MCP_EXAMPLES_FILES_ROOT" in refused(count_words, paths=["notes.txt"])
    monkeypatch.delenv("MCP_EXAMPLES_MODELS_DIR")
    assert "MCP_EXAMPLES_MODELS_DIR" in refused(train_model, model="m", epochs=1, samples=10)


# ---- summarize_file ------------------------------------------------------------------------------


def test_summarize_file_refuses_every_path_outside_the_root(dirs: Dirs) -> None:
    for path in attacks(dirs):
        assert "outside the allowed directory" in refused(summarize_file, path=path), path


def test_summarize_file_reads_a_file_in_the_root_then_needs_sampling(dirs: Dirs) -> None:
    # The file was read (not refused): the next step asks the client's model, and this client
    # declared no sampling.
    assert "'sampling' capability" in refused(summarize_file, path="notes.txt")


# ---- search_logs ---------------------------------------------------------------------------------


def test_search_logs_searches_inside_the_root_and_never_through_a_symlink_out(dirs: Dirs) -> None:
    found = result(search_logs, directory=".", pattern="ERROR", glob="*")
    assert [(m["file"], m["text"]) for m in found["matches"]] == [("logs/app.log", "ERROR disk full")]
    assert "hunter2" not in str(found)


@pytest.mark.parametrize("directory", ["/etc", "..", "../outside", "outside-dir", "/proc/self", "/"])
def test_search_logs_refuses_a_directory_outside_the_root(dirs: Dirs, directory: str) -> None:
    assert "outside the allowed directory" in refused(search_logs, directory=directory, pattern="root")


def test_search_logs_with_a_backtracking_pattern_on_a_100kb_line_returns_within_a_second(dirs: Dirs) -> None:
    (dirs.files / "logs" / "long.log").write_text("a" * 100_000 + "\n")
    started = time.monotonic()
    found = result(search_logs, directory="logs", pattern="(.+)+X")
    assert time.monotonic() - started < 1
    assert found["match_count"] == 0 and found["lines_scanned"] == 3


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?<=ERROR )disk", r"ERROR(?! disk)"])
def test_search_logs_refuses_what_re2_cannot_run_and_says_why(dirs: Dirs, pattern: str) -> None:
    assert "backreferences (\\1) and lookaround" in refused(search_logs, directory="logs", pattern=pattern)


# ---- train_model ---------------------------------------------------------------------------------


def mine(dirs: Dirs, principal: str = "anon") -> Path:
    """The models folder of ``principal`` (``run_tool`` calls as ``anon``)."""
    return dirs.models / principal_folder(principal)


def test_train_model_writes_the_named_model_under_the_callers_models_folder(dirs: Dirs) -> None:
    trained = result(train_model, model="runs/moons", epochs=2, samples=50)
    assert trained["model"] == "runs/moons.npz"
    assert trained["model_path"] == str(mine(dirs) / "runs" / "moons.npz")
    with np.load(mine(dirs) / "runs" / "moons.npz") as weights:
        assert sorted(weights.files) == ["b1", "b2", "w1", "w2"]
    assert os.listdir(mine(dirs) / "runs") == ["moons.npz"]


def test_principals_never_share_a_models_folder() -> None:
    folders = {
        principal_folder(p) for p in ("anon", "token:a/b", "token:a_b", "jwt:https://x#1", "jwt:https://x#2")
    }
    assert len(folders) == 5
    assert all("/" not in f and f not in (".", "..") and not f.startswith(".") for f in folders)


def test_one_principal_cannot_replace_or_reach_anothers_model(dirs: Dirs) -> None:
    bob = mine(dirs, "token:bob")
    bob.mkdir(parents=True)
    (bob / "m.npz").write_bytes(b"bob's model")
    # Alice's "m" is her own file: no question about bob's, and bob's stays.
    alice = run_tool(
        train_model, {"model": "m", "epochs": 1, "samples": 10}, capabilities={}, principal="token:alice"
    )
    assert not alice.is_error and alice.structured["model_path"] == str(mine(dirs, "token:alice") / "m.npz")
    for reach in (f"../{bob.name}/m", str(bob / "m.npz")):
        run = run_tool(
            train_model,
            {"model": reach, "epochs": 1, "samples": 10},
            capabilities={},
            preflight={"overwrite": {"action": "accept", "content": {}}},
            principal="token:alice",
        )
        assert run.is_error and "cannot write" in str(run.result), run.result
    assert (bob / "m.npz").read_bytes() == b"bob's model"
    assert _ask_overwrite({"model": "m"}, "token:bob") is not None  # bob is asked about his own


def test_train_model_refuses_work_above_its_bound_before_training(dirs: Dirs) -> None:
    run = called(train_model, model="big", epochs=1_000_000, samples=1_000_000)
    assert run.is_error and run.reports == [] and "more than one call may train" in str(run.result)
    spec = get_tool("train_model")
    assert spec is not None and spec.time_limit == 15 * 60


@pytest.mark.parametrize("model", ["/tmp/escape", "../escape", "runs/../../escape", "", "linked/escape"])
def test_train_model_refuses_names_outside_the_models_directory_before_training(
    dirs: Dirs, model: str
) -> None:
    mine(dirs).mkdir(parents=True)
    (mine(dirs) / "linked").symlink_to(dirs.outside)
    run = called(train_model, model=model, epochs=3, samples=50)
    assert run.is_error and run.reports == []  # no epoch ran
    assert sorted(os.listdir(dirs.outside)) == ["secret.txt"]
    assert not Path("/tmp/escape.npz").exists() and not (dirs.models.parent / "escape.npz").exists()


def test_train_model_replaces_an_existing_model_only_with_consent_and_a_decline_keeps_it(dirs: Dirs) -> None:
    mine(dirs).mkdir(parents=True)
    (mine(dirs) / "m.npz").write_bytes(b"previous model")
    # Without an answer to its ask_first question (the file appeared after the call was checked):
    assert "nobody agreed" in refused(train_model, {}, model="m", epochs=1, samples=10)
    for answer in (
        {"action": "decline"},
        {"action": "cancel"},
        {"action": "accept", "content": {"overwrite": False}},
    ):
        kept = result(train_model, {"overwrite": answer}, model="m", epochs=1, samples=10)
        assert kept["kept_existing"] is True and "kept the existing model m.npz" in kept["message"]
        assert (mine(dirs) / "m.npz").read_bytes() == b"previous model"
    # accepting is the consent
    result(train_model, {"overwrite": {"action": "accept", "content": {}}}, model="m", epochs=1, samples=10)
    with np.load(mine(dirs) / "m.npz") as weights:
        assert "w1" in weights.files


def test_the_overwrite_question_uses_the_workers_resolution(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine(dirs).mkdir(parents=True)
    (mine(dirs) / "m.npz").write_bytes(b"previous model")
    question = _ask_overwrite({"model": "m"})
    assert question is not None and question.message.startswith("m.npz already exists")
    assert _ask_overwrite({"model": "m.npz"}) is not None
    assert _ask_overwrite({"model": "other"}) is None
    assert _ask_overwrite({"model": str(dirs.outside / "secret.txt")}) is None  # refused by the worker
    monkeypatch.delenv("MCP_EXAMPLES_MODELS_DIR")
    assert _ask_overwrite({"model": "m"}) is None  # nothing asked: the worker refuses the call


def test_summarize_file_asks_the_clients_model_for_the_summary(dirs: Dirs) -> None:
    def model(params: dict[str, Any] | None) -> dict[str, Any]:
        prompt = (params or {})["messages"][0]["content"]["text"]
        words = len(prompt.split("\n\n", 1)[1].split())
        return {"role": "assistant", "content": {"type": "text", "text": f"{words} words"}, "model": "stub"}

    run = run_tool(summarize_file, {"path": "notes.txt"}, answers={"summary": model})
    assert run.structured is not None and run.structured["summary"] == "4 words"
    assert run.structured["model"] == "stub" and run.structured["input_truncated"] is False
    (request,) = run.requests
    assert request.method == "sampling/createMessage" and request.params is not None
    assert request.params["maxTokens"] == 200
    # It suspends at the question (suspend_after=0) and runs again from the top once answered:
    # the file is read twice, the model asked once.
    assert [report.message for report in run.reports] == [
        "reading notes.txt",
        "asking the client's model to summarize 19 characters",
    ] * 2
