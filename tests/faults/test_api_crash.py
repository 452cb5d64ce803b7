"""The API SIGKILLed under load, then restarted on the same port.

Whatever the dead process had committed but not yet published (the publisher thread's queue), or
published but not yet marked dispatched, is the outbox's: the sweeper publishes rows still
undispatched after a few seconds, and a duplicate job is absorbed by the claim.
"""

from __future__ import annotations

import pytest

from tests import support
from tests.faults.services import FaultServices
from tests.faults.stack import (
    FaultStack,
    Load,
    assert_each_completed_once,
    assert_principals_isolated,
    running,
    wait_all_terminal,
)


@pytest.mark.slow
def test_api_killed_under_load_loses_no_task(services: FaultServices, fault_db: str) -> None:
    stack = FaultStack("api-kill", fault_db, services.broker.url, services.root / "runs" / "api-kill")
    with running(stack):
        stack.start_all()
        load = Load(stack.url, creators=3, pollers=1).start()
        try:
            support.wait_until(lambda: len(load.received) >= 60, 30, what="some load before the kill")
            stack.kill("api")
            killed_at = load.now()
            undispatched = stack.query_one(
                "SELECT count(*) AS n FROM mcp_tasks WHERE dispatched_at IS NULL AND status = 'working'"
            )
            stack.start_api()
            restarted_at = load.now()
            before = len(load.received)
            support.wait_until(lambda: len(load.received) >= before + 60, 30, what="load after the restart")
        finally:
            load.stop()

        rows = wait_all_terminal(stack, 45)
        summary = assert_each_completed_once(stack, load.received, rows)
        # Jobs published twice (by the dead API and again by the sweeper) are claimed once.
        assert summary["attempts=1"] == len(load.received), summary
        assert_principals_isolated(stack, load.received)
        # Rows the dead publisher sent but never marked stay undispatched after they end: harmless.
        unmarked = sum(r["dispatched_at"] is None for r in rows.values())
        lost = [c for c in load.calls if c.failure]
        answered = [c for c in load.calls if not c.failure]
        assert all(c.ok for c in answered), [c.describe() for c in answered if not c.ok][:5]
        assert all(killed_at - 1 <= c.started <= restarted_at for c in lost), [c.describe() for c in lost][:5]
        print(
            f"\napi kill: {len(load.received)} tasks handed out, {len(lost)} requests without an answer "
            f"while the API was down ({restarted_at - killed_at:.1f} s), "
            f"{undispatched['n'] if undispatched else '?'} rows undispatched right after the kill, "
            f"{unmarked} ended without a dispatch mark"
        )
