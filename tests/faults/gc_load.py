"""Garbage collection of a large backlog while a client polls: shared by the fault test and
``tests/bench/gc_bench.py``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from mcp_celery_tasks.maintenance import gc
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from tests.faults.stack import FaultClient, FaultStack, percentile

INSERT_EXPIRED = """
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, status_message, result,
    created_at, last_updated_at, ttl_ms, retention_ms, poll_interval_ms, expires_at, queue,
    dispatched_at, attempts, max_attempts, worker, started_at, finished_at, protocol_version,
    client_capabilities, client_info)
SELECT %(prefix)s || g, %(prefix)s || 'job-' || g, 'token:alice', 'f_count', '{"ms": 0}', 'completed',
    'done', '{"content": [{"type": "text", "text": "{\\"run\\": \\"0123456789ab\\"}"}], "isError": false}',
    now() - interval '3 hours', now() - interval '2 hours', 3600000, 3600000, 100,
    now() - interval '1 hour' - g * interval '1 millisecond', 'mcp.default', now() - interval '3 hours', 1, 3,
    'host:1:abcd', now() - interval '3 hours', now() - interval '2 hours', '2026-07-28',
    '{"extensions": {"io.modelcontextprotocol/tasks": {}}}', '{"name": "bench", "version": "0"}'
FROM generate_series(1, %(rows)s) AS g
"""

# One in ten expired tasks asked for input: the delete cascades to those rows too.
INSERT_INPUTS = """
INSERT INTO mcp_task_inputs (task_id, key, method, params, params_hash, response, answered_at)
SELECT %(prefix)s || g, 'confirm', 'elicitation/create',
    '{"message": "Go?", "requestedSchema": {"type": "object"}}', 'h', '{"action": "accept"}', now()
FROM generate_series(10, %(rows)s, 10) AS g
"""


def insert_expired(stack: FaultStack, rows: int, prefix: str = "expired-") -> None:
    with stack.db() as conn:
        conn.execute(INSERT_EXPIRED, {"prefix": prefix, "rows": rows})
        conn.execute(INSERT_INPUTS, {"prefix": prefix, "rows": rows})
        conn.execute("ANALYZE mcp_tasks")
        conn.execute("ANALYZE mcp_task_inputs")


@dataclass
class GcRun:
    deleted: int
    seconds: float
    before: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"deleted {self.deleted} rows in {self.seconds:.2f} s "
            f"({self.deleted / self.seconds:,.0f} rows/s); tasks/get before: "
            f"p50 {percentile(self.before, 50) * 1000:.1f} ms, "
            f"p99 {percentile(self.before, 99) * 1000:.1f} ms; "
            f"during GC: p50 {percentile(self.during, 50) * 1000:.1f} ms, "
            f"p99 {percentile(self.during, 99) * 1000:.1f} ms, max {max(self.during) * 1000:.1f} ms "
            f"over {len(self.during)} calls"
        )


def collect_while_polling(stack: FaultStack, task_id: str, who: str = "alice", baseline: int = 200) -> GcRun:
    """Poll tasks/get on ``task_id`` (a baseline first), and run ``collect_garbage`` meanwhile."""
    client = FaultClient(stack.url, who)
    store = WorkerStore(Settings(database_url=stack.database_url), application_name="faults-gc")
    try:
        run = GcRun(0, 0.0)
        for _ in range(baseline):
            call = client.get(task_id)
            run.before.append(call.seconds)
        outcome: dict[str, float] = {}

        def collect() -> None:
            started = time.monotonic()
            outcome["deleted"] = gc.collect_garbage(store)
            outcome["seconds"] = time.monotonic() - started

        collector = threading.Thread(target=collect, name="faults-gc")
        collector.start()
        while collector.is_alive():
            call = client.get(task_id)
            run.during.append(call.seconds)
            if not call.ok:
                run.failures.append(call.describe())
        collector.join()
        run.deleted = int(outcome["deleted"])
        run.seconds = outcome["seconds"]
        return run
    finally:
        store.close()
        client.close()
