"""Artifacts against real Postgres: the worker's chunked, fenced writes (``ctx.artifact`` through
``worker.artifacts.JobArtifacts``), the API's principal-scoped reads, the cascade with the task
and the collector's orphan sweep."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import secrets
import threading
from collections.abc import Iterator

import pytest

from mcp_celery_tasks.errors import (
    RESOURCE_NOT_FOUND,
    InvalidParams,
    ResourceNotFound,
    TaskCancelled,
    ToolError,
)
from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.store import ApiStore, WorkerStore, artifact_queries
from mcp_celery_tasks.store.artifact_calls import HalfWritten, NotOurs
from mcp_celery_tasks.store.step_queries import CHUNK_BYTES
from mcp_celery_tasks.tasks.artifacts import ArtifactService
from mcp_celery_tasks.tools.artifacts import ARTIFACT_URI_PREFIX
from mcp_celery_tasks.worker.artifacts import JobArtifacts
from tests.integration.conftest import Db
from tests.integration.test_store import ME, OWNER, RIVAL, STRANGER, running


def _id_of(uri: str) -> str:
    assert uri.startswith(ARTIFACT_URI_PREFIX)
    return uri[len(ARTIFACT_URI_PREFIX) :].split("/")[0]


def _chunk_sizes(db: Db, artifact_id: str) -> list[int]:
    rows = db.execute(
        "SELECT length(data) AS n FROM mcp_task_artifact_chunks WHERE artifact_id = %s ORDER BY seq",
        (artifact_id,),
    ).fetchall()
    return [int(row["n"]) for row in rows]


async def test_a_file_object_is_stored_in_1_mib_chunks_and_reads_back_with_its_digest(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    record = await running(api, store)
    data = os.urandom(3 * CHUNK_BYTES + 123)
    link = JobArtifacts(store, record.task_id, ME).publish("weights.bin", io.BytesIO(data))

    assert link["type"] == "resource_link" and link["name"] == "weights.bin"
    assert link["mimeType"] == "application/octet-stream" and link["size"] == len(data)
    assert link["uri"].endswith("/weights.bin")
    artifact_id = _id_of(link["uri"])
    assert _chunk_sizes(db, artifact_id) == [CHUNK_BYTES] * 3 + [123]
    found = await api.artifact(artifact_id, OWNER)
    assert found is not None and found.size == len(data) and found.chunks == 4
    assert found.sha256 == hashlib.sha256(data).hexdigest()
    assert await api.artifact_bytes(found) == data


async def test_text_gets_a_guessed_mime_type_and_an_explicit_one_is_kept(
    api: ApiStore, store: WorkerStore
) -> None:
    record = await running(api, store)
    artifacts = JobArtifacts(store, record.task_id, ME)
    assert artifacts.publish("matches.csv", "a,b\n1,2\n")["mimeType"] == "text/csv"
    link = artifacts.publish("matches.ndjson", b'{"a":1}\n', "application/x-ndjson")
    assert link["mimeType"] == "application/x-ndjson" and link["size"] == 8


async def test_another_principals_artifact_reads_as_unknown(api: ApiStore, store: WorkerStore) -> None:
    record = await running(api, store)
    link = JobArtifacts(store, record.task_id, ME).publish("secret.txt", "hush")
    artifact_id = _id_of(link["uri"])

    assert await api.artifact(artifact_id, STRANGER) is None
    assert await api.artifact("no-such-artifact", OWNER) is None
    assert [a.artifact_id for a in await api.list_artifacts(STRANGER, 10)] == []
    assert [a.artifact_id for a in await api.list_artifacts(OWNER, 10)] == [artifact_id]


async def test_an_upload_in_progress_is_refused_whole_and_a_failed_one_is_removed(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    record = await running(api, store)
    streaming, release = threading.Event(), threading.Event()

    def chunks() -> Iterator[bytes]:
        yield b"x" * CHUNK_BYTES
        yield b"y" * CHUNK_BYTES  # the first chunk is written once the second is asked for
        streaming.set()
        assert release.wait(10)
        raise OSError("disk gone")

    upload = asyncio.create_task(
        asyncio.to_thread(
            store.write_artifact, record.task_id, ME, "big.bin", "application/octet-stream", chunks()
        )
    )
    assert await asyncio.to_thread(streaming.wait, 10)
    (row,) = db.execute("SELECT artifact_id, size FROM mcp_task_artifacts").fetchall()
    assert row["size"] == 2 * CHUNK_BYTES  # the quota counts an upload as it streams
    with pytest.raises(HalfWritten):
        await api.artifact(row["artifact_id"], OWNER)
    with pytest.raises(ResourceNotFound, match="upload is incomplete"):
        await ArtifactService(api).read(f"{ARTIFACT_URI_PREFIX}{row['artifact_id']}/big.bin", OWNER, 1 << 30)
    assert await api.list_artifacts(OWNER, 10) == []

    release.set()
    with pytest.raises(OSError, match="disk gone"):
        await upload
    # Its own run removed it at once: nothing half-stored is left for the quota or the sweep.
    assert db.execute("SELECT count(*) AS n FROM mcp_task_artifacts").fetchone() == {"n": 0}
    assert db.execute("SELECT count(*) AS n FROM mcp_task_artifact_chunks").fetchone() == {"n": 0}


async def test_a_worker_without_the_lease_writes_nothing(api: ApiStore, store: WorkerStore, db: Db) -> None:
    record = await running(api, store)
    with pytest.raises(NotOurs):
        store.write_artifact(record.task_id, RIVAL, "x.bin", "application/octet-stream", [b"data"])
    with pytest.raises(TaskCancelled):
        JobArtifacts(store, record.task_id, RIVAL).publish("x.bin", b"data")
    assert db.execute("SELECT count(*) AS n FROM mcp_task_artifacts").fetchone() == {"n": 0}


async def test_a_run_that_loses_its_task_mid_upload_stops_and_leaves_it_unreadable(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    record = await running(api, store)

    def chunks() -> object:
        yield b"a" * CHUNK_BYTES
        assert store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})
        yield b"b" * CHUNK_BYTES

    with pytest.raises(NotOurs):
        store.write_artifact(record.task_id, ME, "late.bin", "application/octet-stream", chunks())  # type: ignore[arg-type]
    rows = db.execute("SELECT artifact_id, complete FROM mcp_task_artifacts").fetchall()
    assert [row["complete"] for row in rows] == [False]
    assert _chunk_sizes(db, rows[0]["artifact_id"]) == [CHUNK_BYTES]


@pytest.mark.parametrize(
    "name", ["", "a/b", "a\\b", "..", "x..y", "bell\x07", "tab\there", "x" * 201, "nul\x00"]
)
async def test_bad_names_are_refused_before_anything_is_written(
    api: ApiStore, store: WorkerStore, db: Db, name: str
) -> None:
    record = await running(api, store)
    with pytest.raises(ToolError):
        JobArtifacts(store, record.task_id, ME).publish(name, b"data")
    assert db.execute("SELECT count(*) AS n FROM mcp_task_artifacts").fetchone() == {"n": 0}


async def test_artifacts_and_chunks_go_with_their_expired_task(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    record = await running(api, store)
    JobArtifacts(store, record.task_id, ME).publish("out.bin", os.urandom(CHUNK_BYTES + 1))
    assert store.finish(record.task_id, ME, "completed", result={"content": [], "isError": False})
    db.execute(
        "UPDATE mcp_tasks SET expires_at = now() - interval '1 second' WHERE task_id = %s", (record.task_id,)
    )

    assert gc.collect_garbage(store) == 1
    assert db.execute("SELECT count(*) AS n FROM mcp_task_artifacts").fetchone() == {"n": 0}
    assert db.execute("SELECT count(*) AS n FROM mcp_task_artifact_chunks").fetchone() == {"n": 0}


async def test_the_orphan_sweep_removes_old_incomplete_artifacts_of_ended_tasks_only(
    api: ApiStore, store: WorkerStore, db: Db
) -> None:
    def half(task_id: str) -> str:
        """What a job killed mid-upload leaves: the row and a chunk, as its statements wrote them
        (a killed process runs no clean-up)."""
        fence = {"task_id": task_id, "worker": ME, "artifact_id": secrets.token_urlsafe(18)}
        created = {
            **fence,
            "name": "half.bin",
            "mime_type": "application/octet-stream",
            "storage": "postgres",
        }
        assert store._fetch(artifact_queries.CREATE_ARTIFACT, created)
        chunk = {**fence, "n": 10, "max_bytes": 1 << 30, "quota": 0, "seq": 0, "data": b"z" * 10}
        assert store._fetch(artifact_queries.INSERT_CHUNK, chunk)
        return fence["artifact_id"]

    ended = await running(api, store)
    ended_half = half(ended.task_id)
    kept = JobArtifacts(store, ended.task_id, ME).publish("whole.bin", b"whole")
    assert store.finish(ended.task_id, ME, "completed", result={"content": [], "isError": False})
    still_running = await running(api, store)
    running_half = half(still_running.task_id)
    fresh_ended = await running(api, store)
    fresh_half = half(fresh_ended.task_id)
    assert store.finish(fresh_ended.task_id, ME, "completed", result={"content": [], "isError": False})
    db.execute(
        "UPDATE mcp_task_artifacts SET created_at = now() - interval '2 hours' WHERE artifact_id <> %s",
        (fresh_half,),
    )

    gc.collect_garbage(store)

    left = {row["artifact_id"] for row in db.execute("SELECT artifact_id FROM mcp_task_artifacts").fetchall()}
    assert left == {_id_of(kept["uri"]), running_half, fresh_half}
    assert ended_half not in left
    chunk_owners = db.execute("SELECT DISTINCT artifact_id FROM mcp_task_artifact_chunks").fetchall()
    assert ended_half not in {row["artifact_id"] for row in chunk_owners}


async def test_listing_pages_newest_first(api: ApiStore, store: WorkerStore, db: Db) -> None:
    task = await running(api, store)
    artifacts = JobArtifacts(store, task.task_id, ME)
    ids = [_id_of(artifacts.publish(f"part-{n}.txt", str(n))["uri"]) for n in range(5)]
    for age, artifact_id in enumerate(reversed(ids)):
        db.execute(
            "UPDATE mcp_task_artifacts SET created_at = now() - make_interval(secs => %s) "
            "WHERE artifact_id = %s",
            (age, artifact_id),
        )
    first = await api.list_artifacts(OWNER, 3)
    assert [a.artifact_id for a in first] == ids[::-1][:3]
    rest = await api.list_artifacts(OWNER, 3, (first[-1].created_at, first[-1].artifact_id))
    assert [a.artifact_id for a in rest] == ids[::-1][3:]


async def test_the_read_service_refuses_what_is_too_large_and_answers_one_error_for_the_rest(
    api: ApiStore, store: WorkerStore
) -> None:
    record = await running(api, store)
    link = JobArtifacts(store, record.task_id, ME).publish("out.txt", "x" * 100)
    service = ArtifactService(api)

    read = await service.read(link["uri"], OWNER, max_bytes=100)
    assert read.record.name == "out.txt" and read.data == b"x" * 100 and not read.ranged
    with pytest.raises(InvalidParams, match="MAX_READ_BYTES = 99") as too_large:
        await service.read(link["uri"], OWNER, max_bytes=99)
    assert too_large.value.data == {
        "uri": link["uri"],
        "size": 100,
        "maxReadBytes": 99,
        "uriTemplate": "mcp-tasks://artifacts/{id}/{name}{?offset,length}",
    }
    assert f"{link['uri']}?offset=<n>&length=<m>" in too_large.value.message

    renamed = link["uri"].replace("/out.txt", "/other.txt")
    answers = []
    for uri, who in [(link["uri"], STRANGER), (renamed, OWNER), ("mcp-tasks://artifacts/x/../y", OWNER),
                     ("file:///etc/passwd", OWNER)]:  # fmt: skip
        with pytest.raises(ResourceNotFound) as refused:
            await service.read(uri, who, max_bytes=100)
        answers.append((refused.value.code, refused.value.message, refused.value.data))
    assert {(code, message) for code, message, _ in answers} == {(RESOURCE_NOT_FOUND, "Resource not found")}
    assert answers[0][2] == {"uri": link["uri"]}
