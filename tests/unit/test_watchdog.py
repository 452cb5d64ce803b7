"""The watchdog's decisions, without Celery, Postgres or real processes: what it renews, when it
stops a process, and what it records (tests/e2e/test_containment.py runs it for real)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tools.registry import tool
from mcp_celery_tasks.worker.watchdog import RunningJob, Watchdog, holder_of

HOST = "host-a"


@tool(name="w_limited", time_limit=10, soft_time_limit=5, memory_limit_mb=100)
def w_limited() -> None:
    """A tool with limits."""


class Rows:
    """The rows the store answers with, and what the watchdog asked of it."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.renewed: list[str] = []
        self.forced: list[tuple[str, str]] = []
        self.stopped: list[tuple[str, str]] = []
        self.down = False

    def row(self, job: str, *, status: str = "working", ours: bool = True, tool: str = "w_limited",
            cancelled_for_s: float | None = None, finished: bool = False) -> None:  # fmt: skip
        self.rows[job] = {"job_id": job, "task_id": f"task-{job}", "tool_name": tool, "status": status,
                          "ours": ours, "cancelled_for_s": cancelled_for_s, "finished": finished}  # fmt: skip

    def watch_jobs(self, jobs: Sequence[dict[str, Any]], lease_s: float) -> dict[str, dict[str, Any]]:
        if self.down:
            raise InfrastructureError("down")
        self.renewed += [
            j["job_id"] for j in jobs if j["renew"] and self.rows.get(j["job_id"], {}).get("ours")
        ]
        return {
            f"{j['job_id']} {j['holder']}": self.rows[j["job_id"]] for j in jobs if j["job_id"] in self.rows
        }

    def force_finish(self, task_id: str, holder: str, *, result: dict[str, Any], kind: str, message: str,
                     reason: str) -> bool:  # fmt: skip
        self.forced.append((task_id, kind))
        return True

    def force_stopped(self, task_id: str, holder: str, reason: str) -> bool:
        self.stopped.append((task_id, reason))
        return True


def dog(rows: Rows, **settings: Any) -> tuple[Watchdog, list[str], list[int]]:
    terminated: list[str] = []
    signalled: list[int] = []
    base = {"cancel_grace_seconds": 5.0, "tool_memory_limit_mb": 0, "tool_time_limit_seconds": 0}
    made = Watchdog(
        rows,
        Settings(**{**base, **settings}),
        terminate=lambda job: terminated.append(job.job_id),
        signal_soft_limit=signalled.append,
        hostname=HOST,
    )
    return made, terminated, signalled


def test_the_holder_is_the_childs_identity_prefix() -> None:
    assert holder_of(42, "box") == "box:42:"


def test_live_children_keep_their_leases_stopped_ones_do_not(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    rows.row("busy")
    rows.row("frozen")
    procs[1], procs[2] = ("R", 0), ("T", 0)
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("busy", 1), RunningJob("frozen", 2)])
    assert rows.renewed == ["busy"] and terminated == []


def test_a_cancelled_job_is_stopped_after_its_grace_only(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    made, terminated, _ = dog(rows)
    rows.row("j", status="cancelled", cancelled_for_s=4.0)
    made.tick([RunningJob("j", 1)])
    assert terminated == []
    rows.row("j", status="cancelled", cancelled_for_s=5.5)
    made.tick([RunningJob("j", 1)])
    made.tick([RunningJob("j", 1)])  # once only
    assert terminated == ["j"] and rows.stopped[0][0] == "task-j" and "did not stop" in rows.stopped[0][1]


def test_a_job_that_stopped_by_itself_is_left_alone(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    rows.row("j", status="cancelled", cancelled_for_s=60.0, finished=True)
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1)])
    assert terminated == []


def test_a_child_whose_lease_was_taken_over_is_stopped(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    made, terminated, _ = dog(rows)
    rows.row("j", ours=True)
    made.tick([RunningJob("j", 1)])
    rows.row("j", ours=False)  # frozen past its lease: the sweeper gave the job to another worker
    made.tick([RunningJob("j", 1)])
    assert terminated == ["j"]


def test_a_child_that_has_not_claimed_yet_is_not_stopped(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    rows.row("j", ours=False)  # still the earlier attempt's worker: the claim is under way
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1)])
    made.tick([RunningJob("j", 1)])
    assert terminated == []


