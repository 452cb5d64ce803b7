"""Artifact throughput, memory while streaming, and the small-result path (run by hand; pytest
never collects this file).

    .venv/bin/python tests/bench/artifact_bench.py [--mib 256] [--stream-mib 1024] [--calls 300]

Uses the machine's Postgres and Redis (``MCP_TASKS_TEST_DATABASE_URL``, ``MCP_TASKS_TEST_REDIS_URL``,
as the tests do), on fresh databases migrated to head.

1. **Throughput** (store level, one process): ``ctx.artifact`` as a job sees it
   (``worker.artifacts.JobArtifacts`` over ``WorkerStore``) publishing a file of ``--mib`` MiB,
   then the API's read service (``tasks.artifacts.ArtifactService`` over ``ApiStore``) reading it
   back in 16 MiB ranges; MB/s (10^6 bytes) for Postgres chunks and for a directory.
2. **RSS while streaming** (a real stack: API process, prefork worker, Redis, Postgres): a job
   publishes ``--stream-mib`` MiB made as it streams (``tests/fixtures/artifacts.publish_stream``),
   then an HTTP client reads it back in 16 MiB ranged ``resources/read`` calls (digest checked).
   psutil samples the API's and the worker's processes (the pool children included) every 0.1 s:
   the RSS before, and the peak while writing and while reading, per storage.
3. **Small results**: the runner's result check as it was (one ``len(json.dumps(...))``
   against ``max_result_bytes``) and as it is (the same measure against ``inline_result_bytes``
   first), per call; and the end-to-end latency of a small synchronous ``tools/call`` on the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import base64  # noqa: E402

import psutil  # noqa: E402
import psycopg  # noqa: E402

from mcp_celery_tasks.json_types import JSONObject  # noqa: E402
from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import ApiStore, WorkerStore, migrate  # noqa: E402
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory  # noqa: E402
from mcp_celery_tasks.tasks.artifacts import ArtifactService  # noqa: E402
from mcp_celery_tasks.worker.artifacts import JobArtifacts  # noqa: E402
from mcp_celery_tasks.worker.spill import json_size  # noqa: E402
from tests import support  # noqa: E402

ME = "bench:1:aaaa"
MiB = 1024 * 1024
PART = 16 * MiB
TOOLS = '["tests.fixtures.conformance", "tests.fixtures.artifacts"]'


def _task(database_url: str) -> str:
    task_id, job_id = uuid.uuid4().hex, uuid.uuid4().hex
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,"
            " poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities, worker,"
            " lease_until) VALUES (%s, %s, 'anon', 'bench', '{}', 'working', 1, 1, 'q', 1, '2026-07-28',"
            " '{}', %s, now() + interval '1 hour')",
            (task_id, job_id, ME),
        )
    return task_id


def _mbps(size: int, seconds: float) -> str:
    return f"{seconds:6.2f} s  {size / seconds / 1e6:7.1f} MB/s"


async def _read_all(settings: Settings, uri: str, size: int, directory: str | None) -> str:
    api = ApiStore(settings)
    await api.open()
    try:
        service = ArtifactService(api, ArtifactDirectory(directory) if directory else None)
        digest = hashlib.sha256()
        for offset in range(0, size, PART):
            read = await service.read(f"{uri}?offset={offset}&length={PART}", "anon", PART)
            digest.update(read.data)
        return digest.hexdigest()
    finally:
        await api.close()


def throughput(database_url: str, mib: int, rounds: int, scratch: Path) -> None:
    size = mib * MiB
    source = scratch / "payload.bin"
    with source.open("wb") as out:
        for _ in range(mib):
            out.write(os.urandom(MiB))
    expected = hashlib.sha256(source.read_bytes()).hexdigest()
    print(f"## 1. throughput, {mib} MiB, {rounds} rounds (store level)")
    for storage, directory in (("postgres", None), ("directory", str(scratch / "artifacts"))):
        settings = Settings(database_url=database_url, artifact_dir=directory, artifact_quota_bytes=0)
        store = WorkerStore(settings)
        for _ in range(rounds):
            artifacts = JobArtifacts(store, _task(database_url), ME, settings)
            started = time.perf_counter()
            with source.open("rb") as data:
                link = artifacts.publish("payload.bin", data)
            wrote = time.perf_counter() - started
            started = time.perf_counter()
            digest = asyncio.run(_read_all(settings, link["uri"], size, directory))
            read = time.perf_counter() - started
            assert digest == expected, "read back other bytes"
            print(f"  {storage:<9} write {_mbps(size, wrote)}   read (16 MiB ranges) {_mbps(size, read)}")
        store.close()


class Sampler:
    """The summed RSS of a process tree, sampled every 0.1 s in a thread; ``phase`` names the
    current phase, and the peak per phase is kept."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self.phase = "idle"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_mib(self) -> float:
        total = 0
        for proc in [self._root, *self._root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total / MiB

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            value = self.rss_mib()
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), value)

    def __enter__(self) -> Sampler:
        self.peaks["idle"] = self.rss_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def _stack(template: str, label: str, **extra: str) -> Iterator[support.Stack]:
    env = {"MCP_TASKS_ARTIFACT_QUOTA_BYTES": "0", **extra}
    with support.stack_of_its_own(label, template, TOOLS, concurrency=2, **env) as stack:
        yield stack


