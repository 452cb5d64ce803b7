"""Where a lone noop task's time goes, from create to completed (run by hand; never collected).

    .venv/bin/python tests/bench/noop_latency.py [--runs 150] [--broker redis://127.0.0.1:6379/7]
        [--set MCP_TASKS_DISPATCH_AHEAD_SECONDS=0 ...]

Starts a test stack (scratch database ``mcp_perf_e2e``), then creates ``noop`` tasks one after
the other, each polled with tasks/get every millisecond until ``completed``. Prints the p50 end
to end as the client saw it, and from the rows (first 20 runs left out as warm-up): created →
dispatched (the fair publisher released it), dispatched → started (the release commit, the
publish, Celery handing it to a child, the claim's start), started → finished.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402

DB = "mcp_perf_e2e"
WARM_UP = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.set)
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    try:
        with support.running_stack("e2e", dsn, args.broker, "perfe2e", **extra) as stack:
            client = stack.client()
            params = {"name": "noop", "arguments": {}, "_meta": support.meta(True)}
            seen = []
            for _ in range(WARM_UP + args.runs):
                started = time.monotonic()
                task_id = client.request("tools/call", params).result["taskId"]
                while client.get(task_id).result["status"] != "completed":
                    time.sleep(0.001)
                seen.append((time.monotonic() - started) * 1e3)
            client.close()
            with stack.db() as conn:
                rows = conn.execute(
                    "SELECT EXTRACT(EPOCH FROM dispatched_at - created_at) * 1000,"
                    " EXTRACT(EPOCH FROM started_at - dispatched_at) * 1000,"
                    " EXTRACT(EPOCH FROM finished_at - started_at) * 1000"
                    " FROM mcp_tasks WHERE tool_name = 'noop' ORDER BY created_at OFFSET %s",
                    (WARM_UP,),
                ).fetchall()
    finally:
        support.drop_database(DB)

    def p50(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ms"

    print(
        f"{args.runs} runs: end to end p50 {p50(seen[WARM_UP:])}; created -> dispatched "
        f"{p50([float(r[0]) for r in rows])}, dispatched -> started {p50([float(r[1]) for r in rows])}, "
        f"started -> finished {p50([float(r[2]) for r in rows])}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
