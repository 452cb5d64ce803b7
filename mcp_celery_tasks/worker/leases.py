"""The one thread per worker process that keeps the leases of its running jobs.

CPU-bound tools never touch their context, so the lease cannot depend on them: the keeper
renews each job's lease every third of its length and flushes the job's coalesced status
message when it is due. A renewal that failed (the database is unreachable) is tried again
after ``retry``'s pause (``transient.LEASE_RENEWAL``, a second), not a third of a lease later:
the lease must be back the moment the database is. It tends ``Runtime`` objects and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass

from mcp_celery_tasks.errors import InfrastructureError, TaskCancelled
from mcp_celery_tasks.transient import LEASE_RENEWAL, Backoff
from mcp_celery_tasks.worker.runtime import Runtime

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("mcp_celery_tasks.leases")


@dataclass(slots=True)
class _Lease:
    runtime: Runtime
    renewed: float
    failures: int = 0
    """Renewals that failed in a row."""


class LeaseKeeper:
    """Renews the leases of the jobs running in this process and flushes their reports.

    One thread, started with the first job in the process and kept for every later one: a thread
    per job cost a fifth of a noop job's time (py-spy). Idle, it sleeps until a job comes.
    """

    TICK_S = 0.25
    RELEASE_WAIT_S = 5.0

    def __init__(self, lease_s: float, *, tick_s: float = TICK_S, retry: Backoff = LEASE_RENEWAL) -> None:
        self._lease_s = lease_s
        self._tick_s = tick_s
        self._retry = retry
        self._pid: int | None = None  # the process whose thread this is (a fork has none)

    def _start(self) -> None:
        self._pid = os.getpid()
        self._jobs: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self._has_jobs = threading.Condition(self._lock)
        threading.Thread(target=self._loop, name="mcp-leases", daemon=True).start()

    def watch(self, runtime: Runtime) -> None:
        """Keep ``runtime``'s lease (just taken by the claim) until ``release``."""
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            self._jobs[runtime.task_id] = _Lease(runtime, time.monotonic())
            self._has_jobs.notify()

    def release(self, runtime: Runtime) -> None:
        """From here on the keeper leaves ``runtime`` alone (a renewal under way ends first)."""
        if self._pid != os.getpid():
            return  # never watched in this process
        locked = self._lock.acquire(timeout=self.RELEASE_WAIT_S)
        try:
            self._jobs.pop(runtime.task_id, None)
        finally:
            if locked:
                self._lock.release()

    def _loop(self) -> None:
        renew_every = self._lease_s / 3
        while True:
            with self._lock:
                while not self._jobs:
                    self._has_jobs.wait()
            time.sleep(self._tick_s)
            with self._lock:
                for lease in list(self._jobs.values()):
                    self._tend(lease, renew_every)

    def _tend(self, lease: _Lease, renew_every: float) -> None:
        try:
            # A message that could not be written stays pending for the next tick.
            with contextlib.suppress(InfrastructureError):
                lease.runtime.flush_if_due()
            now = time.monotonic()
            due = self._retry.pause(lease.failures) if lease.failures else renew_every
            if now - lease.renewed >= due:
                lease.renewed = now
                try:
                    lease.runtime.renew_lease(self._lease_s)
                except InfrastructureError:
                    if not lease.failures:
                        logger.warning("lease renewal failed for job %s; retrying", lease.runtime.job_id)
                    lease.failures += 1
                else:
                    lease.failures = 0
        except (Exception, TaskCancelled):
            # Never let one job's failure stop the thread that keeps every later job's lease. A
            # cancel is the job thread's to notice (the runtime marks itself lost; nothing here
            # should raise it), so one here would be a bug: logged, not fatal to the thread.
            logger.exception("lease keeping failed for job %s", lease.runtime.job_id)
