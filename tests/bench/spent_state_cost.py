"""What the one-use ``requestState`` record costs an MRTR round (run by hand; never collected).

    .venv/bin/python tests/bench/spent_state_cost.py [--runs 300]

Two numbers on a scratch database ``mcp_perf_spent``: the spend statement alone (``ApiStore.
spend_request_state``, one INSERT … ON CONFLICT per call, as a round runs it), and the retry
round of ``test_tool_with_task`` end to end (round one asks, the timed retry carries the
answer and the sealed state, spends it and creates the task) on a test stack, one at a time.
The statement's p50 is what the shared record adds to each round that advances.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import ApiStore, migrate  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_spent"
CAPS: dict[str, Any] = {"elicitation": {}}
ANSWER = {"user_name": {"action": "accept", "content": {"name": "Alice"}}}


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9)]
    return f"p50 {statistics.median(ordered) * 1000:.3f} ms, p90 {p90 * 1000:.3f} ms (n={len(ordered)})"


async def statement(dsn: str, runs: int) -> tuple[list[float], list[float]]:
    """(the spend's latencies, a read-only statement's on the same pool: the round trip alone)."""
    store = ApiStore(Settings(database_url=dsn))
    await store.open()
    try:
        spends, reads = [], []
        for _ in range(runs):
            started = time.perf_counter()
            assert await store.spend_request_state(uuid.uuid4().hex, time.time() + 60)
            spends.append(time.perf_counter() - started)
            started = time.perf_counter()
            await store.schema_revision()
            reads.append(time.perf_counter() - started)
        return spends, reads
    finally:
        await store.close()


def rounds(stack: support.Stack, runs: int) -> list[float]:
    client = stack.client()
    samples = []
    for _ in range(runs):
        params = {"name": "test_tool_with_task", "arguments": {}, "_meta": support.meta(True, **CAPS)}
        first = client.request("tools/call", params).result
        retry = {**params, "inputResponses": ANSWER, "requestState": first["requestState"]}
        started = time.perf_counter()
        created = client.request("tools/call", retry).result
        samples.append(time.perf_counter() - started)
        assert created["resultType"] == "task", created
    client.close()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    try:
        spends, reads = asyncio.run(statement(dsn, args.runs))
        print("spend statement (INSERT, commit):", percentiles(spends))
        print("read statement (round trip only):", percentiles(reads))
        with support.running_stack("spent", dsn, support.REDIS_URL, "perfspent") as stack:
            print("retry round (spend + create):", percentiles(rounds(stack, args.runs)))
    finally:
        support.drop_database(DB)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
