"""One fair dispatch pass, shared by the API's fair publisher (``outbox``) and the sweeper.

The rules live in the SQL (``store.backlog``); this is the loop around it: release per queue,
publish, put back what the broker refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore

__all__ = ["BrokerUnavailable", "Publish", "release_and_publish"]

logger = logging.getLogger(__name__)

Publish = Callable[[str, str, "dict[str, str] | None"], None]
"""``publish(job_id, queue, trace_headers)``; raises when the broker refuses."""


def release_and_publish(
    store: WorkerStore,
    settings: Settings,
    publish: Publish,
    *,
    trace_headers: dict[str, dict[str, str]] | None = None,
    queues: Mapping[str, int] | None = None,
    backlogged: set[str] | None = None,
) -> tuple[int, bool]:
    """One fair pass over ``queues`` (queue -> jobs just created there; default: every queue
    with a backlog): release, publish, put back what failed.

    ``publish(job_id, queue, headers)`` raises when the broker refuses. Returns (jobs published,
    whether a backlog may still wait). Store errors propagate (``InfrastructureError``).
    ``backlogged`` is kept up to date with the queues left with a backlog."""
    published = 0
    waiting = False
    scanned = store.backlog_queues() if queues is None else sorted(queues)
    if backlogged is not None and queues is None:
        backlogged.clear()
    for queue in scanned:
        released = store.release_jobs(
            queue, settings.dispatch_ahead, settings.max_waiting_inputs_per_principal
        )
        failed: list[str] = []
        for job_id, job_queue in released:
            headers = trace_headers.pop(job_id, None) if trace_headers is not None else None
            if failed:
                failed.append(job_id)  # the broker just refused one: do not hammer it
                continue
            try:
                publish(job_id, job_queue, headers)
                published += 1
            except Exception:
                logger.warning("could not publish job %s to %s", job_id, job_queue, exc_info=True)
                failed.append(job_id)
        if failed:
            store.undispatch(failed)
            store.broker_down(True)
            raise BrokerUnavailable(f"{len(failed)} jobs of {queue} went back to the backlog")
        # The queue had a backlog; a hinted queue, when fewer jobs left than were just created
        # there (no room) or as many as it had room for (more may wait).
        left = len(released)
        more = queues is None or left < queues[queue] or left >= settings.dispatch_ahead
        waiting = waiting or more
        if backlogged is not None and more:
            backlogged.add(queue)  # only a scan (``queues`` None) forgets one
    return published, waiting


class BrokerUnavailable(Exception):
    """Publishing failed; the jobs are back in the backlog."""
