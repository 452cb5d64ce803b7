"""Suspend at scale (issue 27), run by hand; never collected.

    .venv/bin/python tests/bench/suspend_bench.py [--resumes 200] [--suspended 10000] [--noops 1000]

Starts its own stack (one API, one prefork worker with 2 slots, scratch database
``mcp_perf_suspend``, Redis db 8) where every job suspends as soon as it asks
(``MCP_TASKS_SUSPEND_AFTER_SECONDS=0``), then measures:

1. resume latency: ``sp_timed_ask`` suspends; the client answers; from the update's ack (client
   clock) to the tool running past its question (the tool's own ``time.time()``, same machine);
2. bob's ``--noops`` noops drained on the 2 slots, before and after alice has ``--suspended``
   suspended tasks stored (their drain rate should not change);
3. API and worker RSS before and after the suspended tasks;
4. ``tasks/get`` p50/p99 on a suspended task and on a completed one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_suspend"
TOKENS = {"alice": "alice-secret", "bob": "bob-secret"}
ELICITING = support.meta(True, elicitation={})


def pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1] if len(samples) > 1 else samples[0]


def rss_mb(pid: int) -> float:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.memory_info().rss for p in procs) / 2**20


def count(dsn: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def start_ask(client: support.Client, tool: str) -> str:
    reply = client.request("tools/call", {"name": tool, "arguments": {}, "_meta": ELICITING})
    return str(reply.result["taskId"])


def is_suspended(dsn: str, task_id: str) -> bool:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT suspended_at IS NOT NULL FROM mcp_tasks WHERE task_id = %s", (task_id,)
        ).fetchone()
    return bool(row and row[0])


def resume_latency(url: str, dsn: str, runs: int) -> list[float]:
    alice = support.Client(url, token=TOKENS["alice"])
    samples = []
    for _ in range(runs):
        task_id = start_ask(alice, "sp_timed_ask")
        support.wait_until(lambda t=task_id: is_suspended(dsn, t), 30, 0.002, what="the suspend")  # type: ignore[misc]
        reply = alice.update(task_id, {"go": {"action": "accept", "content": {"answer": "y"}}})
        acked = time.time()
        assert reply.status == 200, reply.body
        done = alice.wait_status(task_id, timeout=30)
        samples.append(float(done["result"]["content"][0]["text"]) - acked)
    alice.close()
    return samples


def ms(samples: list[float]) -> str:
    return f"{pct(samples, 50) * 1000:.2f}/{pct(samples, 99) * 1000:.2f} ms"


def drain(url: str, dsn: str, noops: int) -> float:
    bob = support.Client(url, token=TOKENS["bob"])
    before = count(dsn, "SELECT count(*) FROM mcp_tasks WHERE tool_name = 'noop' AND status = 'completed'")
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        clients = [support.Client(url, token=TOKENS["bob"]) for _ in range(8)]
        list(pool.map(lambda n: clients[n % 8].start("noop"), range(noops)))
    support.wait_until(
        lambda: (
            count(dsn, "SELECT count(*) FROM mcp_tasks WHERE tool_name = 'noop' AND status = 'completed'")
            >= before + noops
        ),
        600,
        0.05,
        what="the noops to drain",
    )
    for client in clients:
        client.close()
    bob.close()
    return time.monotonic() - started


def get_latencies(url: str, task_id: str, who: str, n: int = 500) -> list[float]:
    client = support.Client(url, token=TOKENS[who])
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        assert client.get(task_id).status == 200
        samples.append(time.perf_counter() - started)
    client.close()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--resumes", type=int, default=200)
    parser.add_argument("--suspended", type=int, default=10_000)
    parser.add_argument("--noops", type=int, default=1000)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/8")
    args = parser.parse_args()
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    marks = Path(tempfile.mkdtemp(prefix="suspend-bench-"))
    tools = json.dumps([*json.loads(support.TEST_TOOL_MODULES), "tests.fixtures.suspend"])
    env = support.stack_env(
        dsn,
        args.broker,
        "perfsusp",
        **{
            "MCP_TASKS_AUTH_TOKENS": json.dumps(TOKENS),
            "MCP_TASKS_TOOL_MODULES": tools,
            "MCP_TASKS_SUSPEND_AFTER_SECONDS": "0",
            "MCP_TASKS_MAX_SUSPENDED_PER_PRINCIPAL": "0",
            "MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL": "0",
            "MCP_TEST_SUSPEND_MARKS": str(marks),
        },
    )
    worker = support.start_worker("suspend-bench-worker", env, concurrency=2)
    api = None
    try:
        api, url = support.start_api("suspend-bench-api", env)
        bob = support.Client(url, token=TOKENS["bob"])
        bob.wait_status(bob.start("noop"), timeout=60)
        drain(url, dsn, 100)  # warm-up

        resumes = resume_latency(url, dsn, args.resumes)
        print(f"resume latency (update ack -> tool past its question), {len(resumes)} runs: "
              f"p50 {pct(resumes, 50) * 1000:.1f} ms, p99 {pct(resumes, 99) * 1000:.1f} ms")  # fmt: skip

        base_drain = drain(url, dsn, args.noops)
        api_before, worker_before = rss_mb(api.popen.pid), rss_mb(worker.popen.pid)
        done_task = bob.start("noop")
        bob.wait_status(done_task)
        done_gets = get_latencies(url, done_task, "bob")

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            clients = [support.Client(url, token=TOKENS["alice"]) for _ in range(8)]
            ids = list(pool.map(lambda n: start_ask(clients[n % 8], "sp_timed_ask"), range(args.suspended)))
        support.wait_until(
            lambda: (
                count(dsn, "SELECT count(*) FROM mcp_tasks WHERE suspended_at IS NOT NULL") >= args.suspended
            ),
            3600,
            0.5,
            what="every task to suspend",
        )
        parked_s = time.monotonic() - started
        api_after, worker_after = rss_mb(api.popen.pid), rss_mb(worker.popen.pid)
        suspended_gets = get_latencies(url, ids[len(ids) // 2], "alice")
        loaded_drain = drain(url, dsn, args.noops)
        still = count(dsn, "SELECT count(*) FROM mcp_tasks WHERE suspended_at IS NOT NULL")
        print(f"{args.suspended} tasks created and suspended in {parked_s:.1f} s "
              f"({args.suspended / parked_s:.0f}/s); {still} still suspended after bob's drain")  # fmt: skip
        ratio = loaded_drain / base_drain
        print(f"bob's {args.noops} noops on 2 slots: {base_drain:.2f} s with none suspended, "
              f"{loaded_drain:.2f} s with {args.suspended} suspended (ratio {ratio:.3f})")  # fmt: skip
        print(f"RSS API {api_before:.0f} -> {api_after:.0f} MB, worker tree {worker_before:.0f} -> "
              f"{worker_after:.0f} MB")  # fmt: skip
        print(f"tasks/get p50/p99: completed {ms(done_gets)}, suspended {ms(suspended_gets)}")
        for client in clients:
            client.close()
        bob.close()
    finally:
        if api is not None:
            api.stop()
        worker.stop(timeout=30)
        support.drop_database(DB)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
