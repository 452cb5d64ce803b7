"""Benchmark of garbage collection under polling (run by hand; pytest never collects this file).

    .venv/bin/python tests/bench/gc_bench.py [--rows 100000] [--rounds 1]

Starts its own embedded PostgreSQL and Redis (``tests/faults/services.py``) and an API process,
creates one live task, inserts ``--rows`` expired tasks by SQL (one in ten with an answered
input request), then runs ``collect_garbage`` (batches of 1000, at most 100 batches a run) while
one client polls tasks/get on the live task. Prints tasks/get p50/p99 before and during the
collection and the deletion rate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.faults.gc_load import collect_while_polling, insert_expired  # noqa: E402
from tests.faults.services import fault_services  # noqa: E402
from tests.faults.stack import FaultClient, FaultStack, running  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="expired tasks to collect per round")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with fault_services() as services:
        database_url = services.create_database("gc_bench")
        stack = FaultStack("gc-bench", database_url, services.broker.url, services.root / "runs" / "gc-bench")
        with running(stack):
            stack.start_api()
            client = FaultClient(stack.url, "alice")
            stack.closing(client)
            live = client.create(0).task_id
            assert live is not None
            for n in range(args.rounds):
                insert_expired(stack, args.rows, prefix=f"expired-{n}-")
                run = collect_while_polling(stack, live)
                left = stack.query_one("SELECT count(*) AS n FROM mcp_tasks WHERE expires_at < now()")
                remaining = left["n"] if left else "?"
                print(f"round {n + 1}: {args.rows} expired rows: {run.summary()}; {remaining} left")
                if run.failures:
                    print(f"  {len(run.failures)} failed polls, e.g. {run.failures[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
