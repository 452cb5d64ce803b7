"""The watchdog's two blind spots (issue 28), on real processes: the suite's short lease (3 s), a
lease grace of 1 s and a sweeper every second (``FAST_RECOVERY``), tools that never cooperate.

1. A pool child frozen within its job's first watchdog tick (SIGSTOP of the child, or of the
   whole worker, right after the claim) loses the job to another worker; when it comes back its
   body must not run on alongside the new run. Frozen a tick past the takeover, it is killed
   before it wakes; woken right at the takeover, within the watchdog's wake-up poll (50 ms) and
   one tick; a whole frozen worker, at its first tick after waking.
2. A cancelled body that holds the GIL is killed after the cancel grace (the default 5 s), which
   is longer than lease + lease grace: its slot is free within the grace plus 2 s.

Every body start and every ~20 ms slice of work is recorded in files (``tests.fixtures.faults``),
outside the database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests import support
from tests.faults.services import FaultServices
from tests.faults.stack import FaultClient, FaultStack, running

WATCHDOG_INTERVAL_S = 1.0  # the default
HOLD_MS = 6000
CANCEL_GRACE_S = 5.0  # the default, longer than lease (3 s) + lease grace (1 s)


def _beats(stack: FaultStack, task_id: str) -> dict[int, tuple[int, list[float]]]:
    """attempt -> (pid, the time of every slice of work) of each ``fb_hold`` run."""
    found: dict[int, tuple[int, list[float]]] = {}
    for path in (stack.run_dir / task_id).glob("beats.*"):
        lines = path.read_text().split("\n")[:-1]  # whole lines only: the body may be writing
        if lines:
            found[int(path.name.split(".")[1])] = (int(lines[0]), [float(x) for x in lines[1:]])
    return found


def _start_time(stack: FaultStack, task_id: str, attempt: int) -> float:
    (mark,) = (stack.run_dir / task_id).glob(f"start.{attempt}.*")
    return float(mark.read_text())


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("frozen", ["child", "child-waking-at-takeover", "worker"])
def test_a_process_frozen_right_after_its_claim_never_runs_alongside_the_takeover(
    frozen: str, services: FaultServices, fault_db: str
) -> None:
    stack = FaultStack(
        f"frozen-{frozen}", fault_db, services.broker.url, services.root / "runs" / f"frozen-{frozen}"
    )
    with running(stack):
        stack.start_worker("worker", concurrency=1)
        stack.start_maintenance()
        stack.start_beat()
        stack.start_api()
        stack.wait_worker_ready()
        stack.start_worker("worker2", concurrency=1)  # takes the job over (only once it is ready)
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        itself = frozen.startswith("child")
        params = {"name": "fb_hold", "arguments": {"ms": HOLD_MS, "freeze_first": itself}}
        call = client.request("create", "tools/call", params, name="fb_hold")
        task_id = call.task_id
        assert task_id, call.describe()
        support.wait_until(lambda: 1 in _beats(stack, task_id), 20, 0.005, what="the body to start")
        worker_group = stack.procs["worker"].popen.pid
        if frozen == "worker":
            _signal_group(worker_group, signal.SIGSTOP)  # the main process (its watchdog) too
        try:
            support.wait_until(
                lambda: 2 in _beats(stack, task_id), 30, 0.05, what="another worker to take the job over"
            )
            assert stack.rows([task_id])[task_id]["worker"].split(":")[1] != str(_beats(stack, task_id)[1][0])
            if frozen == "child":
                time.sleep(WATCHDOG_INTERVAL_S + 1.0)  # deliberate: the freeze outlasts the takeover
        finally:
            woke_at = time.time()
            if not itself:
                _signal_group(worker_group, signal.SIGCONT)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(_beats(stack, task_id)[1][0], signal.SIGCONT)
        support.wait_until(
            lambda: stack.rows([task_id])[task_id]["status"] == "completed", 30, 0.1, what="the task to end"
        )
        time.sleep(1.0)  # deliberate: a woken body that was not stopped goes on beating meanwhile
        beats = _beats(stack, task_id)
        old_pid, old_beats = beats[1]
        took_over_at = _start_time(stack, task_id, 2)
        alongside_s = max((b - woke_at for b in old_beats if b > took_over_at), default=0.0)
        row = stack.rows([task_id])[task_id]
        print(
            f"\nfrozen {frozen}: taken over {took_over_at - _start_time(stack, task_id, 1):.1f} s after "
            f"the claim; the woken body ran {alongside_s:.2f} s alongside the new run"
        )
        assert row["attempts"] == 2 and row["result"]["structuredContent"]["attempt"] == 2, row
        assert not list((stack.run_dir / task_id).glob("end.1.*")), "the frozen run finished too"
        # A child frozen past a tick after the takeover is killed before it wakes; one that wakes
        # just then, within a few ticks of the wake-up poll; a frozen worker at its first tick.
        bound = {"child": 0.0, "child-waking-at-takeover": 0.5}.get(frozen, WATCHDOG_INTERVAL_S + 0.5)
        assert alongside_s <= bound, f"the woken body ran {alongside_s:.2f} s alongside the takeover"
        with contextlib.suppress(ProcessLookupError):
            os.kill(old_pid, 0)
            raise AssertionError(f"the frozen child {old_pid} still lives")


@pytest.mark.timeout(120)
def test_a_cancelled_gil_holding_body_is_killed_after_a_grace_longer_than_the_lease(
    services: FaultServices, fault_db: str
) -> None:
    stack = FaultStack("long-grace", fault_db, services.broker.url, services.root / "runs" / "long-grace")
    assert float(stack.env.get("MCP_TASKS_CANCEL_GRACE_SECONDS", CANCEL_GRACE_S)) == CANCEL_GRACE_S
    lease = float(stack.env["MCP_TASKS_LEASE_SECONDS"]) + float(stack.env["MCP_TASKS_LEASE_GRACE_SECONDS"])
    assert lease < CANCEL_GRACE_S
    with running(stack):
        stack.start_worker("worker", concurrency=1)  # one slot
        stack.start_maintenance()
        stack.start_beat()
        stack.start_api()
        stack.wait_worker_ready()
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        call = client.request("create", "tools/call", {"name": "fb_regex", "arguments": {}}, name="fb_regex")
        task_id = call.task_id
        assert task_id, call.describe()
        support.wait_until(lambda: stack.marks(task_id)["start"], 20, 0.02, what="the body to start")
        time.sleep(0.5)  # deliberate: the body is deep in its regex
        cancelled = client.request("cancel", "tasks/cancel", {"taskId": task_id}, name=task_id)
        cancelled_at = time.monotonic()
        assert cancelled.ok, cancelled.describe()
        follower = client.create(0)
        assert follower.task_id, follower.describe()
        follower_id = follower.task_id
        try:
            support.wait_until(
                lambda: stack.rows([follower_id])[follower_id]["status"] == "completed",
                CANCEL_GRACE_S + 15,
                0.05,
                what="the next job to get the slot",
            )
        finally:
            row = stack.rows([task_id])[task_id]
            print(f"\nlong grace: the cancelled row says {row['status']}, {row['stop_reason']!r}")
        slot_free_s = time.monotonic() - cancelled_at
        print(f"long grace: cancel -> slot free {slot_free_s:.2f} s (grace {CANCEL_GRACE_S:g} s)")
        assert slot_free_s < CANCEL_GRACE_S + 2, f"the slot took {slot_free_s:.1f} s to free up"
        assert row["status"] == "cancelled" and row["finished_at"] is not None
        assert "did not stop within" in (row["stop_reason"] or ""), row["stop_reason"]
        time.sleep(3 + 1 + 1)  # deliberate: long enough for any re-run (the sweeper) to start
        assert stack.marks(task_id)["start"] == 1
        assert Path(stack.run_dir / task_id).exists()
