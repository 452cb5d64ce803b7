"""The input round trip of the ``ask`` fixture, as a timeline (run by hand; never collected).

    .venv/bin/python tests/bench/input_rtt.py [--runs 200] [--broker redis://127.0.0.1:6379/7]

Starts a test stack (one API, one prefork worker, scratch database ``mcp_perf_rtt``), then runs
``ask`` ``--runs`` times, one at a time: create, poll until ``input_required``, answer with
``tasks/update``, poll tasks/get every millisecond until ``completed``. Each run's timeline, on
one clock (this machine's): the update sent, its ack, the answer's commit (``answered_at``, the
update's transaction), the wake-up (the worker's ``input wait`` span end, from the span file),
the outcome written (``finished_at``), the client seeing ``completed``. Prints p50/p90 of each
segment and of ``ack -> completed`` (what shared/bench S4 reports; S4 polls every 5 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks.settings import Settings  # noqa: E402
from mcp_celery_tasks.store import migrate  # noqa: E402
from tests import support  # noqa: E402


class TraceEnv(TypedDict, total=False):
    """What this script adds to the stack's environment (a TypedDict: the keys are known)."""

    MCP_TASKS_TRACE_FILE: str


DB = "mcp_perf_rtt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--no-trace", action="store_true", help="no span file (no wake-up split)")
    args = parser.parse_args()
    support.drop_database(DB)
    dsn = support.create_database(DB)
    migrate.upgrade(Settings(database_url=dsn))
    spans = Path(tempfile.mkdtemp(prefix="input-rtt-")) / "spans.jsonl"
    extra: TraceEnv = {} if args.no_trace else {"MCP_TASKS_TRACE_FILE": str(spans)}
    try:
        with support.running_stack("rtt", dsn, args.broker, "perfrtt", **extra) as stack:
            runs = [one_run(stack) for _ in range(args.runs)]
            with stack.db() as conn:
                rows = {
                    r[0]: (r[1], r[2], r[3])
                    for r in conn.execute(
                        "SELECT t.task_id, EXTRACT(EPOCH FROM i.answered_at)::float,"
                        " EXTRACT(EPOCH FROM t.finished_at)::float, t.job_id"
                        " FROM mcp_tasks t JOIN mcp_task_inputs i USING (task_id)"
                    )
                }
    finally:
        support.drop_database(DB)
    wakes = {} if args.no_trace else wake_times(spans)
    report(runs, rows, wakes)
    return 0


def one_run(stack: support.Stack) -> dict[str, Any]:
    client = stack.client()
    try:
        params = {"name": "ask", "arguments": {}, "_meta": support.meta(True, elicitation={})}
        created = client.request("tools/call", params).result
        task_id = str(created["taskId"])
        deadline = time.monotonic() + 30
        while True:
            task = client.get(task_id).result
            if task["status"] == "input_required":
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{task_id} never asked: {task}")
            time.sleep(0.002)
        key = next(iter(task["inputRequests"]))
        answer = {key: {"action": "accept", "content": {"answer": "42"}}}
        sent = time.time()
        reply = client.update(task_id, answer)
        ack = time.time()
        assert reply.status == 200 and "error" not in reply.body, reply.body
        while True:
            task = client.get(task_id).result
            if task["status"] == "completed":
                break
            if time.time() > ack + 30:
                raise SystemExit(f"{task_id} never completed: {task}")
            time.sleep(0.001)
        return {"task_id": task_id, "sent": sent, "ack": ack, "seen": time.time()}
    finally:
        client.close()


def wake_times(spans: Path) -> dict[str, float]:
    """job id -> the end of its ``input wait`` span (seconds since the epoch)."""
    if not spans.exists():
        return {}
    by_trace: dict[str, dict[str, Any]] = {}
    for line in spans.read_text().splitlines():
        span = json.loads(line)
        entry = by_trace.setdefault(span["trace_id"], {})
        if span["name"] == "input wait" and "end_ns" in span:
            entry["wake"] = span["end_ns"] / 1e9
        if span["name"].startswith("execute_tool"):
            entry["job_id"] = span["attributes"].get("mcp.job_id")
    return {e["job_id"]: e["wake"] for e in by_trace.values() if e.get("job_id") and "wake" in e}


def report(
    runs: list[dict[str, Any]], rows: dict[str, tuple[float, float, str]], wakes: dict[str, float]
) -> None:
    segments: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        segments.setdefault(name, []).append(value * 1e3)

    for run in runs:
        answered, finished, job_id = rows[run["task_id"]]
        add("update sent -> ack", run["ack"] - run["sent"])
        add("update sent -> answer committed (txn start)", answered - run["sent"])
        wake = wakes.get(job_id)
        if wake is not None:
            add("answer committed -> worker woke", wake - answered)
            add("worker woke -> outcome written", finished - wake)
        add("answer committed -> outcome written", finished - answered)
        add("outcome written -> client saw completed (1 ms polls)", run["seen"] - finished)
        add("ack -> client saw completed", run["seen"] - run["ack"])
    print(f"runs {len(runs)}  (wake-ups from spans: {len(wakes)})")
    for name, values in segments.items():
        values.sort()
        p90 = values[int(len(values) * 0.9) - 1]
        print(f"  {name:<56} p50 {statistics.median(values):7.2f} ms   p90 {p90:7.2f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
