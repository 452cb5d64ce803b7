"""The demand gauges of an API process: ``mcp_queue_demand`` read once per interval.

Prometheus scrapes read the gauges as the last sample left them, so a scrape costs no query and
N API replicas cost N queries per ``demand_interval_seconds`` whatever the scrape rate. The view
(migration 0013) is the same number KEDA's PostgreSQL trigger reads, so an autoscaler on either
sees the same demand.

A queue that disappears from the view (no active task, no live worker) is set to 0, not left at
its last value; a live worker consuming a queue no tool of this API routes to is a warning line
and ``mcp_queue_unrouted_workers``; a sample that cannot reach the database keeps the last values
and counts ``mcp_demand_sample_failures``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Protocol

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.store.fleet import DemandRow
from mcp_celery_tasks.telemetry import metrics

__all__ = ["DemandGauges", "DemandStore"]

logger = logging.getLogger("mcp_celery_tasks.demand")


class DemandStore(Protocol):
    async def queue_demand(self) -> list[DemandRow]: ...


class DemandGauges:
    """Samples the demand view into the ``mcp_queue_*`` gauges."""

    def __init__(self, store: DemandStore, interval_s: float, routed: Collection[str]) -> None:
        self._store = store
        self._interval_s = interval_s
        self._routed = frozenset(routed)
        self._seen: set[str] = set()
        self._unrouted: set[str] = set()
        self._failing = False

    async def run(self) -> None:
        """Sample now and then every interval, until cancelled."""
        while True:
            try:
                await self.sample()
            except Exception:  # a bug or a schema not migrated: the next interval tries again
                logger.exception("demand gauges: the sample failed")
            await asyncio.sleep(self._interval_s)

    async def sample(self) -> list[DemandRow] | None:
        """One query; the rows it set the gauges from (None: the database did not answer)."""
        try:
            rows = await self._store.queue_demand()
        except InfrastructureError as exc:
            metrics.demand_sample_failures.inc()
            if not self._failing:
                logger.warning("demand gauges: cannot read mcp_queue_demand (%s); keeping the last values",
                               exc.__cause__ or exc)  # fmt: skip
            self._failing = True
            return None
        self._failing = False
        now = {row["queue"]: row for row in rows}
        for queue in self._seen - set(now):
            _publish(_empty(queue))
        for row in rows:
            _publish(row)
        self._seen = set(now)
        self._check_routes(now)
        return rows

    def _check_routes(self, rows: dict[str, DemandRow]) -> None:
        unrouted = {queue for queue, row in rows.items() if row["workers"] and queue not in self._routed}
        for queue in unrouted - self._unrouted:
            logger.warning(
                "%d live worker(s) consume queue %r, but no tool of this API routes jobs to it "
                "(tools use: %s): their slots sit idle; check their -Q",
                rows[queue]["workers"],
                queue,
                ", ".join(sorted(self._routed)),
                extra={"event": "demand.unrouted_queue", "queue": queue},
            )
        for queue in self._unrouted | unrouted:
            metrics.queue_unrouted_workers.labels(queue).set(
                rows[queue]["workers"] if queue in unrouted else 0
            )
        self._unrouted = unrouted


def _empty(queue: str) -> DemandRow:
    return {"queue": queue, "demand_slots": 0, "backlog": 0, "published": 0, "running": 0,
            "waiting_resident": 0, "waiting_suspended": 0, "oldest_queued_s": 0.0, "worker_slots": 0,
            "slots_available": 0, "workers": 0}  # fmt: skip


def _publish(row: DemandRow) -> None:
    queue = row["queue"]
    metrics.queue_demand_slots.labels(queue).set(row["demand_slots"])
    metrics.queue_backlog.labels(queue).set(row["backlog"])
    metrics.queue_published.labels(queue).set(row["published"])
    metrics.queue_running.labels(queue).set(row["running"])
    metrics.queue_waiting_input.labels(queue, "resident").set(row["waiting_resident"])
    metrics.queue_waiting_input.labels(queue, "suspended").set(row["waiting_suspended"])
    metrics.queue_oldest_queued_seconds.labels(queue).set(row["oldest_queued_s"])
    metrics.queue_worker_slots.labels(queue).set(row["worker_slots"])
    metrics.queue_slots_available.labels(queue).set(row["slots_available"])
    metrics.queue_workers.labels(queue).set(row["workers"])
