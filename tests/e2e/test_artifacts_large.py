"""Large artifacts on real stacks of their own (API, prefork worker, Redis, Postgres): a 50 MiB
result completes with links (the large block stored as an artifact, ``inline_result_bytes``) and
the official Python SDK client (mcp 2.3) reads it back in ranges (one read is capped at 16 MiB)
whose bytes match the tool's sha256; a principal over its storage quota gets a clear tool error;
and the directory storage (``artifact_dir``) once, end to end."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from mcp import Client as SdkClient
from mcp.shared.exceptions import MCPError

from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from tests import support
from tests.fixtures.artifacts import large_text
from tests.support import Client, Stack

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.artifacts"]'
MiB = 1024 * 1024
QUOTA = 80 * MiB
TOKENS = {"carol": "carol-quota-token", "dave": "dave-quota-token"}
MAX_READ = 16 * MiB


@pytest.fixture(scope="module")
def big_stack(template_db: str) -> Iterator[Stack]:
    with support.stack_of_its_own(
        "artbig", template_db, TOOLS, MCP_TASKS_ARTIFACT_QUOTA_BYTES=str(QUOTA)
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def quota_url(big_stack: Stack) -> Iterator[str]:
    """A second API on the stack with bearer tokens on (two principals)."""
    env = dict(big_stack.env, MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS))
    proc, url = support.start_api(f"artbig-auth-{uuid.uuid4().hex[:8]}", env)
    try:
        yield url
    finally:
        proc.stop()


@pytest.mark.timeout(300)
async def test_a_50_mib_result_completes_with_links_and_the_sdk_reads_it_back_in_ranges(
    big_stack: Stack,
) -> None:
    size = 50 * MiB
    async with SdkClient(big_stack.url, read_timeout_seconds=240) as client:
        result = await client.call_tool("large_result", {"size": size, "seed": "sdk"})
        assert result.is_error is False
        digest, link, preview = result.content
        assert isinstance(digest, mcp_types.TextContent) and digest.text.startswith("sha256:")
        assert isinstance(link, mcp_types.ResourceLink) and link.size == size
        assert isinstance(preview, mcp_types.TextContent) and preview.text.startswith(
            "[preview of result-1.txt"
        )
        assert preview.text.endswith(large_text(2048, "sdk"))

        templates = await client.list_resource_templates()
        (template,) = templates.resource_templates
        assert template.uri_template == "mcp-tasks://artifacts/{id}/{name}{?offset,length}"

        with pytest.raises(MCPError) as whole:  # one read would be 50 MiB
            await client.read_resource(str(link.uri))
        assert whole.value.error.code == mcp_types.jsonrpc.INVALID_PARAMS
        assert "MAX_READ_BYTES = 16777216" in whole.value.error.message
        assert "?offset=<n>&length=<m>" in whole.value.error.message

        sha, total = hashlib.sha256(), 0
        for offset in range(0, size, MAX_READ):
            part = await client.read_resource(f"{link.uri}?offset={offset}&length={MAX_READ}")
            (contents,) = part.contents
            assert isinstance(contents, mcp_types.BlobResourceContents), type(contents)
            data = base64.b64decode(contents.blob)
            assert len(data) == min(MAX_READ, size - offset)
            sha.update(data)
            total += len(data)
        assert total == size and f"sha256:{sha.hexdigest()}" == digest.text

        with pytest.raises(MCPError) as beyond:
            await client.read_resource(f"{link.uri}?offset={size}")
        assert beyond.value.error.code == mcp_types.jsonrpc.INVALID_PARAMS
        assert "beyond the resource's end" in beyond.value.error.message


def _done(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    task_id = client.start(tool, arguments)
    done = client.wait_status(task_id, timeout=180)
    assert done["status"] == "completed", done
    result: dict[str, Any] = done["result"]
    return result


@pytest.mark.timeout(300)
def test_a_principal_over_its_storage_quota_gets_a_clear_tool_error(big_stack: Stack, quota_url: str) -> None:
    carol, dave = Client(quota_url, token=TOKENS["carol"]), Client(quota_url, token=TOKENS["dave"])
    try:
        first = _done(carol, "large_result", {"size": 50 * MiB, "seed": "q1"})
        assert first["isError"] is False and first["content"][1]["type"] == "resource_link"

        refused = _done(carol, "large_result", {"size": 40 * MiB, "seed": "q2"})
        assert refused["isError"] is True
        (said,) = refused["content"]
        assert "artifact_quota_bytes" in said["text"] and f"quota of {QUOTA} bytes" in said["text"]
        assert "nothing of it was kept" in said["text"]
        with big_stack.db() as conn:
            rows = conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM mcp_task_artifacts WHERE owner = 'token:carol'"
            ).fetchone()
        assert rows == (1, 50 * MiB)  # the refused upload left nothing behind

        other = _done(dave, "large_result", {"size": 40 * MiB, "seed": "q3"})  # a quota per principal
        assert other["isError"] is False
    finally:
        carol.close()
        dave.close()


@pytest.fixture(scope="module")
def dir_stack(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    root = tmp_path_factory.mktemp("artifact-dir")
    with support.stack_of_its_own("artdir", template_db, TOOLS, MCP_TASKS_ARTIFACT_DIR=str(root)) as stack:
        yield stack, root


@pytest.mark.timeout(120)
def test_the_directory_storage_serves_a_linked_file_end_to_end(dir_stack: tuple[Stack, Path]) -> None:
    stack, root = dir_stack
    client = stack.client()
    try:
        result = _done(client, "publish_blob", {"size": 3 * MiB + 5, "name": "model.bin", "seed": "d"})
        link, digest = result["content"]
        artifact_id = link["uri"].split("/")[-2]
        (path,) = [p for p in root.rglob("*") if p.is_file()]
        assert path.name == artifact_id and path.stat().st_size == 3 * MiB + 5
        got = b""
        for offset in (0, 2 * MiB):
            ranged = f"{link['uri']}?offset={offset}&length={2 * MiB}"
            part = client.request("resources/read", {"uri": ranged}, name=ranged)
            got += base64.b64decode(part.result["contents"][0]["blob"])
        assert hashlib.sha256(got).hexdigest() == digest["text"]
        with stack.db() as conn:
            stored = conn.execute(
                "SELECT storage, (SELECT count(*) FROM mcp_task_artifact_chunks) FROM mcp_task_artifacts"
            ).fetchall()
        assert stored == [("directory", 0)]
    finally:
        client.close()


@pytest.mark.timeout(180)
def test_a_job_killed_mid_upload_leaves_nothing_after_the_sweep(dir_stack: tuple[Stack, Path]) -> None:
    """SIGKILL the pool child mid-upload (no clean-up runs): the job is redelivered and publishes
    the whole artifact; the killed run's incomplete row and partial file go in the sweep."""
    stack, root = dir_stack
    before = {p.name for p in root.rglob("*") if p.is_file()}  # the module's other artifacts
    client = stack.client()
    try:
        task_id = client.start("publish_stream", {"size": 400 * MiB, "name": "interrupted.bin"})

        def uploading() -> tuple[str, str] | None:
            with stack.db() as conn:
                found = conn.execute(
                    "SELECT a.artifact_id, t.worker FROM mcp_task_artifacts a"
                    " JOIN mcp_tasks t USING (task_id)"
                    " WHERE a.task_id = %s AND NOT a.complete AND a.size >= %s",
                    (task_id, 8 * MiB),
                ).fetchone()
            return None if found is None else (str(found[0]), str(found[1]))

        killed, worker = support.wait_until(uploading, 60, 0.02, what="the upload to be under way")
        os.kill(int(worker.split(":")[1]), signal.SIGKILL)
        done = client.wait_status(task_id, timeout=150)
        assert done["status"] == "completed" and done["result"]["isError"] is False, done
        link, _ = done["result"]["content"]
        kept = link["uri"].split("/")[-2]
        assert kept != killed and link["size"] == 400 * MiB

        directory = ArtifactDirectory(root)
        assert {p.name for p in root.rglob("*") if p.is_file()} - before == {kept, f".{killed}.part"}
        with stack.db() as conn:  # the orphan sweep's age, reached without waiting an hour
            conn.execute(
                "UPDATE mcp_task_artifacts SET created_at = now() - interval '2 hours' WHERE task_id = %s",
                (task_id,),
            )
        store = WorkerStore(Settings(database_url=stack.database_url))
        try:
            gc.collect_garbage(store)  # the incomplete row of the killed run (its task is terminal)
            assert gc.sweep_artifact_dir(store, directory, older_than_s=-1) == 1  # then its file
        finally:
            store.close()
        assert {p.name for p in root.rglob("*") if p.is_file()} - before == {kept}
        with stack.db() as conn:
            rows = conn.execute(
                "SELECT artifact_id, complete FROM mcp_task_artifacts WHERE task_id = %s", (task_id,)
            ).fetchall()
        assert rows == [(kept, True)]
    finally:
        client.close()
