"""Beat jobs: collect expired tasks, and sweep jobs that were never published or were lost.

Each job is a few store calls; ``worker.install`` registers them and beat schedules them on
the maintenance queue, so they never wait behind tool jobs.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from mcp_types import jsonrpc as codes

from mcp_celery_tasks.backlog.release import BrokerUnavailable, release_and_publish
from mcp_celery_tasks.errors import BrokerUnreachable, InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from mcp_celery_tasks.store.queries import BROKER_DOWN_JOB
from mcp_celery_tasks.telemetry import metrics

__all__ = ["collect_garbage", "gc_overdue", "sweep", "sweep_artifact_dir", "sweep_checkpoint_dir"]

logger = logging.getLogger("mcp_celery_tasks.gc")

PublishJob = Callable[[str, str], None]
QueueDepth = Callable[[str], "int | None"]
"""How many messages wait in a queue; None when the broker cannot be asked."""


ORPHAN_AFTER_S = 600.0
"""A job folder under ``checkpoint_dir`` with no task row is removed once untouched this long."""


def collect_garbage(
    store: WorkerStore,
    *,
    batch: int = 1000,
    max_batches: int = 100,
    checkpoint_dir: str | None = None,
    artifact_dir: str | None = None,
) -> int:
    """Delete expired rows in bounded batches (inputs, steps, checkpoints, artifacts cascade); rows with a
    live lease stay. Then expired sessions and spent request states, and the checkpoint and
    artifact files of deleted tasks (``sweep_checkpoint_dir``, ``sweep_artifact_dir``); only
    while no other collector holds the lock.

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
    spent = 0
    for _ in range(max_batches):  # spent MRTR request states past their expiry
        count = store.delete_spent_request_states(batch)
        spent += count
        if count < batch:
            break
    for _ in range(max_batches):  # creates-per-second buckets idle for an hour
        if store.delete_idle_buckets(batch) < batch:
            break
    for _ in range(max_batches):  # incomplete artifacts of ended tasks (a job killed mid-upload)
        if store.delete_orphan_artifacts(batch) < batch:
            break
    audit = _collect_console(store, batch, max_batches)
    if checkpoint_dir:
        sweep_checkpoint_dir(store, Path(checkpoint_dir))
    if artifact_dir:
        sweep_artifact_dir(store, ArtifactDirectory(artifact_dir))
    store.record_run("collect_garbage", deleted)
    metrics.gc_deleted.inc(deleted)
    metrics.gc_last_run.set_to_current_time()
    if deleted or sessions or spent or audit:
        logger.info(
            "collected %d expired tasks, %d expired sessions, %d spent request states and %d "
            "console audit rows", deleted, sessions, spent, audit,
        )  # fmt: skip
    return deleted


def _collect_console(store: WorkerStore, batch: int, max_batches: int) -> int:
    """The console's audit past ``console_audit_retention_seconds`` (0: kept), and sign-outs whose
    sessions have all expired; returns how many audit rows went."""
    for _ in range(max_batches):
        if store.delete_expired_revocations(batch) < batch:
            break
    deleted = 0
    for _ in range(max_batches):
        count = store.delete_old_console_actions(batch)
        deleted += count
        if count < batch:
            break
    return deleted


def sweep_checkpoint_dir(
    store: WorkerStore, root: Path, *, older_than_s: float = ORPHAN_AFTER_S, limit: int = 1000
) -> int:
    """Remove the job folders of ``checkpoint_dir`` (``<root>/<job_id>/``) whose task row is gone
    (collected, purged) and that nobody touched for ``older_than_s``; returns how many. The
    maintenance worker needs the directory mounted as the workers have it."""
    if not root.is_dir():
        return 0
    now = time.time()
    stale = {}
    for entry in root.iterdir():
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > older_than_s:
                stale[entry.name] = entry
        except OSError:
            continue  # removed meanwhile
        if len(stale) >= limit:
            break
    if not stale:
        return 0
    orphans = set(stale) - store.known_jobs(list(stale))
    for job_id in orphans:
        shutil.rmtree(stale[job_id], ignore_errors=True)
    if orphans:
        logger.info("removed the checkpoint files of %d deleted tasks", len(orphans))
    return len(orphans)


