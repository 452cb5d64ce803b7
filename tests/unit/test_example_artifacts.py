"""The examples' artifacts, run by ``run_tool`` (no services): ``search_logs`` keeps a small result
inline and links every match as NDJSON above its inline limit; ``train_model`` links the exact
bytes of the model file it wrote. Through the API and a worker: tests/e2e/test_example_tools.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from mcp_celery_tasks.testing import ToolRun, run_tool
from workers.match_file import INLINE_MATCHES, NDJSON, PREVIEW_MATCHES, MatchFile
from workers.model_files import principal_folder
from workers.search_logs import search_logs
from workers.train_model import train_model


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files root (holding ``logs/``) and the models root, as ``dev`` sets them."""
    (tmp_path / "files" / "logs").mkdir(parents=True)
    monkeypatch.setenv("MCP_EXAMPLES_FILES_ROOT", str(tmp_path / "files"))
    monkeypatch.setenv("MCP_EXAMPLES_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path


def write_log(roots: Path, matches: int) -> list[dict[str, Any]]:
    """A log with ``matches`` matching lines among others; the matches as the tool lists them."""
    lines, expected = [], []
    for i in range(matches):
        lines += [f"INFO fine {i}", f'ERROR "boom" näive {i}']
        expected.append({"file": "app.log", "line": len(lines), "text": lines[-1]})
    (roots / "files" / "logs" / "app.log").write_text("\n".join(lines) + "\n")
    return expected


def completed(run: ToolRun) -> dict[str, Any]:
    assert run.status == "completed" and not run.is_error, run.result
    structured: dict[str, Any] = run.structured
    return structured


def links(run: ToolRun) -> list[dict[str, Any]]:
    content = cast(list[dict[str, Any]], (run.result or {})["content"])
    return [block for block in content if block["type"] == "resource_link"]


def test_search_logs_keeps_a_result_within_the_inline_limit_inline_with_no_link(roots: Path) -> None:
    expected = write_log(roots, INLINE_MATCHES)
    run = run_tool(search_logs, {"directory": "logs", "pattern": "ERROR", "max_matches": 10_000})
    found = completed(run)
    assert found["matches"] == expected and found["matches_truncated"] is False
    assert "matches_file" not in found and links(run) == [] and run.artifacts == {}


def test_search_logs_above_the_inline_limit_links_every_match_as_ndjson(roots: Path) -> None:
    expected = write_log(roots, INLINE_MATCHES + 1)
    run = run_tool(search_logs, {"directory": "logs", "pattern": "ERROR", "max_matches": 10_000})
    found = completed(run)
    assert found["match_count"] == INLINE_MATCHES + 1 and found["matches_truncated"] is True
    assert found["matches"] == expected[:PREVIEW_MATCHES]
    [link] = links(run)
    assert link["name"] == "matches.ndjson" and link["mimeType"] == NDJSON
    data = run.artifacts[link["uri"]]
    assert link["size"] == len(data) == found["matches_file"]["bytes"]
    assert found["matches_file"] == {"uri": link["uri"], "matches": len(expected), "bytes": len(data),
                                     "complete": True}  # fmt: skip
    assert [json.loads(line) for line in data.decode().splitlines()] == expected


def test_a_match_file_stops_writing_at_its_bound_and_says_it_is_incomplete() -> None:
    with MatchFile(max_bytes=120) as every_match:
        for i in range(10):
            every_match.add("a.log", i, "x" * 20)
        assert every_match.full and every_match.written == 2 and every_match.size == 112


def test_train_model_links_the_exact_bytes_of_the_model_file_it_wrote(roots: Path) -> None:
    run = run_tool(train_model, {"model": "runs/moons", "epochs": 2, "samples": 50}, capabilities={})
    trained = completed(run)
    [link] = links(run)
    assert link["name"] == "moons.npz" and link["mimeType"] == "application/octet-stream"
    assert trained["weights"] == link["uri"]
    written = (roots / "models" / principal_folder("anon") / "runs" / "moons.npz").read_bytes()
    assert run.artifacts[link["uri"]] == written and link["size"] == len(written)
    with np.load(io.BytesIO(written)) as weights:
        assert sorted(weights.files) == ["b1", "b2", "w1", "w2"]
