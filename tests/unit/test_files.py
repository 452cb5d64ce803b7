"""FileRoot: what a tool may read and write, and every way a caller's path tries to get out."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcp_celery_tasks import FileRoot, ToolError


@pytest.fixture
def root_dir(tmp_path: Path) -> Path:
    """``tmp_path/root`` holding ``notes.txt`` and ``logs/app.log``; ``tmp_path/secret.txt`` is outside."""
    root = tmp_path / "root"
    (root / "logs").mkdir(parents=True)
    (root / "notes.txt").write_text("inside the root\n")
    (root / "logs" / "app.log").write_text("line one\nline two\n")
    (tmp_path / "secret.txt").write_text("outside the root\n")
    return root


@pytest.fixture
def root(root_dir: Path) -> FileRoot:
    return FileRoot(root_dir, variable="FILES_ROOT")


def refusal(call: Callable[..., Any]) -> str:  # `...`: lambdas binding the loop variable as a default
    with pytest.raises(ToolError) as caught:
        call()
    return str(caught.value)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s outcome (value or exception), failing if it has not returned by then."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds}s"
    return outcome[0]


# ---- reading: what is allowed -----------------------------------------------------------------


def test_relative_absolute_and_file_url_paths_inside_the_root_are_read(
    root: FileRoot, root_dir: Path
) -> None:
    assert root.read_text("notes.txt") == "inside the root\n"
    assert root.read_text("logs/app.log") == "line one\nline two\n"
    assert root.read_text(str(root_dir / "notes.txt")) == "inside the root\n"
    assert root.read_text(f"file://{root_dir}/notes.txt") == "inside the root\n"
    assert root.read_text("logs/../notes.txt") == "inside the root\n"  # stays inside: fine


def test_a_symlink_inside_the_root_to_a_file_inside_is_followed(root: FileRoot, root_dir: Path) -> None:
    (root_dir / "latest.log").symlink_to(root_dir / "logs" / "app.log")
    assert root.read_text("latest.log") == "line one\nline two\n"


def test_every_listed_directory_is_allowed_and_relative_paths_use_the_first(
    tmp_path: Path, root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("second root\n")
    monkeypatch.setenv("FILES_ROOT", f"{root_dir}{os.pathsep}{other}")
    both = FileRoot.from_env("FILES_ROOT")
    assert both is not None
    assert both.read_text("notes.txt") == "inside the root\n"
    assert both.read_text(str(other / "notes.txt")) == "second root\n"


# ---- reading: refusals ------------------------------------------------------------------------


def test_an_absolute_path_outside_is_refused_naming_the_allowed_directory(
    root: FileRoot, root_dir: Path
) -> None:
    message = refusal(lambda: root.read_text("/etc/passwd"))
    assert "outside the allowed directory" in message and str(root_dir) in message and "FILES_ROOT" in message


def test_an_existing_file_outside_is_refused_like_a_missing_one(root: FileRoot, tmp_path: Path) -> None:
    existing = refusal(lambda: root.read_text(str(tmp_path / "secret.txt")))
    missing = refusal(lambda: root.read_text(str(tmp_path / "no-such.txt")))
    assert existing.replace("secret", "no-such") == missing  # no oracle on what exists outside


@pytest.mark.parametrize("path", ["../secret.txt", "logs/../../secret.txt", "file:///etc/passwd"])
def test_dotdot_and_file_urls_cannot_escape(root: FileRoot, path: str) -> None:
    assert "outside the allowed directory" in refusal(lambda: root.read_text(path))


def test_a_symlink_pointing_out_is_refused(root: FileRoot, root_dir: Path, tmp_path: Path) -> None:
    (root_dir / "innocent.txt").symlink_to(tmp_path / "secret.txt")
    (root_dir / "etc").symlink_to("/etc")
    assert "outside" in refusal(lambda: root.read_text("innocent.txt"))
    assert "outside" in refusal(lambda: root.read_text("etc/passwd"))


def test_proc_self_environ_is_refused_directly_and_through_a_symlink(root: FileRoot, root_dir: Path) -> None:
    (root_dir / "env").symlink_to("/proc/self/environ")
    assert "outside" in refusal(lambda: root.read_bytes("/proc/self/environ"))
    assert "outside" in refusal(lambda: root.read_bytes("env"))


def test_dev_zero_is_refused_before_anything_is_read(root: FileRoot, root_dir: Path) -> None:
    (root_dir / "zero").symlink_to("/dev/zero")
    assert "outside" in refusal(lambda: root.read_bytes("/dev/zero"))
    assert "outside" in refusal(lambda: root.read_bytes("zero"))
    # A root that holds devices still reads none: the type is checked before the open.
    outcome = within(5, lambda: FileRoot("/dev").read_bytes("zero"))
    assert isinstance(outcome, ToolError) and "is a character device, not a regular file" in str(outcome)


def test_a_fifo_is_refused_without_blocking(root: FileRoot, root_dir: Path) -> None:
    os.mkfifo(root_dir / "pipe.log")  # no writer: a blocking open would never return
    outcome = within(5, lambda: root.read_bytes("pipe.log"))
    assert isinstance(outcome, ToolError) and "named pipe" in str(outcome)


def test_a_directory_where_a_file_is_expected_and_a_missing_file_are_refused(root: FileRoot) -> None:
    assert "is a directory, not a regular file" in refusal(lambda: root.read_text("logs"))
    assert "No such file" in refusal(lambda: root.read_text("missing.txt"))


@pytest.mark.parametrize("path", ["https://example.com/x", "file://otherhost/etc/passwd", "", "a\0b"])
def test_urls_other_than_local_files_and_invalid_paths_are_refused(root: FileRoot, path: str) -> None:
    refusal(lambda: root.read_text(path))


def test_a_directory_swapped_for_a_symlink_after_the_check_is_caught_on_the_opened_file(
    root_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.log").write_text("outside the root\n")

    class Raced(FileRoot):
        def resolve(self, path: str) -> Path:
            checked = super().resolve(path)
            # What an attacker with write access to the root does between the check and the open.
            (root_dir / "logs").rename(root_dir / "logs.old")
            (root_dir / "logs").symlink_to(outside)
            return checked

    message = refusal(lambda: Raced(root_dir).read_text("logs/app.log"))
    assert "outside the allowed directory" in message and "changed while being opened" in message


def test_byte_cap_refuses_a_larger_file_and_read_prefix_says_it_was_cut(
    root: FileRoot, root_dir: Path
) -> None:
    (root_dir / "big.txt").write_bytes(b"x" * 1001)
    assert "larger than the 1000-byte limit" in refusal(lambda: root.read_bytes("big.txt", 1000))
    assert root.read_bytes("big.txt", 1001) == b"x" * 1001
    assert root.read_prefix("big.txt", 10) == (b"x" * 10, True)
    assert root.read_prefix("big.txt", 2000) == (b"x" * 1001, False)
    small = FileRoot(root_dir, max_read_bytes=100)
    assert "100-byte limit" in refusal(lambda: small.read_text("big.txt"))


def test_line_cap_cuts_long_lines_and_keeps_the_following_ones(root_dir: Path) -> None:
    (root_dir / "long.log").write_bytes(b"short\r\n" + b"y" * 50 + b"\n" + b"z" * 8 + b"\nlast")
    lines = list(FileRoot(root_dir, max_line_bytes=8).iter_lines("long.log"))
    assert lines == ["short", "y" * 8, "z" * 8, "last"]


# ---- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize("directory", ["/", "/tmp/..", "relative/dir"])
def test_the_filesystem_root_and_relative_roots_are_refused(directory: str) -> None:
    refusal(lambda: FileRoot(directory))


def test_an_unset_variable_is_none_or_a_refusal_that_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_ROOT", raising=False)
    assert FileRoot.from_env("NO_SUCH_ROOT") is None
    assert "NO_SUCH_ROOT" in refusal(lambda: FileRoot.require_env("NO_SUCH_ROOT"))


# ---- writing ----------------------------------------------------------------------------------


def test_atomic_write_creates_directories_under_the_root_and_leaves_no_temp_file(
    root: FileRoot, root_dir: Path
) -> None:
    with root.atomic_write("models/v1/m.bin") as handle:
        handle.write(b"weights")
    assert (root_dir / "models" / "v1" / "m.bin").read_bytes() == b"weights"
    assert os.listdir(root_dir / "models" / "v1") == ["m.bin"]
    assert root.output_path("models/v1/m.bin") == root_dir / "models" / "v1" / "m.bin"


def test_an_existing_file_is_not_replaced_without_consent(root: FileRoot, root_dir: Path) -> None:
    message = refusal(lambda: root.atomic_write("notes.txt").__enter__())
    assert "already exists" in message
    assert (root_dir / "notes.txt").read_text() == "inside the root\n"
    with root.atomic_write("notes.txt", overwrite=True) as handle:
        handle.write(b"replaced")
    assert (root_dir / "notes.txt").read_bytes() == b"replaced"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp_file(root: FileRoot, root_dir: Path) -> None:
    with pytest.raises(RuntimeError), root.atomic_write("notes.txt", overwrite=True) as handle:
        handle.write(b"half")
        raise RuntimeError("the writer failed")
    assert (root_dir / "notes.txt").read_text() == "inside the root\n"
    assert sorted(os.listdir(root_dir)) == ["logs", "notes.txt"]


def test_a_file_that_appears_during_the_write_is_left_alone(root: FileRoot, root_dir: Path) -> None:
    with (
        pytest.raises(ToolError, match="appeared while it was being written"),
        root.atomic_write("late.bin") as f,
    ):
        f.write(b"ours")
        (root_dir / "late.bin").write_bytes(b"theirs")
    assert (root_dir / "late.bin").read_bytes() == b"theirs"
    assert sorted(os.listdir(root_dir)) == ["late.bin", "logs", "notes.txt"]


@pytest.mark.parametrize("path", ["../escape.bin", "a/../../escape.bin", "/tmp/escape.bin", ".", "sub/.."])
def test_writes_outside_the_root_or_with_dotdot_are_refused(
    root: FileRoot, tmp_path: Path, path: str
) -> None:
    assert "relative to" in refusal(lambda: root.atomic_write(path).__enter__())
    assert not (tmp_path / "escape.bin").exists()


def test_writes_never_go_through_a_symlinked_directory(
    root: FileRoot, root_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root_dir / "models").symlink_to(outside)
    (root_dir / "inner").symlink_to(root_dir / "logs")  # even one that stays inside
    for path in ["models/m.bin", "inner/m.bin", "models/deeper/m.bin"]:
        assert "symbolic links are not followed" in refusal(lambda p=path: root.atomic_write(p).__enter__())
    assert list(outside.iterdir()) == [] and sorted(os.listdir(root_dir / "logs")) == ["app.log"]


def test_writes_never_go_through_a_symlinked_file(root: FileRoot, root_dir: Path, tmp_path: Path) -> None:
    (root_dir / "m.bin").symlink_to(tmp_path / "secret.txt")
    message = refusal(lambda: root.atomic_write("m.bin", overwrite=True).__enter__())
    assert "symbolic link" in message
    assert (tmp_path / "secret.txt").read_text() == "outside the root\n"
