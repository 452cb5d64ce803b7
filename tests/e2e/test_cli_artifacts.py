"""``mcp-celery-tasks call --save-artifacts DIR`` against a real stack (API, prefork worker,
Postgres): every linked artifact is read with ``resources/read`` and written into DIR, byte for
byte; what a hostile server names a link never writes outside DIR, never through a symlink, and
never replaces a file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_celery_tasks.client.saving import MAX_READ_BYTES
from tests import support
from tests.support import ROOT, Stack

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.artifacts"]'


@pytest.fixture(scope="module")
def cli_stack(template_db: str) -> Iterator[Stack]:
    with support.stack_of_its_own("cliart", template_db, TOOLS) as stack:
        yield stack


def call(stack: Stack, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "call", "--url", stack.url, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.timeout(120)
def test_save_artifacts_writes_each_linked_artifact_byte_for_byte_and_names_its_size(
    cli_stack: Stack, tmp_path: Path
) -> None:
    out = tmp_path / "saved" / "here"  # created, parents too
    size = 3 * 1024 * 1024 + 7
    ran = call(cli_stack, tmp_path, "publish_blob", "--arg", f"size={size}", "--arg", "name=weights.bin",
               "--save-artifacts", str(out))  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    digest = ran.stdout.strip().splitlines()[-1]
    assert "[link] weights.bin (3.0 MiB) mcp-tasks://artifacts/" in ran.stdout
    assert f"saved weights.bin (3.0 MiB) to {out / 'weights.bin'}" in ran.stderr
    saved = files(out)
    assert list(saved) == ["weights.bin"] and len(saved["weights.bin"]) == size
    assert hashlib.sha256(saved["weights.bin"]).hexdigest() == digest


@pytest.mark.timeout(120)
def test_save_artifacts_keeps_every_hostile_name_inside_dir_and_replaces_nothing(
    cli_stack: Stack, tmp_path: Path
) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "x").write_text("precious")
    (out / "notes.txt").write_text("mine")  # already there: kept
    (out / "linked").symlink_to(outside / "x")  # a symlink in DIR: never written through
    names = ["../../outside/x", str(outside / "x"), "linked", ".bashrc", "..", "notes.txt", "a\x1b[2J\u202eb"]
    arguments = ["--arg", "text=hello", "--arg", f"link_names={json.dumps(names)}"]
    ran = call(cli_stack, tmp_path, "publish_linked_as", *arguments, "--save-artifacts", str(out), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"  # stdout stays the task's JSON
    assert (outside / "x").read_text() == "precious" and files(outside) == {"x": b"precious"}
    assert (out / "linked").is_symlink() and (out / "notes.txt").read_text() == "mine"
    saved = {name: data for name, data in files(out).items() if name not in ("linked", "notes.txt")}
    assert saved == dict.fromkeys(["x", "x-1", "linked-1", "bashrc", "notes-1.txt", "notes-2.txt", "a__2J_b"],
                                  b"hello")  # fmt: skip
    assert ran.stderr.count("saved ") == len(names)
    assert not any(control in ran.stderr for control in ("\x1b", "\u202e")), repr(ran.stderr)


@pytest.mark.timeout(120)
def test_a_link_whose_size_is_not_its_bytes_fails_the_call_and_leaves_no_file(
    cli_stack: Stack, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    arguments = ["--arg", "text=hello", "--arg", 'link_names=["a.txt"]', "--arg", "link_size=3"]
    ran = call(cli_stack, tmp_path, "publish_linked_as", *arguments, "--save-artifacts", str(out))
    assert ran.returncode == 1, ran.stderr
    assert "read 5 bytes, not the 3 the link's size says" in ran.stderr
    assert ran.stderr.strip().splitlines()[-1].startswith("completed in ")
    assert ran.stderr.strip().endswith(", not every artifact saved")
    assert list(out.iterdir()) == []


@pytest.mark.timeout(300)
def test_an_artifact_larger_than_one_read_is_saved_whole_from_ranged_reads(
    cli_stack: Stack, tmp_path: Path
) -> None:
    client = cli_stack.client()
    try:
        templates = client.request("resources/templates/list", {}).result["resourceTemplates"]
    finally:
        client.close()
    if not any(str(t["uriTemplate"]).startswith("mcp-tasks://artifacts/") for t in templates):
        pytest.skip("this server reads no byte ranges of an artifact (no mcp-tasks://artifacts/ template)")
    size = MAX_READ_BYTES * 2 + 12_345  # three 8 MiB parts and a short last one
    ran = call(cli_stack, tmp_path, "publish_blob", "--arg", f"size={size}", "--arg", "name=big.bin",
               "--save-artifacts", str(tmp_path / "out"), "--timeout", "120")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    digest = ran.stdout.strip().splitlines()[-1]
    saved = (tmp_path / "out" / "big.bin").read_bytes()
    assert len(saved) == size and hashlib.sha256(saved).hexdigest() == digest


def test_save_artifacts_refuses_a_file_as_dir_before_calling(cli_stack: Stack, tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("")
    ran = call(cli_stack, tmp_path, "publish_text", "--arg", "text=x", "--save-artifacts", str(target))
    assert ran.returncode == 2 and "not a directory" in ran.stderr, ran.stderr