def sweep_artifact_dir(
    store: WorkerStore,
    directory: ArtifactDirectory,
    *,
    older_than_s: float = ORPHAN_AFTER_S,
    limit: int = 1000,
) -> int:
    """Remove the files under ``artifact_dir`` (complete or partial) whose artifact row is gone
    (collected with its task, an interrupted upload swept) and that nobody touched for
    ``older_than_s``; returns how many. A row is inserted before its file is opened, so a file
    without a row is never one being written."""
    stale = directory.stale_files(older_than_s, limit)
    if not stale:
        return 0
    orphans = set(stale) - store.known_artifacts(list(stale))
    for artifact_id in orphans:
        directory.remove(artifact_id)
    if orphans:
        logger.info("removed the files of %d deleted artifacts", len(orphans))
    return len(orphans)


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
    """The outbox's safety net, each part bounded; returns how many jobs it published:

    - a fair pass over every queue's backlog (``outbox.release_and_publish``): the API runs it
      on every change, this covers an API that is down or crashed;
    - lost broker messages (``_lost``): when a queue holds fewer messages than its published
      jobs no worker holds, the missing ones are published again, oldest first, each at most
      once per ``republish_idle_queue_after_seconds``; a job merely queued is never touched;
    - lost leases: an active job whose worker died is handed back to the queue once;
    - jobs still in the backlog after the broker was unreachable for
      ``undispatched_fail_after_seconds`` fail with a clear error (waiting alone never fails);
    - cancelled tasks nobody runs any more stop showing as ``stopping``.

    A sweep that cannot reach the database is remembered: the next one holds back lost-lease
    reclaims (see ``_leases_trustworthy``).
    """
    global _missed
    try:
        published = _sweep(store, publish_job, settings, queue_depth, limit)
    except InfrastructureError:
        _missed = True  # this sweep could not reach the database: remembered for the next one
        raise
    ended = store.end_unattended_stops()
    if ended:
        logger.info("%d cancelled tasks whose job nobody runs any more marked stopped", ended)
    _expire_suspended(store, settings, limit)
    return published


def _sweep(
    store: WorkerStore, publish_job: PublishJob, settings: Settings, queue_depth: QueueDepth, limit: int
) -> int:
    _fail_not_queued(store, settings)
    released = republished = 0
    try:
        released, _ = release_and_publish(
            store, settings, lambda job_id, queue, _headers: publish_job(job_id, queue)
        )
        lost = _lost(store, settings, queue_depth, limit)
        for job_id, queue in lost:
            publish_job(job_id, queue)
            republished += 1
        if _leases_trustworthy(store, settings):
            for job_id, queue in store.lost_leases(settings.lease_grace_seconds, limit):
                publish_job(job_id, queue)
                republished += 1
    except BrokerUnavailable:
        logger.warning("the sweeper could not reach the broker", exc_info=True)
    except BrokerUnreachable:
        # A re-publish failed: the rows stay stamped, so the next period tries again.
        store.broker_down(True)
        logger.warning("the sweeper could not publish", exc_info=True)
    except InfrastructureError:
        raise
    except Exception:
        # A re-publish failed for another reason (the broker refused it): as above.
        store.broker_down(True)
        logger.warning("the sweeper could not publish", exc_info=True)
    if republished:
        metrics.sweeper_republished.inc(republished)
        logger.info("sweeper re-published %d jobs", republished)
    overdue = gc_overdue(store, settings)
    if overdue is not None:
        logger.error("ALARM: the garbage collector has not run for %.0f s; is beat running?", overdue)
    store.record_run("sweep", released + republished)
    return released + republished


def _expire_suspended(store: WorkerStore, settings: Settings, limit: int) -> None:
    """Suspended tasks nobody answered within ``suspended_input_timeout_seconds`` end as a tool
    error, as a resident wait that timed out does (nothing else would ever end them: no process,
    message or timer is held for a suspended task)."""
    waited = settings.suspended_input_timeout_seconds
    message = f"Nobody answered the input request within {waited:.0f} s"
    result = {"content": [{"type": "text", "text": message}], "isError": True}
    expired = store.expire_suspended(waited, result, message, limit)
    if expired:
        logger.info("%d suspended tasks nobody answered ended", expired)


def _fail_not_queued(store: WorkerStore, settings: Settings) -> None:
    """Fail backlog jobs only when the broker has been unreachable for the whole threshold (as
    the publishers recorded it): a job waiting its turn in the fair backlog is not failed."""
    down_for = store.seconds_since_run(BROKER_DOWN_JOB)
    if down_for is None or down_for < settings.undispatched_fail_after_seconds:
        return
    failed = store.fail_undispatched(
        settings.undispatched_fail_after_seconds,
        {"code": codes.INTERNAL_ERROR, "message": "The job could not be queued (the broker was unavailable)"},
        "could not be queued",
    )
    if failed:
        logger.error("failed %d tasks whose jobs could not be published", failed)


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


def _lost(
    store: WorkerStore, settings: Settings, queue_depth: QueueDepth, limit: int
) -> list[tuple[str, str]]:
    """Published jobs whose message is gone, each re-stamped so it comes back only a period later.

    Fair dispatch keeps few published-but-unstarted jobs per queue, so they can be counted: when
    the broker holds fewer messages in a queue than that count, the difference was lost (a
    broker that lost its data, a worker that died or lost its connection before starting the
    job: on Redis the message is gone, or with ack emulation kept aside until its visibility
    timeout; RabbitMQ requeues it). The oldest
    of them, once older than ``republish_idle_queue_after_seconds``, are published again. When
    the broker cannot be asked, only after ``republish_unstarted_after_seconds``.
    """
    after = settings.republish_idle_queue_after_seconds
    jobs: list[tuple[str, str]] = []
    for queue, (queued, old) in store.queued_counts(after).items():
        if not old:
            continue
        depth = queue_depth(queue)
        if depth is None:
            jobs += store.unstarted(settings.republish_unstarted_after_seconds, limit, queue)
            continue
        missing = min(queued - depth, old, limit)
        if missing > 0:
            jobs += store.unstarted(after, missing, queue)
    return jobs
