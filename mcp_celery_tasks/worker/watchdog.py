"""The watchdog: guarantees that do not depend on tool code behaving. No Celery here.

It runs in a prefork worker's main process, outside every job's interpreter, and each tick
(``watchdog_interval_seconds``) looks at the jobs the pool children run:

- **Leases.** It renews the lease of every job whose child process lives (a child that holds the
  GIL in a C regex, sleeps in a C call or never touches ``ctx`` keeps its lease), a cancelled
  job's too until its process stops, and never the lease of a stopped child (SIGSTOP, a paused
  VM): that one may be failed over.
- **Taken over.** A child whose job another worker took over (it was frozen, or cut off from
  the database past its lease) is killed as soon as a tick sees the row moved on: while it is
  still stopped, or at the first tick after the whole worker wakes. The watchdog knows which job
  a child claimed, and as which identity, from the claim itself (``claims``), not from an
  earlier tick: a child frozen within its job's first tick is recognised too (issue 28).
- **Fence** (``lease_self_fence``, ``auto`` by default). A job whose lease could not be renewed for
  a lease less one interval (the database is out of this worker's reach) has its process killed
  before the lease can lapse: a worker cut off from Postgres never runs a body alongside the one
  that took the job over. ``auto`` fences only while the maintenance worker's beacon says
  Postgres answers others (``fencing``; the glue hands in when a beacon was last heard).
- **Hard stop.** A job whose task was cancelled (by its client or an admin) and that has not
  returned ``cancel_grace_seconds`` later has its process killed, whatever the lease settings
  (its lease is kept meanwhile); the pool replaces it, the task stays ``cancelled``, and the
  message is acknowledged.
- **Limits per tool.** Past its hard time limit (time waiting for input not counted), its
  memory limit (the child's RSS) or, on a GPU worker with NVML, its GPU memory limit (what the
  child holds on its device, ``gpu_memory``), a job ends ``completed`` with ``isError`` saying which limit,
  and its process is killed. Past its soft time limit the child is signalled once, so the tool
  gets ``SoftTimeLimitExceeded`` (a ``ToolError``) to clean up.

A stop kills the one child named (``terminate(job)``: the job id and the child's pid), never
"the job": a worker cut off past its lease may have received the takeover's delivery of the
same job too, and then runs it in two children, of which only the stale one must go.

Every forced stop is a metric (``mcp_forced_stops``), a ``task.forced_stop`` log event with the
job id, and a ``stop_reason`` on the row that admins see.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcp_celery_tasks.broker import fencing
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.lifecycle import ACTIVE, WORKING
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.tools.registry import get_tool
from mcp_celery_tasks.tools.results import error_result
from mcp_celery_tasks.worker.limits import JobLimits

__all__ = [
    "RunningJob",
    "WatchStore",
    "Watchdog",
    "holder_of",
    "process_state",
    "process_tree",
    "rss_bytes",
    "tree_rss_bytes",
]

logger = logging.getLogger("mcp_celery_tasks.worker")

WAKE_POLL_S = 0.05
"""How often the watchdog looks whether a stopped child woke up (one /proc read per such child)."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STOPPED = frozenset("Tt")
_GONE = frozenset("ZXx")


