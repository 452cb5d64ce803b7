"""Beat jobs: collect expired tasks, and sweep jobs that were never published or were lost.

Each job is a few store calls; ``worker.install`` registers them and beat schedules them on
the maintenance queue, so they never wait behind tool jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mcp_types import jsonrpc as codes

from mcp_celery_tasks import metrics
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore

__all__ = ["collect_garbage", "gc_overdue", "sweep"]

logger = logging.getLogger(__name__)

PublishJob = Callable[[str, str], None]
QueueDepth = Callable[[str], "int | None"]
"""How many messages wait in a queue; None when the broker cannot be asked."""


def collect_garbage(store: WorkerStore, *, batch: int = 1000, max_batches: int = 100) -> int:
    """Delete expired rows in bounded batches (inputs cascade); rows with a live lease stay.

    Each batch is its own short transaction, so polling never waits behind a long delete.
    """
    deleted = 0
    for _ in range(max_batches):
        count = store.delete_expired(batch)
        if count is None:
            logger.info("another collector holds the lock; skipping")
            return deleted
        deleted += count
        if count < batch:
            break
    sessions = 0
    for _ in range(max_batches):  # expired 2025-11-25 sessions (idle or too old)
        count = store.delete_expired_sessions(batch)
        sessions += count
        if count < batch:
            break
    store.record_run("collect_garbage", deleted)
    metrics.gc_deleted.inc(deleted)
    metrics.gc_last_run.set_to_current_time()
    if deleted or sessions:
        logger.info("collected %d expired tasks and %d expired sessions", deleted, sessions)
    return deleted


def gc_overdue(store: WorkerStore, settings: Settings) -> float | None:
    """Seconds since the collector last ran, if that is more than the alarm allows."""
    since = store.seconds_since_run("collect_garbage")
    limit = settings.gc_interval_seconds * settings.gc_alarm_intervals
    if since is not None and since > limit:
        return since
    return None


def sweep(
    store: WorkerStore,
    publish_job: PublishJob,
    settings: Settings,
    *,
    queue_depth: QueueDepth,
    limit: int = 500,
) -> int:
    """Publish rows still undispatched after ``undispatched_after_seconds`` (the outbox: a crash
    or an outage between commit and publish); fail those that could not be published for
    ``undispatched_fail_after_seconds``; re-publish published jobs no worker started (lost on
    the way, see ``_unstarted``) and active rows whose lease ran out (their worker died). A
    job that is merely queued behind others is never touched. Cancelled tasks nobody runs any
    more stop showing as ``stopping``."""
    global _missed
    try:
        republished = _sweep(store, publish_job, settings, queue_depth, limit)
    except InfrastructureError:
        _missed = True  # this sweep could not reach the database: remembered for the next one
        raise
    ended = store.end_unattended_stops()
    if ended:
        logger.info("%d cancelled tasks whose job nobody runs any more marked stopped", ended)
    return republished


def _sweep(
    store: WorkerStore, publish_job: PublishJob, settings: Settings, queue_depth: QueueDepth, limit: int
) -> int:
    failed = store.fail_undispatched(
        settings.undispatched_fail_after_seconds,
        {"code": codes.INTERNAL_ERROR, "message": "The job could not be queued (the broker was unavailable)"},
        "could not be queued",
    )
    if failed:
        logger.error("failed %d tasks whose jobs could not be published", failed)
    republished = 0
    undispatched = store.undispatched(settings.undispatched_after_seconds, limit)
    for job_id, queue in undispatched:
        publish_job(job_id, queue)
        republished += 1
    if undispatched:
        store.mark_dispatched([job_id for job_id, _ in undispatched])
    for job_id, queue in _unstarted(store, settings, queue_depth, limit):
        publish_job(job_id, queue)
        republished += 1
    if _leases_trustworthy(store, settings):
        for job_id, queue in store.lost_leases(settings.lease_grace_seconds, limit):
            publish_job(job_id, queue)
            republished += 1
    if republished:
        metrics.sweeper_republished.inc(republished)
        logger.info("sweeper re-published %d jobs", republished)
    overdue = gc_overdue(store, settings)
    if overdue is not None:
        logger.error("ALARM: the garbage collector has not run for %.0f s; is beat running?", overdue)
    store.record_run("sweep", republished)
    return republished


GAP = "sweep-gap"
"""The maintenance row that records when the sweeper last found it had not run for a while."""

_missed = False
"""A sweep in this process failed to reach the database since the last one that did."""


def _leases_trustworthy(store: WorkerStore, settings: Settings) -> bool:
    """Whether a lapsed lease now means a dead worker. Not right after a gap in the sweeper's own
    runs (the database, or the maintenance worker, was unreachable): then nobody could renew a
    lease either, and live workers renew within a second of the database coming back. Lost leases
    are reclaimed again once a whole lease plus its grace has passed since the gap ended.

    A gap is a sweep that failed to reach the database (this process remembers it), or a long
    silence since the last recorded sweep (beat or the maintenance worker was down too). A
    Postgres restart is also covered row by row: a lease counts as lapsed only ``grace`` after
    the server started (``queries._LEASE_LAPSED``)."""
    global _missed
    since_sweep = store.seconds_since_run("sweep")
    normal = 2 * settings.sweep_interval_seconds + settings.lease_grace_seconds
    if _missed or (since_sweep is not None and since_sweep > normal):
        store.record_run(GAP, 0)
        _missed = False
        logger.warning(
            "the sweeper could not reach the database for a while (last sweep %.0f s ago); "
            "lost leases wait a lease before reclaim",
            since_sweep or 0.0,
        )
        return False
    since_gap = store.seconds_since_run(GAP)
    return since_gap is None or since_gap > settings.lease_seconds + settings.lease_grace_seconds


def _unstarted(
    store: WorkerStore, settings: Settings, queue_depth: QueueDepth, limit: int
) -> list[tuple[str, str]]:
    """Published jobs no worker started, each re-stamped so it comes back only a period later.

    After ``republish_unstarted_after_seconds`` whatever the queue holds (a broker that lost its
    data). After ``republish_idle_queue_after_seconds`` when the job's queue holds no waiting
    message: nothing queues it any more, so the worker that received it lost its connection
    before starting it. Redis keeps such a message aside until its visibility timeout (12 h);
    RabbitMQ requeues it, and then the queue is not empty.
    """
    jobs = store.unstarted(settings.republish_unstarted_after_seconds, limit)
    idle_after = settings.republish_idle_queue_after_seconds
    for queue in store.unstarted_queues(idle_after):
        if queue_depth(queue) == 0:
            jobs += store.unstarted(idle_after, limit, queue)
    return jobs
