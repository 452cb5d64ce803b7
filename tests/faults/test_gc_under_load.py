"""Garbage collection of a backlog of expired tasks while a client polls a live one.

collect_garbage deletes in batches of 1000, each its own short transaction, so tasks/get never
waits behind it; every expired row (and its input requests) goes, the live task stays.
"""

from __future__ import annotations

from tests.faults.gc_load import collect_while_polling, insert_expired
from tests.faults.services import FaultServices
from tests.faults.stack import FaultClient, FaultStack, percentile, running

BACKLOG = 20_000
GET_P99_BOUND_S = 0.050


def test_gc_of_an_expired_backlog_keeps_tasks_get_fast(services: FaultServices, fault_db: str) -> None:
    stack = FaultStack("gc-load", fault_db, services.broker.url, services.root / "runs" / "gc-load")
    with running(stack):
        stack.start_api()  # no worker: the live task stays working, as a long job would
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        created = client.create(0)
        live = created.task_id
        assert live, created.describe()
        insert_expired(stack, BACKLOG)

        run = collect_while_polling(stack, live)

        assert not run.failures, run.failures[:5]
        assert run.deleted == BACKLOG
        left = stack.query_one(
            "SELECT (SELECT count(*) FROM mcp_tasks WHERE expires_at < now()) AS tasks, "
            "(SELECT count(*) FROM mcp_task_inputs) AS inputs"
        )
        assert left == {"tasks": 0, "inputs": 0}
        assert client.get(live).result["status"] == "working"
        row = stack.query_one("SELECT last_count FROM mcp_maintenance WHERE job = 'collect_garbage'")
        assert row == {"last_count": BACKLOG}
        assert len(run.during) >= 20, run.summary()
        print(f"\ngc of {BACKLOG} rows: {run.summary()}")
        assert percentile(run.during, 99) < GET_P99_BOUND_S, run.summary()