def test_time_runs_only_while_working(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    made, terminated, signalled = dog(rows)
    rows.row("j")
    made.tick([RunningJob("j", 1)])
    clock[0] += 4
    made.tick([RunningJob("j", 1)])  # 4 s of running
    rows.row("j", status="input_required")
    clock[0] += 100
    made.tick([RunningJob("j", 1)])  # waiting for a human: not counted
    assert signalled == [] and terminated == []
    rows.row("j")
    clock[0] += 2
    made.tick([RunningJob("j", 1)])  # 6 s: past the soft limit (5 s), signalled once
    clock[0] += 1
    made.tick([RunningJob("j", 1)])
    assert signalled == [1] and terminated == []
    clock[0] += 4
    made.tick([RunningJob("j", 1)])  # 11 s: past the hard limit (10 s)
    assert rows.forced == [("task-j", "time_limit")] and terminated == ["j"]


def test_memory_over_the_tools_limit_ends_the_task(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 99 * 2**20)
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1)])
    assert terminated == []
    procs[1] = ("R", 101 * 2**20)
    made.tick([RunningJob("j", 1)])
    assert rows.forced == [("task-j", "memory_limit")] and terminated == ["j"]


def test_an_unreachable_database_stops_nothing(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    rows.row("j", status="cancelled", cancelled_for_s=60.0)
    procs[1] = ("R", 0)
    rows.down = True
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1)])
    assert terminated == [] and rows.renewed == []


def test_gone_children_are_forgotten(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    rows.row("j")
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1)])  # no such process
    assert rows.renewed == [] and terminated == []