class WatchStore(Protocol):
    """The store calls of the watchdog (``WorkerStore`` in production)."""

    def watch_jobs(self, jobs: Sequence[dict[str, Any]], lease_s: float) -> dict[str, dict[str, Any]]:
        """Renew the leases the ``renew`` entries' children hold; every entry's row, keyed by
        ``"<job_id> <holder>"`` (``ours``: the row's worker is that child)."""
        ...

    def force_finish(
        self, task_id: str, holder: str, *, result: dict[str, Any], kind: str, message: str, reason: str
    ) -> bool: ...

    def force_stopped(self, task_id: str, holder: str, reason: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A ``run_tool`` job a pool child is running, as the main process sees it; ``claimed_as``:
    the worker identity the child said it claimed the job as (``claims``), None until it has."""

    job_id: str
    pid: int
    claimed_as: str | None = field(default=None, compare=False)


@dataclass(slots=True)
class _Track:
    pid: int
    run_s: float = 0.0
    last_seen: float = field(default_factory=time.monotonic)
    seen_ours: bool = False
    renewed_at: float | None = None
    """When the request that last renewed the lease went out (``lease_self_fence``)."""
    soft_sent: bool = False
    stopping: bool = False
    limits: JobLimits | None = None


def holder_of(pid: int, hostname: str | None = None) -> str:
    """The prefix of the worker identity of the child ``pid`` (``runner.worker_identity``)."""
    return f"{hostname or socket.gethostname()}:{pid}:"


def process_state(pid: int) -> str | None:
    """The kernel's state letter of ``pid`` (R, S, D, T, Z …); None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'.
    return raw[raw.rindex(b")") + 2 : raw.rindex(b")") + 3].decode()


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (an isolated body, ``worker.isolation``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children", "rb") as children:
                todo.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            pass
    return found


def tree_rss_bytes(pid: int) -> int:
    """The resident memory of ``pid`` and of every process below it."""
    return sum(rss_bytes(each) for each in process_tree(pid))


class Watchdog:
    """One per prefork worker main process; ``tick`` is called every ``watchdog_interval``."""

    def __init__(
        self,
        store: WatchStore,
        settings: Settings,
        *,
        terminate: Callable[[RunningJob], None],
        signal_soft_limit: Callable[[int], None],
        hostname: str | None = None,
        device_memory: Callable[[int], tuple[str, int] | None] | None = None,
        beacon_heard_ago: Callable[[], float | None] | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._terminate = terminate
        self._signal_soft_limit = signal_soft_limit
        self._hostname = hostname or socket.gethostname()
        self._device_memory = device_memory  # GPU workers with NVML: (device, bytes held) per pid
        self._tracks: dict[RunningJob, _Track] = {}
        self._frozen: set[int] = set()
        self._beacon_heard_ago = beacon_heard_ago  # lease_self_fence=auto: seconds, None: never
        self._failing_since: float | None = None  # when the first of the failing calls went out
        self._held_back = False  # auto did not fence for want of a beacon (logged once per outage)
        self.next_due_s: float | None = None
        """Seconds from the last tick until a cancelled job's grace ends, if one is running: the
        next tick comes then, not up to an interval later."""

    def tick(self, running: Sequence[RunningJob]) -> None:
        now = time.monotonic()
        states = {job: process_state(job.pid) for job in running}
        live = [job for job in running if states[job] is not None and states[job] not in _GONE]
        # One track per (job, child): a duplicate delivery of a running job is another entry.
        self._tracks = {job: self._tracks.get(job) or _Track(job.pid, last_seen=now) for job in live}
        self._frozen = {job.pid for job in live if states[job] in _STOPPED}
        self.next_due_s = None
        if not live:  # a job starts with a claim, which reached Postgres: no outage carries over
            self._failing_since, self._held_back = None, False
            return
        request = [
            {"job_id": job.job_id, "holder": self._holder(job), "renew": states[job] not in _STOPPED}
            for job in live
        ]
        try:
            rows = self._store.watch_jobs(request, self._settings.lease_seconds)
        except InfrastructureError:
            logger.warning("watchdog: the database is unreachable; leases renew when it returns")
            self._failing_since = now if self._failing_since is None else self._failing_since
            if self._settings.lease_self_fence != "off":
                self._fence(live)
            return
        self._failing_since, self._held_back = None, False
        for job in live:
            row = rows.get(f"{job.job_id} {self._holder(job)}")
            if row is not None:
                track = self._tracks[job]
                if row["ours"] and states[job] not in _STOPPED:
                    track.renewed_at = now
                self._look_at(job, row, track, now, frozen=states[job] in _STOPPED)

    def _fence(self, live: Sequence[RunningJob]) -> None:
        """Kill the process of every job whose lease may lapse before the next tick: another
        worker may take the job over then, and this one cannot know (``lease_self_fence``).
        Nothing is written (the database is out of reach); the taker's claim counts the run."""
        now = time.monotonic()
        bound = self._settings.lease_seconds - self._settings.watchdog_interval_seconds
        due = [job for job in live if not self._tracks[job].stopping and now - self._renewed(job) >= bound]
        if not due or not self._may_fence(now):
            return
        for job in due:
            track = self._tracks[job]
            renewed = self._renewed(job)
            track.stopping = True
            metrics.forced_stops.labels("unknown", "lease_fence").inc()
            logger.warning(
                "job %s stopped by force: its lease could not be renewed for %.1f s",
                job.job_id,
                now - renewed,
                extra={"event": "task.forced_stop", "job_id": job.job_id, "reason": "lease_fence"},
            )
            self._terminate(job)

    def _renewed(self, job: RunningJob) -> float:
        track = self._tracks[job]
        return track.renewed_at if track.renewed_at is not None else track.last_seen

    def _may_fence(self, now: float) -> bool:
        mode = self._settings.lease_self_fence
        heard = self._beacon_heard_ago() if self._beacon_heard_ago is not None else None
        failing_for = now - (self._failing_since if self._failing_since is not None else now)
        if fencing.should_fence(mode, heard, failing_for):
            return True
        if not self._held_back:
            self._held_back = True
            logger.warning(
                "watchdog: leases may lapse, but no fresh beacon says Postgres answers the others "
                "(last heard: %s): Postgres or the broker seems down, not just this worker's link; "
                "its jobs run on (lease_self_fence=auto)",
                "never" if heard is None else f"{heard:.1f} s ago",
                extra={"event": "worker.fence_held_back"},
            )
        return False

    @property
    def has_frozen(self) -> bool:
        """Whether a child was stopped (SIGSTOP) at the last tick."""
        return bool(self._frozen)

    def sleep_until_next_tick(self, interval_s: float) -> None:
        """Sleep one interval, or less: until a cancelled job's grace ends, or a stopped child wakes."""
        due = self.next_due_s
        deadline = time.monotonic() + (interval_s if due is None else min(interval_s, due + 0.02))
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, WAKE_POLL_S) if self.has_frozen else left)
            if self.woke():
                return

    def woke(self) -> bool:
        """Whether a child that was stopped at the last tick runs again (SIGCONT): the caller
        ticks at once, so a child whose job moved on meanwhile is stopped within a few tens of
        milliseconds of waking, not a whole interval later. Cheap: it reads only stopped
        children's state."""
        return any(process_state(pid) not in _STOPPED for pid in self._frozen)

    def _holder(self, job: RunningJob) -> str:
        return job.claimed_as or holder_of(job.pid, self._hostname)

    def _look_at(
        self, job: RunningJob, row: dict[str, Any], track: _Track, now: float, *, frozen: bool
    ) -> None:
        """What to do about one job. A stopped (``frozen``) child's clock does not run and its
        limits wait, but it is killed as any other when its job was cancelled past the grace or
        taken over: a kill needs no cooperation, and it must not wake to do more work."""
        elapsed, track.last_seen = now - track.last_seen, now
        if track.limits is None:  # resolved once per job and child
            track.limits = JobLimits.for_tool(get_tool(row["tool_name"]), self._settings)
        limits = track.limits
        active = row["status"] in ACTIVE
        # Whether this child holds (or held) the row: it said so at its claim, or a tick saw it.
        claimed = track.seen_ours or job.claimed_as is not None
        if row["ours"] and active:
            track.seen_ours = True
            if frozen:
                return
            if row["status"] == WORKING:
                track.run_s += elapsed  # waiting for input does not count against the time limit
            self._check_limits(job, row, track, limits)
        elif row["ours"] and not row["finished"] and row["cancelled_for_s"] is not None:
            left = limits.cancel_grace_s - row["cancelled_for_s"]
            if left > 0:
                self.next_due_s = min(self.next_due_s or left, left)  # tick when the grace ends
            elif not track.stopping:
                grace = limits.cancel_grace_s
                reason = f"did not stop within {grace:g} s of the cancel; its process was terminated"
                self._stop(job, row, track, "cancel", reason, write=lambda: self._store.force_stopped(
                    row["task_id"], self._holder(job), reason))  # fmt: skip
        elif not row["ours"] and not row.get("released") and claimed and not track.stopping:
            # (A released row was given back by the child itself: it is stopping on its own.)
            # The row moved to another worker while this child still runs the job (it was frozen,
            # or cut off from the database past its lease): it must not finish it too.
            self._stop(job, row, track, "lease_lost", "its lease was taken over by another worker")

    def _check_limits(self, job: RunningJob, row: dict[str, Any], track: _Track, limits: JobLimits) -> None:
        hard, soft, memory_mb = limits.time_limit_s, limits.soft_time_limit_s, limits.memory_limit_mb
        tool = row["tool_name"]
        if memory_mb and not track.stopping:
            used = tree_rss_bytes(job.pid)  # an isolated body's memory is the job's too
            if used > memory_mb * 2**20:
                message = (
                    f"The tool {tool!r} exceeded its memory limit of {memory_mb} MiB "
                    f"({used / 2**20:.0f} MiB); it was stopped"
                )
                self._force(job, row, track, "memory_limit", message)
                return
        gpu_mb = limits.gpu_memory_limit_mb
        if gpu_mb and self._device_memory is not None and not track.stopping:
            held = self._device_memory(job.pid)
            if held is not None and held[1] > gpu_mb * 2**20:
                message = (
                    f"The tool {tool!r} exceeded its GPU memory limit of {gpu_mb} MiB "
                    f"({held[1] / 2**20:.0f} MiB on GPU {held[0]}); it was stopped"
                )
                self._force(job, row, track, "gpu_memory_limit", message)
                return
        if hard and track.run_s > hard and not track.stopping:
            message = f"The tool {tool!r} exceeded its time limit of {hard:g} s; it was stopped"
            self._force(job, row, track, "time_limit", message)
            return
        if soft and track.run_s > soft and not track.soft_sent:
            track.soft_sent = True
            self._signal_soft_limit(job.pid)

    def _force(self, job: RunningJob, row: dict[str, Any], track: _Track, kind: str, message: str) -> None:
        """End the task with a tool error naming the limit, then stop the process."""
        holder = self._holder(job)

        def write() -> bool:
            return self._store.force_finish(
                row["task_id"], holder, result=error_result(message), kind=kind, message=message, reason=kind
            )

        self._stop(job, row, track, kind, message, write=write)

    def _stop(
        self,
        job: RunningJob,
        row: dict[str, Any],
        track: _Track,
        kind: str,
        reason: str,
        *,
        write: Callable[[], bool] | None = None,
    ) -> None:
        if write is not None:
            try:
                write()
            except InfrastructureError:
                logger.warning("watchdog: could not record why job %s is stopped; next tick", job.job_id)
                return
        track.stopping = True
        metrics.forced_stops.labels(row["tool_name"], kind).inc()
        logger.warning(
            "job %s stopped by force: %s",
            job.job_id,
            reason,
            extra={"event": "task.forced_stop", "job_id": job.job_id, "tool": row["tool_name"],
                   "reason": kind, "detail": reason},
        )  # fmt: skip
        self._terminate(job)