def _timed_calls(client: support.Client, calls: int, call: Callable[[], Any]) -> list[float]:
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return took


def streaming(template: str, stream_mib: int, calls: int, scratch: Path) -> None:
    size = stream_mib * MiB
    print(f"\n## 2. RSS while streaming {stream_mib} MiB through a real API and prefork worker (-c 2)")
    for storage, extra in (
        ("postgres", {}),
        ("directory", {"MCP_TASKS_ARTIFACT_DIR": str(scratch / "stack")}),
    ):
        with _stack(template, f"artb{storage[:3]}", **extra) as stack:
            client = stack.client()
            with Sampler(stack.api.popen.pid) as api, Sampler(stack.worker.popen.pid) as worker:
                api.phase = worker.phase = "write"
                started = time.perf_counter()
                task_id = client.start("publish_stream", {"size": size, "name": "big.bin"})
                done = client.wait_status(task_id, timeout=3600)
                wrote = time.perf_counter() - started
                assert done["status"] == "completed" and not done["result"]["isError"], done
                link, digest = done["result"]["content"]
                api.phase = worker.phase = "read"
                started = time.perf_counter()
                sha = hashlib.sha256()
                for offset in range(0, size, PART):
                    uri = f"{link['uri']}?offset={offset}&length={PART}"
                    reply = client.request("resources/read", {"uri": uri}, name=uri, timeout=120)
                    sha.update(base64.b64decode(reply.result["contents"][0]["blob"]))
                read = time.perf_counter() - started
                assert sha.hexdigest() == digest["text"], "read back other bytes"
                api.phase = worker.phase = "after"
                time.sleep(0.3)
            print(f"  {storage}: job write {_mbps(size, wrote)}   HTTP read {_mbps(size, read)}")
            for who, sampler in (("API", api), ("worker (main + children)", worker)):
                peaks = sampler.peaks
                print(
                    f"    {who:<25} RSS MiB: idle {peaks['idle']:.0f}, peak while writing "
                    f"{peaks.get('write', 0):.0f}, while reading {peaks.get('read', 0):.0f}"
                )
            if storage == "postgres":
                small(client, calls)
            client.close()


def small(client: support.Client, calls: int) -> None:
    print(f"\n## 3. small results ({calls} calls)")
    result: JSONObject = {
        "content": [{"type": "text", "text": "Hello, bench!"}],
        "isError": False,
        "resultType": "complete",
    }
    max_result, inline = 4_194_304, 262_144
    n = 200_000

    def before() -> bool:  # the check as it was: one measure against max_result_bytes
        return len(json.dumps(result, separators=(",", ":"))) > max_result

    def after() -> bool:  # as it is: the same measure against inline_result_bytes, then the cap
        size = json_size(result)
        if size > min(inline, max_result):
            raise AssertionError("a small result took the artifact path")
        return size > max_result

    for label, check in (("before", before), ("after", after), ("before", before), ("after", after)):
        started = time.perf_counter()
        for _ in range(n):
            check()
        print(
            f"  runner result check, {label:<6}: {(time.perf_counter() - started) / n * 1e6:.2f} µs a result"
        )
    latencies = _timed_calls(
        client, calls, lambda: client.call_tool("greet", {"name": "bench"}, extension=False)
    )
    latencies.sort()
    p50, p95 = statistics.median(latencies), latencies[int(len(latencies) * 0.95)]
    print(f"  synchronous tools/call greet end to end: p50 {p50:.2f} ms, p95 {p95:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="size of the throughput artifact")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stream-mib", type=int, default=1024, help="size of the streamed artifact")
    parser.add_argument("--calls", type=int, default=300, help="small synchronous calls timed")
    args = parser.parse_args()
    template, name = f"mcpt_art_bench_t_{uuid.uuid4().hex[:6]}", f"mcpt_art_bench_{uuid.uuid4().hex[:6]}"
    migrate.upgrade(Settings(database_url=support.create_database(template)))
    (ROOT / ".cache").mkdir(exist_ok=True)
    try:
        database_url = support.create_database(name, template=template)
        with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as scratch:
            throughput(database_url, args.mib, args.rounds, Path(scratch))
            support.drop_database(name)  # its gigabytes of chunks go before the stacks start
            streaming(template, args.stream_mib, args.calls, Path(scratch))
    finally:
        support.drop_database(name)
        support.drop_database(template)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
