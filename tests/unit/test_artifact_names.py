"""``ctx.artifact``'s input checks (``tools.artifacts``): names are one plain URI segment, mime
types read ``type/subtype``, and data is bytes, text or a binary file object, never a path."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_celery_tasks import TaskContext, ToolError
from mcp_celery_tasks.json_types import as_array, as_object
from mcp_celery_tasks.testing import run_tool
from mcp_celery_tasks.tools.artifacts import (
    MAX_ARTIFACT_NAME_CHARS,
    artifact_chunks,
    checked_artifact_name,
    checked_mime_type,
)
from tests.fixtures.artifacts import publish_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "non-empty"),
        ("a/b.txt", "path separator"),
        ("a\\b.txt", "path separator"),
        ("..", "'..'"),
        ("x..y", "'..'"),
        ("line\nbreak", "control character"),
        ("nul\x00", "control character"),
        ("del\x7f", "control character"),
        ("report.txt?offset=0", "'?' or '#'"),  # would read as a ranged uri
        ("a#b", "'?' or '#'"),
        ("x" * (MAX_ARTIFACT_NAME_CHARS + 1), f"at most {MAX_ARTIFACT_NAME_CHARS}"),
    ],
)
def test_bad_artifact_names_are_refused_with_the_reason(name: str, says: str) -> None:
    with pytest.raises(ToolError, match=says):
        checked_artifact_name(name)


@pytest.mark.parametrize("name", ["weights.bin", "matches.ndjson", "plot 1.png", "é.txt", "x" * 200])
def test_plain_file_names_are_accepted(name: str) -> None:
    assert checked_artifact_name(name) == name


def test_a_name_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ToolError):
        checked_artifact_name(42)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a.csv", "text/csv"), ("a.json", "application/json"), ("a.png", "image/png"),
     ("a.unknownext", "application/octet-stream"), ("noext", "application/octet-stream")],
)  # fmt: skip
def test_a_missing_mime_type_is_guessed_from_the_name(name: str, expected: str) -> None:
    assert checked_mime_type(None, name) == expected


@pytest.mark.parametrize("mime", ["text/csv", "application/x-ndjson", "text/plain; charset=utf-8"])
def test_well_formed_mime_types_are_kept(mime: str) -> None:
    assert checked_mime_type(mime, "x") == mime


@pytest.mark.parametrize(
    "mime", ["", "text", "text/", "/csv", "text/csv/x", "text csv", "te\nxt/csv", "a/b;"]
)
def test_malformed_mime_types_are_refused(mime: str) -> None:
    with pytest.raises(ToolError, match="type/subtype"):
        checked_mime_type(mime, "x")


def test_bytes_text_and_files_are_cut_into_chunks() -> None:
    assert list(artifact_chunks(b"abcdefg", 3)) == [b"abc", b"def", b"g"]
    assert list(artifact_chunks("héllo", 4)) == [b"h\xc3\xa9l", b"lo"]
    assert list(artifact_chunks(io.BytesIO(b"abcdef"), 4)) == [b"abcd", b"ef"]
    assert list(artifact_chunks(b"")) == []


def test_a_path_is_refused_in_favour_of_a_file_root(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ToolError, match="FileRoot"):
        list(artifact_chunks(tmp_path / "f"))  # type: ignore[arg-type]


def test_a_text_mode_file_is_refused() -> None:
    with pytest.raises(ToolError, match="binary mode"):
        list(artifact_chunks(io.StringIO("text")))  # type: ignore[arg-type]


def test_a_context_without_a_task_refuses_artifacts() -> None:
    ctx = TaskContext(task_id="t", job_id="j", tool_name="x", attempt=1, preflight=None, runtime=None)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="artifacts need a task"):
        ctx.artifact("a.txt", "x")


def test_the_test_kit_runs_a_tool_that_publishes_an_artifact() -> None:
    run = run_tool(publish_text, {"text": "hi", "name": "n.txt"})
    assert run.result is not None
    (link,) = [as_object(block) for block in as_array(run.result["content"])]
    assert link["type"] == "resource_link" and link["name"] == "n.txt" and link["size"] == 2
    uri = str(link["uri"])
    assert uri.startswith("mcp-tasks://artifacts/") and uri.endswith("/n.txt")
    assert link["mimeType"] == "text/plain"


def test_the_readme_artifact_example_publishes_its_csv(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith("# myproject/report.py")]
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import report; "
        "from mcp_celery_tasks.testing import run_tool; "
        "print(json.dumps(run_tool(report.export_matches, {'pattern': 'oom'}).result))"
    )
    (tmp_path / "report.py").write_text(block)
    ran = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    text, link = json.loads(ran.stdout)["content"]
    assert text == {"type": "text", "text": "1 match"}
    assert (
        link["type"] == "resource_link" and link["name"] == "matches.csv" and link["mimeType"] == "text/csv"
    )
    assert link["size"] == len("pattern\noom\n")
