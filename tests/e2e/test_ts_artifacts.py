"""An artifact read through the TypeScript SDK client (``@modelcontextprotocol/client`` 2.4.0,
``readResource`` on 2026-07-28; ``scripts/install-peers``): the bytes a job published
(tests/fixtures/artifacts.py) come back whole, their sha256 the job's; an unknown uri is the
SEP-2164 "Resource not found" error; a 50 MiB result (stored as an artifact by itself) is read in
16 MiB ranges."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_types import jsonrpc as codes

from tests import support
from tests.support import Stack

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.artifacts"]'
PEERS = Path(__file__).with_name("peers")


@pytest.fixture(scope="module")
def ts_stack(template_db: str) -> Iterator[Stack]:
    with support.stack_of_its_own("tsart", template_db, TOOLS) as stack:
        yield stack


@pytest.fixture
def reader(ext_tasks: Path) -> Path:
    """The installed TypeScript client's folder, with the reading script beside its node_modules."""
    shutil.copy(PEERS / "read_artifact.mjs", ext_tasks / "read_artifact.mjs")
    return ext_tasks


def ts_read(reader: Path, url: str, uri: str, size: int | None = None) -> dict[str, Any]:
    command = ["node", "read_artifact.mjs", url, uri, *([] if size is None else [str(size)])]
    ran = subprocess.run(command, cwd=reader, capture_output=True, text=True, timeout=120)
    lines = [line for line in ran.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{ran.stdout[-2000:]}\n{ran.stderr[-3000:]}"
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def published(stack: Stack, tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    client = stack.client()
    try:
        done = client.wait_status(client.call_tool(tool, arguments).result["taskId"], timeout=60)
    finally:
        client.close()
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    content: list[dict[str, Any]] = done["result"]["content"]
    return content


@pytest.mark.timeout(180)
def test_the_typescript_sdk_reads_a_binary_artifact_whose_sha256_is_the_jobs(
    ts_stack: Stack, reader: Path
) -> None:
    size = 5 * 1024 * 1024 + 3
    link, digest = published(ts_stack, "publish_blob", {"size": size, "name": "weights.bin", "seed": "ts"})
    answer = ts_read(reader, ts_stack.url, link["uri"])
    expected = {"uri": link["uri"], "mimeType": "application/octet-stream", "field": "blob", "size": size}
    assert answer == {**expected, "sha256": digest["text"], "count": 1}


@pytest.mark.timeout(180)
def test_the_typescript_sdk_reads_a_text_artifact_as_text(ts_stack: Stack, reader: Path) -> None:
    text = "héllo, wörld\n" * 1000
    [link] = published(ts_stack, "publish_text", {"text": text, "name": "notes.txt"})
    answer = ts_read(reader, ts_stack.url, link["uri"])
    assert answer["field"] == "text" and answer["mimeType"] == "text/plain"
    assert (
        answer["size"] == len(text.encode()) and answer["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    )


def test_the_typescript_sdk_gets_resource_not_found_for_an_unknown_artifact(
    ts_stack: Stack, reader: Path
) -> None:
    answer = ts_read(reader, ts_stack.url, "mcp-tasks://artifacts/nope/x.bin")
    assert answer["code"] == codes.INVALID_PARAMS and "Resource not found" in answer["error"], answer


@pytest.mark.timeout(240)
def test_the_typescript_sdk_reads_a_50_mib_result_in_ranges_whose_sha256_is_the_tools(
    ts_stack: Stack, reader: Path
) -> None:
    size = 50 * 1024 * 1024
    digest, link, _preview = published(ts_stack, "large_result", {"size": size, "seed": "ts50"})
    assert link["type"] == "resource_link" and link["size"] == size, link
    answer = ts_read(reader, ts_stack.url, link["uri"], size=link["size"])
    assert answer == {
        "uri": link["uri"],
        "mimeType": link["mimeType"],
        "field": "blob",
        "size": size,
        "sha256": digest["text"].removeprefix("sha256:"),
        "count": 4,  # 16 + 16 + 16 + 2 MiB
    }
