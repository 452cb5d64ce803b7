"""When a worker cut off from Postgres kills its own jobs (``lease_self_fence``). No I/O here
(the beacon itself: ``beacon``).

A prefork worker whose watchdog cannot renew a job's lease for a lease less one watchdog
interval either fences (kills the job's process before the lease lapses, so a worker that takes
the job over never runs beside it) or lets the body run on. Which is right depends on what is
down, and the worker alone cannot tell:

- **a partition** (this worker cannot reach Postgres; the rest of the deployment can): the
  sweeper reclaims the lapsed lease and another worker runs the job. Not fencing means two
  bodies at once until this worker reaches Postgres again;
- **an outage of Postgres itself** (or of everything): nobody can take the job over, and
  fencing only throws away the work done so far (one attempt per job).

The three modes:

- ``off``: never fence.
- ``on``: always fence.
- ``auto`` (the default): fence only on evidence of a partition. The maintenance worker (which runs the
  sweeper, the one that hands lapsed jobs to other workers) publishes a *beacon* through the
  broker every ``BEACON_INTERVAL_S`` while Postgres answers it (``beacon``). A worker
  that still hears fresh beacons while its own renewals fail is the one cut off, and fences; one
  that hears none (Postgres down, or the broker down too, or the maintenance worker gone) lets
  its jobs run on, as ``off`` does. A beacon counts only if heard at least one beacon interval
  after this worker's renewals began to fail: one heard earlier may have been sent just before
  an outage of Postgres itself began.
"""

from __future__ import annotations

from mcp_celery_tasks.settings import FenceMode

__all__ = ["BEACON_FRESH_S", "BEACON_INTERVAL_S", "should_fence"]

BEACON_INTERVAL_S = 1.0
"""How often the maintenance worker checks Postgres and, if it answered, sends a beacon."""
BEACON_FRESH_S = 3.0
"""A beacon heard longer ago than this is no evidence that Postgres answers now (also the
beacon's time to live in the broker)."""


def should_fence(mode: FenceMode, heard_ago_s: float | None, failing_for_s: float) -> bool:
    """Whether a worker whose lease renewals have failed for ``failing_for_s`` (since its first
    failing call went out) kills the jobs whose lease may lapse before its next tick.

    ``heard_ago_s``: seconds since this worker last heard a beacon of its own deployment (None:
    never, or no listener). In ``auto`` it fences only on a beacon that is fresh and was heard
    at least one beacon interval after the failures began."""
    if mode == "on":
        return True
    if mode == "off" or heard_ago_s is None:
        return False
    return heard_ago_s <= BEACON_FRESH_S and heard_ago_s <= failing_for_s - BEACON_INTERVAL_S