def test_a_child_that_gave_its_job_back_is_not_stopped(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    made, terminated, _ = dog(rows)
    rows.row("j", ours=True)
    made.tick([RunningJob("j", 1)])
    rows.row("j", ours=False)
    rows.rows["j"]["released"] = True  # the child gave the job back (it is stopping by itself)
    made.tick([RunningJob("j", 1)])
    assert terminated == []


def test_a_child_frozen_before_any_tick_is_stopped_once_its_job_moved_on(
    clock: list[float], procs: dict[int, Any]
) -> None:
    # Frozen within its job's first tick (issue 28): no tick ever saw the row as the child's,
    # but the child said at its claim which identity it claimed the job as.
    rows = Rows()
    procs[1] = ("T", 0)
    made, terminated, _ = dog(rows)
    claimed = RunningJob("j", 1, claimed_as=f"{HOST}:1:abcd1234")
    rows.row("j", ours=True)
    made.tick([claimed])
    assert terminated == [] and rows.renewed == []  # stopped: its lease is not renewed
    rows.row("j", ours=False)  # the sweeper gave the job to another worker meanwhile
    made.tick([claimed])
    assert terminated == ["j"]  # killed while still stopped: it never wakes to do more work


def test_a_woken_child_whose_job_moved_on_is_stopped_at_the_first_tick(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    procs[1] = ("R", 0)
    rows.row("j", ours=False)  # the whole worker was frozen: this is the first tick since the claim
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:abcd1234")])
    assert terminated == ["j"]


def test_the_watchdog_asks_for_the_exact_identity_the_child_claimed_as(
    clock: list[float], procs: dict[int, Any]
) -> None:
    asked: list[str] = []
    rows = Rows()
    rows.row("j")
    procs[1], procs[2] = ("R", 0), ("R", 0)
    original = rows.watch_jobs

    def watch_jobs(jobs: Sequence[dict[str, Any]], lease_s: float) -> dict[str, dict[str, Any]]:
        asked.extend(j["holder"] for j in jobs)
        return original(jobs, lease_s)

    rows.watch_jobs = watch_jobs  # type: ignore[method-assign]
    made, _, _ = dog(rows)
    made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:abcd1234"), RunningJob("k", 2)])
    assert asked == [f"{HOST}:1:abcd1234", holder_of(2, HOST)]


def test_a_frozen_cancelled_job_is_stopped_after_its_grace(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1] = ("T", 0)
    made, terminated, _ = dog(rows)
    rows.row("j", status="cancelled", cancelled_for_s=6.0)
    made.tick([RunningJob("j", 1)])
    assert terminated == ["j"]


def test_a_child_that_announced_nothing_and_was_never_seen_is_left_alone(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    procs[1] = ("T", 0)
    rows.row("j", ours=False)  # a duplicate delivery that has not claimed: it will defer
    made, terminated, _ = dog(rows)
    made.tick([RunningJob("j", 1)])
    assert terminated == []


def test_a_stopped_child_that_wakes_up_is_noticed_between_ticks(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("T", 0)
    made, _, _ = dog(rows)
    assert not made.has_frozen
    made.tick([RunningJob("j", 1)])
    assert made.has_frozen and not made.woke()
    procs[1] = ("R", 0)  # SIGCONT: the caller ticks at once instead of sleeping the interval out
    assert made.woke()


def test_the_next_tick_comes_when_a_cancel_grace_ends(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    procs[1], procs[2] = ("R", 0), ("R", 0)
    made, terminated, _ = dog(rows)
    rows.row("j", status="cancelled", cancelled_for_s=4.7)
    rows.row("k", status="cancelled", cancelled_for_s=1.0)
    made.tick([RunningJob("j", 1), RunningJob("k", 2)])
    assert terminated == [] and made.next_due_s == pytest.approx(0.3)
    rows.rows.clear()
    made.tick([RunningJob("j", 1), RunningJob("k", 2)])
    assert made.next_due_s is None


@tool(name="w_gpu", gpu_memory_limit_mb=1024)
def w_gpu() -> None:
    """A tool with a device memory limit."""


def test_device_memory_over_the_tools_gpu_limit_ends_the_task(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    rows.row("j", tool="w_gpu")
    procs[1] = ("R", 0)
    held = {1: ("3", 1000 * 2**20)}
    terminated: list[str] = []
    settings = Settings(cancel_grace_seconds=5.0, tool_memory_limit_mb=0, tool_time_limit_seconds=0)
    made = Watchdog(rows, settings, terminate=lambda job: terminated.append(job.job_id),
                    signal_soft_limit=lambda pid: None, hostname=HOST, device_memory=held.get)  # fmt: skip
    made.tick([RunningJob("j", 1)])
    assert terminated == []
    held[1] = ("3", 1100 * 2**20)
    made.tick([RunningJob("j", 1)])
    assert rows.forced == [("task-j", "gpu_memory_limit")] and terminated == ["j"]


def test_without_a_device_measure_only_rss_is_checked(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    rows.row("j", tool="w_gpu")
    procs[1] = ("R", 0)
    made, terminated, _ = dog(rows)  # no NVML: no device_memory
    made.tick([RunningJob("j", 1)])
    made.tick([RunningJob("j", 1)])
    assert rows.forced == [] and terminated == []


def test_with_the_fence_a_job_whose_lease_cannot_be_renewed_is_stopped_before_it_lapses(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    made, terminated, _ = dog(rows, lease_self_fence=True, lease_seconds=10.0, watchdog_interval_seconds=1.0)
    made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:x")])
    assert rows.renewed == ["j"]  # renewed at 1000: the lease runs to 1010
    rows.down = True  # cut off from Postgres from here on
    for second in range(1, 9):
        clock[0] = 1000.0 + second
        made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:x")])
    assert terminated == []  # 8 s without a renewal: the lease still holds past the next tick
    clock[0] = 1009.0  # a lease less one interval: the next tick could come after it lapsed
    made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:x")])
    assert terminated == ["j"]
    clock[0] = 1010.0
    made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:x")])
    assert terminated == ["j"]  # once


def test_without_the_fence_a_long_outage_stops_nothing(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    made, terminated, _ = dog(rows, lease_seconds=10.0)
    made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:x")])
    rows.down = True
    for second in range(1, 61):
        clock[0] = 1000.0 + second
        made.tick([RunningJob("j", 1, claimed_as=f"{HOST}:1:x")])
    assert terminated == []


def test_of_two_children_running_one_job_only_the_one_whose_lease_was_taken_over_is_stopped(
    clock: list[float], procs: dict[int, Any]
) -> None:
    """A worker cut off from Postgres past its lease may receive the takeover's delivery of the
    same job: child 1 runs the stale attempt, child 2 the new one (issue 28). The stop names the
    child, and it is child 1."""
    stale, taker = f"{HOST}:1:aaaa1111", f"{HOST}:2:bbbb2222"
    rows = Rows()
    rows.row("j", ours=False)
    procs[1], procs[2] = ("R", 0), ("R", 0)

    def watch_jobs(jobs: Sequence[dict[str, Any]], lease_s: float) -> dict[str, dict[str, Any]]:
        return {
            f"{j['job_id']} {j['holder']}": {**rows.rows["j"], "ours": j["holder"] == taker} for j in jobs
        }

    rows.watch_jobs = watch_jobs  # type: ignore[method-assign]
    stopped: list[RunningJob] = []
    settings = Settings(cancel_grace_seconds=5.0, tool_memory_limit_mb=0, tool_time_limit_seconds=0)
    made = Watchdog(
        rows, settings, terminate=stopped.append, signal_soft_limit=lambda pid: None, hostname=HOST
    )
    made.tick([RunningJob("j", 1, claimed_as=stale), RunningJob("j", 2, claimed_as=taker)])
    assert [(job.job_id, job.pid) for job in stopped] == [("j", 1)]
