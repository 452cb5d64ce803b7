"""Create latency with and without an idempotency key, same round, alternating (run by hand).

    .venv/bin/python tests/bench/idempotency_bench.py [--segments 6] [--calls 200]

Starts an API and a prefork worker (scratch database ``mcp_perf_idem``) and sends task-augmented
``tools/call`` of ``noop`` over one keep-alive connection, three kinds taking turns call by
call: no key (every call before this feature), a fresh key per call (a client that always sends
one: one indexed read, then the insert also maintains the partial unique index), and the same
key again (a retry: the read finds the task, nothing is inserted or published). Interleaved, so
their ratio means something on a noisy machine. Prints each kind's median p50 and p90 over the
segments, and the cost relative to no key.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from mcp_celery_tasks.wire import IDEMPOTENCY_KEY_META_KEY  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_idem"
KINDS = ("no key", "fresh key", "same key (replay)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--segments", type=int, default=6, help="segments of each kind")
    parser.add_argument("--calls", type=int, default=200, help="calls of each kind per segment")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    args = parser.parse_args()
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    env = support.stack_env(dsn, args.broker, "perfidem", MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL="0")
    worker = support.start_worker("idem-bench-worker", env)
    api = None
    try:
        api, url = support.start_api("idem-bench-api", env)
        with httpx.Client(timeout=30) as http:
            _segment(http, url, 50)  # warm-up: connections, caches, the worker
            runs = [_segment(http, url, args.calls) for _ in range(args.segments)]
        base = statistics.median(run["no key"][0] for run in runs)
        for kind in KINDS:
            p50s = [run[kind][0] for run in runs]
            p50 = statistics.median(p50s)
            print(
                f"{kind:18} create p50 {p50:.3f} ms (segments {min(p50s):.3f}-{max(p50s):.3f}),"
                f" p90 {statistics.median(run[kind][1] for run in runs):.3f} ms,"
                f" {100 * (p50 / base - 1):+.1f} % vs no key"
            )
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(DB)
    return 0


def _segment(http: httpx.Client, url: str, calls: int) -> dict[str, tuple[float, float]]:
    """Kind -> (p50, p90) in ms of ``calls`` creates of each kind, the kinds taking turns call
    by call (the order rotating), so a noisy neighbour slows them all alike."""
    replayed = f"bench-{uuid.uuid4()}"
    took: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for i in range(calls):
        for kind in KINDS[i % 3 :] + KINDS[: i % 3]:
            meta = support.meta()
            if kind == "fresh key":
                meta[IDEMPOTENCY_KEY_META_KEY] = f"bench-{uuid.uuid4()}"
            elif kind != "no key":
                meta[IDEMPOTENCY_KEY_META_KEY] = replayed
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
            body["params"] = {"name": "noop", "arguments": {}, "_meta": meta}
            headers = {
                "MCP-Protocol-Version": support.VERSION,
                "Mcp-Method": "tools/call",
                "Mcp-Name": "noop",
            }
            headers["Accept"] = "application/json, text/event-stream"
            start = time.perf_counter()
            answer = http.post(url, json=body, headers=headers)
            took[kind].append((time.perf_counter() - start) * 1000)
            if answer.status_code != 200 or answer.json().get("result", {}).get("resultType") != "task":
                raise SystemExit(f"{kind}: {answer.status_code} {answer.text[:300]}")
    return {kind: (statistics.median(t), statistics.quantiles(t, n=10)[8]) for kind, t in took.items()}


if __name__ == "__main__":
    raise SystemExit(main())
