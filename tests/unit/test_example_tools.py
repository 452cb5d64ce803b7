"""The example tools called directly (no worker): what they read and write, and every attack on
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

from mcp_celery_tasks import TaskContext, ToolError
from workers.example import count_words
from workers.search_logs import search_logs
from workers.summarize import summarize_file
from workers.train_model import _ask_overwrite, train_model


class Runtime:
    """Just enough of a worker for a context: statuses kept in a list, never cancelled."""

    def __init__(self) -> None:
        self.statuses: list[str] = []

    def report(self, message: str, progress: float | None = None, total: float | None = None) -> None:
        self.statuses.append(message)

    def log(self, level: str, logger: str | None, data: Any) -> None:
        raise AssertionError(f"unexpected log {level} {data!r}")

    def flush(self) -> None:
        pass

    @property
    def cancelled(self) -> bool:
        return False

    def check_soft_limit(self) -> None:
        pass

    def ask(self, requests: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        raise AssertionError(f"unexpected input request {requests}")


def context(preflight: dict[str, Any] | None = None) -> TaskContext:
    return TaskContext(
        task_id="t", job_id="j", tool_name="tool", attempt=1, preflight=preflight, runtime=Runtime()
    )


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


def refused(call: Callable[..., Any]) -> str:  # `...`: lambdas binding the loop variable as a default
    started = time.monotonic()
    with pytest.raises(ToolError) as caught:
        call()
    assert time.monotonic() - started < 2  # /dev/zero is never read
    return str(caught.value)


# ---- count_words ---------------------------------------------------------------------------------


def test_count_words_reads_relative_paths_and_file_urls_inside_the_root(dirs: Dirs) -> None:
    url = f"file://{dirs.files}/notes.txt"
    assert count_words(context(), ["notes.txt", url]) == {"notes.txt": 4, url: 4}


def test_count_words_refuses_every_path_outside_the_root(dirs: Dirs) -> None:
    for path in attacks(dirs):
        message = refused(lambda p=path: count_words(context(), ["notes.txt", p]))
        assert f"outside the allowed directory {dirs.files} (MCP_EXAMPLES_FILES_ROOT)" in message, path


def test_an_example_without_its_root_names_the_variable_to_set(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MCP_EXAMPLES_FILES_ROOT")
    assert "MCP_EXAMPLES_FILES_ROOT" in refused(lambda: count_words(context(), ["notes.txt"]))
    monkeypatch.delenv("MCP_EXAMPLES_MODELS_DIR")
    assert "MCP_EXAMPLES_MODELS_DIR" in refused(lambda: train_model(context(), "m", epochs=1, samples=10))


# ---- summarize_file ------------------------------------------------------------------------------


def test_summarize_file_refuses_every_path_outside_the_root(dirs: Dirs) -> None:
    for path in attacks(dirs):
        assert "outside the allowed directory" in refused(lambda p=path: summarize_file(context(), p)), path


def test_summarize_file_reads_a_file_in_the_root_then_needs_sampling(dirs: Dirs) -> None:
    # The file was read (not refused): the next step asks the client's model, which this
    # context cannot do.
    assert "'sampling' capability" in refused(lambda: summarize_file(context(), "notes.txt"))


# ---- search_logs ---------------------------------------------------------------------------------


def test_search_logs_searches_inside_the_root_and_never_through_a_symlink_out(dirs: Dirs) -> None:
    result = search_logs(context(), ".", "ERROR", glob="*")
    assert [(m["file"], m["text"]) for m in result["matches"]] == [("logs/app.log", "ERROR disk full")]
    assert "hunter2" not in str(result)


@pytest.mark.parametrize("directory", ["/etc", "..", "../outside", "outside-dir", "/proc/self", "/"])
def test_search_logs_refuses_a_directory_outside_the_root(dirs: Dirs, directory: str) -> None:
    assert "outside the allowed directory" in refused(lambda: search_logs(context(), directory, "root"))


def test_search_logs_with_a_backtracking_pattern_on_a_100kb_line_returns_within_a_second(dirs: Dirs) -> None:
    (dirs.files / "logs" / "long.log").write_text("a" * 100_000 + "\n")
    started = time.monotonic()
    result = search_logs(context(), "logs", "(.+)+X")
    assert time.monotonic() - started < 1
    assert result["match_count"] == 0 and result["lines_scanned"] == 3


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?<=ERROR )disk", r"ERROR(?! disk)"])
def test_search_logs_refuses_what_re2_cannot_run_and_says_why(dirs: Dirs, pattern: str) -> None:
    assert "backreferences (\\1) and lookaround" in refused(lambda: search_logs(context(), "logs", pattern))


# ---- train_model ---------------------------------------------------------------------------------


def test_train_model_writes_the_named_model_under_the_models_directory(dirs: Dirs) -> None:
    result = train_model(context(), "runs/moons", epochs=2, samples=50)
    assert result["model"] == "runs/moons.npz"
    assert result["model_path"] == str(dirs.models / "runs" / "moons.npz")
    with np.load(dirs.models / "runs" / "moons.npz") as weights:
        assert sorted(weights.files) == ["b1", "b2", "w1", "w2"]
    assert os.listdir(dirs.models / "runs") == ["moons.npz"]


@pytest.mark.parametrize("model", ["/tmp/escape", "../escape", "runs/../../escape", "", "linked/escape"])
def test_train_model_refuses_names_outside_the_models_directory_before_training(
    dirs: Dirs, model: str
) -> None:
    dirs.models.mkdir()
    (dirs.models / "linked").symlink_to(dirs.outside)
    runtime = Runtime()
    ctx = TaskContext(
        task_id="t", job_id="j", tool_name="train_model", attempt=1, preflight=None, runtime=runtime
    )
    refused(lambda: train_model(ctx, model, epochs=3, samples=50))
    assert runtime.statuses == []  # no epoch ran
    assert sorted(os.listdir(dirs.outside)) == ["secret.txt"]
    assert not Path("/tmp/escape.npz").exists() and not (dirs.models.parent / "escape.npz").exists()


def test_train_model_replaces_an_existing_model_only_with_consent_and_a_decline_keeps_it(dirs: Dirs) -> None:
    dirs.models.mkdir()
    (dirs.models / "m.npz").write_bytes(b"previous model")
    assert "nobody agreed" in refused(lambda: train_model(context(), "m", epochs=1, samples=10))
    for answer in (
        {"action": "decline"},
        {"action": "cancel"},
        {"action": "accept", "content": {"overwrite": False}},
    ):
        kept = train_model(context({"overwrite": answer}), "m", epochs=1, samples=10)
        assert kept["kept_existing"] is True and "kept the existing model m.npz" in kept["message"]
        assert (dirs.models / "m.npz").read_bytes() == b"previous model"
    agreed = context({"overwrite": {"action": "accept", "content": {}}})  # accepting is the consent
    train_model(agreed, "m", epochs=1, samples=10)
    with np.load(dirs.models / "m.npz") as weights:
        assert "w1" in weights.files


def test_the_overwrite_question_uses_the_workers_resolution(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs.models.mkdir()
    (dirs.models / "m.npz").write_bytes(b"previous model")
    question = _ask_overwrite({"model": "m"})
    assert question is not None and question.message.startswith("m.npz already exists")
    assert _ask_overwrite({"model": "m.npz"}) is not None
    assert _ask_overwrite({"model": "other"}) is None
    assert _ask_overwrite({"model": str(dirs.outside / "secret.txt")}) is None  # refused by the worker
    monkeypatch.delenv("MCP_EXAMPLES_MODELS_DIR")
    assert _ask_overwrite({"model": "m"}) is None  # nothing asked: the worker refuses the call
