"""Artifacts against real Postgres (and a real directory): the per-artifact cap and the
principal's quota, checked chunk by chunk and leaving nothing behind; both storages written and
read in byte ranges through the API's read service; the directory sweep."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

import pytest

from mcp_celery_tasks.errors import ArtifactRefused, InvalidParams
from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore
from mcp_celery_tasks.store.artifact_calls import CHUNK_BYTES, exact_chunks
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from mcp_celery_tasks.tasks.artifacts import RANGE_TEMPLATE, ArtifactService
from mcp_celery_tasks.tools.artifacts import ARTIFACT_URI_PREFIX
from mcp_celery_tasks.worker.artifacts import JobArtifacts
from tests.integration.conftest import Db
from tests.integration.test_store import ME, OWNER, STRANGER, running

MiB = CHUNK_BYTES


def _count(db: Db, table: str) -> int:
    row = db.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
    assert row is not None
    return int(row["n"])


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _id_of(uri: str) -> str:
    return uri[len(ARTIFACT_URI_PREFIX) :].split("/")[0]


def _settings(store_settings: Settings, **changes: object) -> Settings:
    return store_settings.model_copy(update=changes)


def _counting(sizes: list[int], counted: list[int]) -> Iterator[bytes]:
    """Chunks of ``sizes``; ``counted`` learns how many were taken (the upload stops early)."""
    for size in sizes:
        counted.append(size)
        yield b"q" * size


async def test_an_artifact_over_its_cap_stops_at_the_chunk_that_passes_it_and_is_removed(
    api: ApiStore, store: WorkerStore, db: Db, store_settings: Settings
) -> None:
    record = await running(api, store)
    artifacts = JobArtifacts(store, record.task_id, ME, _settings(store_settings, max_artifact_bytes=3 * MiB))
    taken: list[int] = []
    with pytest.raises(
        ArtifactRefused, match=r"3145728 bytes per artifact \(max_artifact_bytes\)"
    ) as refused:
        artifacts.publish("big.bin", _Stream(_counting([MiB] * 100, taken)))
    assert refused.value.limit == "max_artifact_bytes"
    assert len(taken) == 4  # streamed: refused at the fourth chunk, never read to the end
    assert _count(db, "mcp_task_artifacts") == 0 and _count(db, "mcp_task_artifact_chunks") == 0
    exact = artifacts.publish("exact.bin", b"e" * (3 * MiB))
    assert exact["size"] == 3 * MiB


async def test_the_quota_counts_the_principals_stored_and_streaming_bytes_and_not_others(
    api: ApiStore, store: WorkerStore, db: Db, store_settings: Settings
) -> None:
    quota = _settings(store_settings, artifact_quota_bytes=5 * MiB)
    first = await running(api, store)
    JobArtifacts(store, first.task_id, ME, quota).publish("a.bin", b"a" * (3 * MiB))
    second = await running(api, store)  # another task of the same principal
    artifacts = JobArtifacts(store, second.task_id, ME, quota)
    with pytest.raises(
        ArtifactRefused, match=r"quota of 5242880 bytes \(artifact_quota_bytes; 5242880"
    ) as refused:
        artifacts.publish("b.bin", b"b" * (3 * MiB))
    assert refused.value.limit == "artifact_quota_bytes"
    assert _count(db, "mcp_task_artifacts") == 1  # the refused one left nothing
    assert artifacts.publish("fits.bin", b"c" * (2 * MiB))["size"] == 2 * MiB

    other = await running(api, store, owner=STRANGER)
    assert JobArtifacts(store, other.task_id, ME, quota).publish("x.bin", b"x" * (5 * MiB))["size"] == 5 * MiB
    unlimited = _settings(store_settings, artifact_quota_bytes=0)
    assert JobArtifacts(store, second.task_id, ME, unlimited).publish("y.bin", b"y" * MiB)["size"] == MiB


def test_short_reads_of_a_file_object_are_regrouped_into_exact_chunks() -> None:
    pieces = [b"a" * 1000, b"b" * 5000, b"c" * 10, b"d" * 4096]
    regrouped = list(exact_chunks(pieces, 4096))
    assert [len(c) for c in regrouped] == [4096, 4096, 1914]
    assert b"".join(regrouped) == b"".join(pieces)


@pytest.mark.parametrize("storage", ["postgres", "directory"])
async def test_both_storages_read_back_in_ranges_that_reassemble_the_bytes(
    api: ApiStore, store: WorkerStore, db: Db, store_settings: Settings, tmp_path: Path, storage: str
) -> None:
    settings = _settings(store_settings, artifact_dir=str(tmp_path) if storage == "directory" else None)
    record = await running(api, store)
    data = os.urandom(5 * MiB + 777)
    link = JobArtifacts(store, record.task_id, ME, settings).publish(
        "w.bin", _Stream(iter([data[:100], data[100:]]))
    )
    artifact_id = _id_of(link["uri"])
    stored = db.execute(
        "SELECT storage FROM mcp_task_artifacts WHERE artifact_id = %s", (artifact_id,)
    ).fetchone()
    assert stored == {"storage": storage}
    expected_rows = 6 if storage == "postgres" else 0
    assert _count(db, "mcp_task_artifact_chunks") == expected_rows
    if storage == "directory":
        (path,) = _files(tmp_path)
        assert path.name == artifact_id and "w.bin" not in str(path)  # named by id only
        assert path.read_bytes() == data

    service = ArtifactService(api, ArtifactDirectory(tmp_path))
    part = 2 * MiB - 3  # ranges that straddle chunk boundaries
    got = b""
    for offset in range(0, len(data), part):
        read = await service.read(f"{link['uri']}?offset={offset}&length={part}", OWNER, max_bytes=2 * MiB)
        assert read.ranged
        got += read.data
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
    tail = await service.read(f"{link['uri']}?offset={len(data) - 5}", OWNER, max_bytes=2 * MiB)
    assert tail.data == data[-5:]
    with pytest.raises(InvalidParams, match="read it in parts"):
        await service.read(link["uri"], OWNER, max_bytes=2 * MiB)


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("offset=-1", "offset must be a non-negative integer, not '-1'"),
        ("offset=1.5", "offset must be a non-negative integer, not '1.5'"),
        ("offset=%31", "offset must be a non-negative integer"),
        ("length=abc", "length must be a non-negative integer"),
        ("offset=100", "offset 100 is beyond the resource's end (100 bytes)"),
        ("offset=1000", "offset 1000 is beyond the resource's end"),
        ("length=0", "length must be from 1 to 64 (MAX_READ_BYTES), not 0"),
        ("length=65", "length must be from 1 to 64 (MAX_READ_BYTES), not 65"),
        ("offset=1&offset=2", "offset is given twice"),
        ("limit=3", "unknown range parameter 'limit=3'"),
        ("offset", "unknown range parameter 'offset'"),
        ("", "unknown range parameter ''"),
    ],
)
async def test_a_bad_range_is_refused_with_a_clear_invalid_params(
    api: ApiStore, store: WorkerStore, store_settings: Settings, query: str, why: str
) -> None:
    record = await running(api, store)
    link = JobArtifacts(store, record.task_id, ME, store_settings).publish("t.txt", "z" * 100)
    with pytest.raises(InvalidParams) as refused:
        await ArtifactService(api).read(f"{link['uri']}?{query}", OWNER, max_bytes=64)
    assert refused.value.message.startswith("Invalid range: ") and why in refused.value.message
    assert refused.value.data == {"uri": f"{link['uri']}?{query}", "uriTemplate": RANGE_TEMPLATE}


async def test_a_range_of_a_text_artifact_is_a_blob_cut_at_the_end(
    api: ApiStore, store: WorkerStore, store_settings: Settings
) -> None:
    record = await running(api, store)
    link = JobArtifacts(store, record.task_id, ME, store_settings).publish("t.txt", "0123456789")
    read = await ArtifactService(api).read(f"{link['uri']}?offset=7&length=64", OWNER, max_bytes=64)
    assert read.data == b"789" and read.ranged
    assert base64.b64encode(read.data)  # protocol.resources sends a ranged read as a blob


async def test_the_directory_sweep_removes_files_whose_row_is_gone_and_keeps_the_rest(
    api: ApiStore, store: WorkerStore, db: Db, store_settings: Settings, tmp_path: Path
) -> None:
    settings = _settings(store_settings, artifact_dir=str(tmp_path))
    directory = ArtifactDirectory(tmp_path)
    record = await running(api, store)
    kept = _id_of(JobArtifacts(store, record.task_id, ME, settings).publish("k.bin", b"k" * 10)["uri"])
    gone = _id_of(JobArtifacts(store, record.task_id, ME, settings).publish("g.bin", b"g" * 10)["uri"])
    leftover = directory.upload("LeftByAKilledJob1234")  # a partial file with no row
    leftover.write(b"partial")
    db.execute("DELETE FROM mcp_task_artifacts WHERE artifact_id = %s", (gone,))

    assert gc.sweep_artifact_dir(store, directory, older_than_s=3600) == 0  # too fresh
    assert gc.sweep_artifact_dir(store, directory, older_than_s=-1) == 2
    assert directory.path(kept).is_file() and not directory.path(gone).exists()
    assert [p.name for p in _files(tmp_path)] == [kept]


async def test_a_refused_directory_upload_leaves_no_file(
    api: ApiStore, store: WorkerStore, db: Db, store_settings: Settings, tmp_path: Path
) -> None:
    settings = _settings(store_settings, artifact_dir=str(tmp_path), max_artifact_bytes=MiB)
    record = await running(api, store)
    with pytest.raises(ArtifactRefused):
        JobArtifacts(store, record.task_id, ME, settings).publish("big.bin", b"b" * (2 * MiB))
    assert _files(tmp_path) == []
    assert _count(db, "mcp_task_artifacts") == 0


def test_a_file_path_is_built_from_the_id_only(tmp_path: Path) -> None:
    directory = ArtifactDirectory(tmp_path)
    assert directory.path("AbCdEfGh_-12") == tmp_path / "Ab" / "AbCdEfGh_-12"
    for bad in ["../../etc/passwd", "a/b", "..", "short", "x" * 65, "dot.dot.dot"]:
        with pytest.raises(ValueError, match="not an artifact id"):
            directory.path(bad)


class _Chunks:
    """A binary file object over an iterator of chunks (short reads, as a pipe gives)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def read(self, size: int = -1) -> bytes:
        return next(self._chunks, b"")


def _Stream(chunks: Iterator[bytes]) -> IO[bytes]:
    return cast(IO[bytes], _Chunks(chunks))
