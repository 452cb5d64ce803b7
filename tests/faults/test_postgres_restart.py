"""PostgreSQL stopped for a few seconds under load, then started again; nothing else restarts.

During the outage every request gets a prompt JSON-RPC error (-32603, HTTP 503): no hang, no HTML
500, no dropped connection. Afterwards the API's pool and its LISTEN connection, the workers and
the maintenance jobs find the database again by themselves, and every task handed out completes.
"""

from __future__ import annotations

import time

import pytest
from mcp_types import jsonrpc as codes

from tests import support
from tests.faults.services import FaultServices
from tests.faults.stack import (
    FaultClient,
    FaultStack,
    Load,
    assert_each_completed_once,
    assert_principals_isolated,
    percentile,
    running,
    wait_all_terminal,
)

OUTAGE_S = 3.0
# A request waits this long for a pooled connection before it gives up (default 5 s): shorter than
# the outage, so the outage shows as 503 answers rather than as requests that wait it out.
POOL_WAIT_S = 1.0
ANSWER_BOUND_S = 10.0
RECOVERY_BOUND_S = 10.0


def first_success_after(load: Load, moment: float) -> float | None:
    """When the first successful answer after ``moment`` arrived (seconds since the load began)."""
    ends = [c.started + c.seconds for c in load.calls if c.ok and c.started + c.seconds > moment]
    return min(ends) if ends else None


@pytest.mark.slow
def test_postgres_restart_under_load_answers_503_promptly_then_recovers(
    services: FaultServices, fault_db: str
) -> None:
    stack = FaultStack(
        "pg-restart",
        fault_db,
        services.broker.url,
        services.root / "runs" / "pg-restart",
        MCP_TASKS_DB_CONNECT_TIMEOUT_SECONDS=str(POOL_WAIT_S),
    )
    with running(stack):
        stack.start_all()
        api_pid = stack.procs["api"].popen.pid
        load = Load(stack.url, creators=2, pollers=2, job_ms=(0, 50, 300)).start()
        try:
            support.wait_until(lambda: len(load.received) >= 40, 30, what="some load before the outage")
            stopping_at = load.now()
            services.postgres.stop()
            down_at = load.now()
            try:
                time.sleep(OUTAGE_S)  # deliberate: the outage itself
            finally:
                starting_at = load.now()
                services.postgres.start()
            up_at = load.now()
            recovered_at = support.wait_until(
                lambda: first_success_after(load, up_at), 30, 0.1, what="requests to succeed again"
            )
            after = len(load.received)
            support.wait_until(lambda: len(load.received) >= after + 40, 30, what="load after recovery")
        finally:
            load.stop()
        db_up = stack.db_now()

        unanswered = [c.describe() for c in load.calls if c.failure]
        assert not unanswered, unanswered[:5]
        slow = [c.describe() for c in load.calls if c.seconds >= ANSWER_BOUND_S]
        assert not slow, slow[:5]
        wrong = [
            c.describe()
            for c in load.calls
            if not c.ok and (c.status != 503 or c.error_code != codes.INTERNAL_ERROR)
        ]
        assert not wrong, wrong[:5]
        errors = [c for c in load.calls if not c.ok]
        assert errors, "no request noticed the outage"
        assert not any(c.ok for c in load.calls if down_at <= c.started + c.seconds <= starting_at)
        assert recovered_at - up_at < RECOVERY_BOUND_S
        # Once it answers again, it keeps answering.
        relapses = [c.describe() for c in errors if c.started > recovered_at]
        assert not relapses, relapses[:5]
        assert stack.procs["api"].popen.poll() is None and stack.procs["api"].popen.pid == api_pid

        # The event hub listens again, the maintenance jobs run again, every task ends once.
        support.wait_until(
            lambda: stack.query_one(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'mcp-celery-tasks-events' "
                "AND query LIKE 'LISTEN%%'"
            ),
            15,
            0.1,
            what="the event hub to LISTEN again",
        )
        stack.wait_sweeps(after=db_up)
        rows = wait_all_terminal(stack, 60)
        # A run that ends while Postgres is down may lose its outcome and run again (see
        # test_job_finishing_during_a_postgres_outage_is_not_run_again); it still completes once.
        summary = assert_each_completed_once(stack, load.received, rows, unrecorded_reruns=True)
        assert_principals_isolated(stack, load.received)
        seconds = [c.seconds for c in errors]
        print(
            f"\npostgres restart: stop took {down_at - stopping_at:.1f} s, "
            f"start {up_at - starting_at:.1f} s; {len(errors)} requests answered 503 "
            f"(p50 {percentile(seconds, 50):.3f} s, max {max(seconds):.3f} s); "
            f"requests succeed again {recovered_at - up_at:.2f} s after the start; "
            f"{len(load.received)} tasks handed out, {dict(summary)}"
        )


