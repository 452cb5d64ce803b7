"""Races between a job finishing and its cancel, on the live stack.

Whichever lands first wins, atomically: a task ends either completed with its result or
cancelled without one, never both, and a terminal status never changes afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests import support
from tests.conftest import SUFFIX
from tests.support import TERMINAL, Stack, wait_until

TASKS = 40
JOB_MS = 60
THREADS = 2  # the stack's worker runs two jobs at a time: no backlog, so the cancels race the job


@pytest.fixture(scope="module")
def stack(template_db: str) -> Iterator[Stack]:
    """A stack of this module's own: the races need both slots free. On the shared one, what
    ran before on this xdist worker (a different set and order of files than a serial run) can
    leave jobs that hold the slots for longer: seen once under -n 2, the worker was still busy
    after the 30 s this module waits for it to be idle."""
    name = f"mcpt_{SUFFIX}_races"
    dsn = support.create_database(name, template=template_db)
    try:
        with support.running_stack("races", dsn, support.REDIS_URL, f"{SUFFIX}x") as live:
            yield live
    finally:
        support.drop_database(name)


def rows(stack: Stack, task_ids: list[str]) -> dict[str, dict[str, Any]]:
    with stack.db() as conn:
        found = conn.execute(
            "SELECT task_id, status, result IS NOT NULL, error IS NOT NULL, cancel_requested_at IS NOT NULL "
            "FROM mcp_tasks WHERE task_id = ANY(%s)",
            (task_ids,),
        ).fetchall()
    return {
        task_id: {"status": status, "has_result": has_result, "has_error": has_error, "cancel_asked": asked}
        for task_id, status, has_result, has_error, asked in found
    }


def stays(predicate: Any, seconds: float, interval: float = 0.1) -> None:
    """Assert ``predicate`` holds at every check during ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate()
        time.sleep(interval)
    assert predicate()


def worker_idle(stack: Stack) -> bool:
    """No job is queued or running (earlier tests' work would delay these jobs past their cancels)."""
    with stack.db() as conn:
        found = conn.execute(
            "SELECT count(*) FROM mcp_tasks WHERE status IN ('working', 'input_required') "
            "OR (started_at IS NOT NULL AND finished_at IS NULL)"
        ).fetchone()
    return found is not None and found[0] == 0


def let_go(stack: Stack, task_id: str) -> bool:
    """The worker is done with the task: it finished it, stopped it, or never started it."""
    with stack.db() as conn:
        found = conn.execute(
            "SELECT status IN ('completed', 'failed', 'cancelled') "
            "AND (started_at IS NULL OR finished_at IS NOT NULL) FROM mcp_tasks WHERE task_id = %s",
            (task_id,),
        ).fetchone()
    return bool(found and found[0])


def test_many_cancels_fired_around_completion_settle_each_task_exactly_once(stack: Stack) -> None:
    wait_until(lambda: worker_idle(stack), 30, 0.1, what="the worker to be idle")
    delays = [0.020 + 0.080 * i / (TASKS - 1) for i in range(TASKS)]

    def start_then_cancel(delay: float) -> str:
        c = stack.client()
        try:
            task_id = c.start("sleep_ms", {"ms": JOB_MS})
            # Deliberate: the cancel is aimed at a moment around the job's end, not a wait.
            time.sleep(delay)
            ack = c.cancel(task_id).result
            assert ack["resultType"] == "complete", ack
            # Keep the worker free for the next task, so that each cancel races a running job
            # rather than a queued one.
            wait_until(lambda: let_go(stack, task_id), 15, 0.01, what="the worker to let go")
            return task_id
        finally:
            c.close()

    with ThreadPoolExecutor(THREADS) as pool:
        task_ids = list(pool.map(start_then_cancel, delays))
    assert len(set(task_ids)) == TASKS

    settled = wait_until(
        lambda: (
            (found := rows(stack, task_ids))
            and len(found) == TASKS
            and all(r["status"] in TERMINAL for r in found.values())
            and found
        ),
        20,
        0.1,
        what="every task to be terminal",
    )

    cancelled = {t for t, r in settled.items() if r["status"] == "cancelled"}
    completed = {t for t, r in settled.items() if r["status"] == "completed"}
    assert cancelled | completed == set(task_ids), {
        t: r for t, r in settled.items() if r["status"] == "failed"
    }
    for task_id in cancelled:
        row = settled[task_id]
        assert not row["has_result"] and not row["has_error"], (task_id, row)
        assert row["cancel_asked"], (task_id, row)
    for task_id in completed:
        row = settled[task_id]
        assert row["has_result"] and not row["has_error"], (task_id, row)
        # A cancel that came after completion must not have touched the row.
        assert not row["cancel_asked"], (task_id, row)

    # The API tells the same story as the database.
    c = stack.client()
    try:
        assert {t: c.get(t).result["status"] for t in task_ids} == {
            t: r["status"] for t, r in settled.items()
        }
    finally:
        c.close()

    # Terminal is final: nothing changes while the stragglers (late results, stop marks) land.
    stays(lambda: rows(stack, task_ids) == settled, 1.0)
    print(f"\nraces: {len(completed)} completed, {len(cancelled)} cancelled of {TASKS}")
