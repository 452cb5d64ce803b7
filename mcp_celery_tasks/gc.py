"""Beat jobs: collect expired tasks, and sweep jobs that were never published or were lost.

Each job is one or two store calls; ``celery_app`` schedules them on the maintenance queue so
they never wait behind tool jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mcp_celery_tasks.store import WorkerStore

__all__ = ["collect_garbage", "sweep"]

logger = logging.getLogger(__name__)

PublishJob = Callable[[str, str], None]


def collect_garbage(store: WorkerStore, *, batch: int = 1000, max_batches: int = 100) -> int:
    """Delete expired rows in bounded batches (inputs cascade); rows with a live lease stay."""
    deleted = 0
    for _ in range(max_batches):
        count = store.delete_expired(batch)
        if count is None:
            logger.info("another collector holds the lock; skipping")
            break
        deleted += count
        if count < batch:
            break
    if deleted:
        logger.info("collected %d expired tasks", deleted)
    return deleted


def sweep(
    store: WorkerStore,
    publish_job: PublishJob,
    *,
    undispatched_after_s: float = 30.0,
    lease_grace_s: float = 5.0,
    limit: int = 500,
) -> int:
    """Publish rows still undispatched after ``undispatched_after_s`` (the outbox: a crash
    between commit and publish), and re-publish active rows whose lease ran out (their worker
    died). A dispatched row that is merely queued has no lease and is never touched."""
    republished = 0
    undispatched = store.undispatched(undispatched_after_s, limit)
    for job_id, queue in undispatched:
        publish_job(job_id, queue)
        republished += 1
    if undispatched:
        store.mark_dispatched([job_id for job_id, _ in undispatched])
    for job_id, queue in store.lost_leases(lease_grace_s, limit):
        publish_job(job_id, queue)
        republished += 1
    if republished:
        logger.info("sweeper re-published %d jobs", republished)
    return republished