def test_job_finishing_during_a_postgres_outage_is_not_run_again(
    services: FaultServices, fault_db: str
) -> None:
    stack = FaultStack("pg-finish", fault_db, services.broker.url, services.root / "runs" / "pg-finish")
    with running(stack):
        stack.start_worker()
        stack.start_api()
        stack.wait_worker_ready()
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        call = client.create(1000)
        task_id = call.task_id
        assert task_id, call.describe()
        support.wait_until(lambda: stack.marks(task_id)["start"], 20, what="the job to start")
        services.postgres.stop()
        try:
            support.wait_until(lambda: stack.marks(task_id)["end"], 10, what="the run to end")
            time.sleep(5.0)  # deliberate: the outage outlasts the worker's retries to record it
        finally:
            services.postgres.start()
        rows = wait_all_terminal(stack, 60)
        assert rows[task_id]["status"] == "completed"
        marks = stack.marks(task_id)
        assert marks["end"] == 1, f"the tool ran to completion {marks['end']} times: {dict(marks)}"


LONG_OUTAGE_S = 8.0
PROMPT_RECOVERY_S = 3.0


@pytest.mark.slow
def test_api_answers_again_soon_after_a_long_postgres_outage(services: FaultServices, fault_db: str) -> None:
    stack = FaultStack(
        "pg-long",
        fault_db,
        services.broker.url,
        services.root / "runs" / "pg-long",
        MCP_TASKS_DB_CONNECT_TIMEOUT_SECONDS=str(POOL_WAIT_S),
    )
    with running(stack):
        stack.start_api()  # no worker needed: tasks/get reads the row
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        call = client.create(0)
        assert call.task_id, call.describe()
        load = Load(stack.url, creators=0, pollers=1)
        load.received[call.task_id] = "alice"
        load.start()
        try:
            support.wait_until(lambda: len(load.calls) >= 20, 10, what="some polling")
            services.postgres.stop()
            down_at = load.now()
            try:
                time.sleep(LONG_OUTAGE_S)  # deliberate: the outage itself
            finally:
                services.postgres.start()
            up_at = load.now()
            recovered_at = support.wait_until(
                lambda: first_success_after(load, up_at), 60, 0.1, what="tasks/get to succeed again"
            )
        finally:
            load.stop()
        failed = [c for c in load.calls if not c.ok]
        assert failed and all(c.status == 503 and c.error_code == codes.INTERNAL_ERROR for c in failed)
        print(
            f"\nlong outage: {len(failed)} answers 503 (max {max(c.seconds for c in failed):.2f} s) during "
            f"{up_at - down_at:.1f} s; tasks/get succeeds again {recovered_at - up_at:.1f} s after the start"
        )
        assert recovered_at - up_at < PROMPT_RECOVERY_S


def test_request_during_an_outage_waits_at_most_the_configured_bound(
    services: FaultServices, fault_db: str
) -> None:
    stack = FaultStack(
        "pg-bound",
        fault_db,
        services.broker.url,
        services.root / "runs" / "pg-bound",
        MCP_TASKS_DB_CONNECT_TIMEOUT_SECONDS=str(POOL_WAIT_S),
    )
    with running(stack):
        stack.start_api()
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        created = client.create(0)
        assert created.task_id, created.describe()
        services.postgres.stop()
        try:
            calls = [client.get(created.task_id) for _ in range(3)]
        finally:
            services.postgres.start()
        assert all(c.status == 503 and c.error_code == codes.INTERNAL_ERROR for c in calls), calls
        took = [round(c.seconds, 2) for c in calls]
        assert max(took) < POOL_WAIT_S + 0.5, f"configured bound {POOL_WAIT_S} s, answers took {took} s"
