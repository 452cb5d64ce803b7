"""A worker the system knows: its row in the registry (``mcp_workers``), kept by a heartbeat.

A worker's main process registers as it becomes ready (node, host, pids, queues, slots, devices,
version, pool, start), refreshes the row every ``worker_heartbeat_seconds`` and deletes it on a
clean shutdown; a worker that dies stops refreshing, and its row drops out of every reader (the
demand view, ``tasks workers``) ``worker_heartbeat_timeout_seconds`` after its last heartbeat.
No Celery here: the glue hands in a ``WorkerInfo`` snapshot function.

The registry is an observer, never a dependency: a heartbeat that cannot reach Postgres (down, the
table not migrated yet) or that finds its node name held by another live process logs one
warning line and a metric, and the worker's jobs run on. The next heartbeat that works registers
again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.fleet import NodeHolder, WorkerInfo
from mcp_celery_tasks.telemetry import metrics

__all__ = ["BeatStore", "Presence", "RegistryStore", "note_beat", "unrouted_queues"]

logger = logging.getLogger("mcp_celery_tasks.worker")


class RegistryStore(Protocol):
    """The registry calls of a worker's main process (``WorkerStore`` in production)."""

    def heartbeat(self, info: WorkerInfo, timeout_s: float) -> NodeHolder | None: ...

    def deregister(self, info: WorkerInfo) -> bool: ...


class Presence:
    """One per worker main process: ``start`` registers and keeps beating, ``stop`` deregisters."""

    def __init__(self, store: RegistryStore, settings: Settings, snapshot: Callable[[], WorkerInfo]) -> None:
        self._store = store
        self._snapshot = snapshot
        self._interval_s = settings.worker_heartbeat_seconds
        self._timeout_s = settings.worker_heartbeat_timeout_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: WorkerInfo | None = None
        self.registered = False
        self._unreachable = False
        self._conflict: tuple[str, int] | None = None

    def beat(self) -> bool:
        """One heartbeat; whether this process's row is in the registry now."""
        try:
            info = self._snapshot()
            self._last = info
            holder = self._store.heartbeat(info, self._timeout_s)
        except InfrastructureError as exc:
            metrics.worker_heartbeat_failures.inc()
            if not self._unreachable:
                logger.warning(
                    "worker registry: heartbeat failed (%s); jobs run on, and the worker registers "
                    "again when the database answers",
                    exc.__cause__ or exc,
                    extra={"event": "worker.heartbeat_failed"},
                )
            self._unreachable = True
            return self._set(False)
        if self._unreachable:
            logger.info("worker registry: heartbeats reach the database again")
            self._unreachable = False
        if holder is not None:
            metrics.worker_node_conflicts.inc()
            seen = (holder["hostname"], holder["pid"])
            if self._conflict != seen:
                logger.warning(
                    "worker registry: node name %r is held by another live worker (host %s, pid %d, "
                    "started %s): give each worker its own -n (e.g. name@%%h); this one runs its "
                    "jobs but is not listed",
                    info.node,
                    holder["hostname"],
                    holder["pid"],
                    holder["started_at"],
                    extra={"event": "worker.node_conflict", "node": info.node},
                )
            self._conflict = seen
            return self._set(False)
        self._conflict = None
        return self._set(True)

    def _set(self, registered: bool) -> bool:
        self.registered = registered
        metrics.worker_registered.set(1 if registered else 0)
        return registered

    def start(self) -> None:
        """Beat at once, then every interval, on a thread of its own: a database that is slow to
        answer never delays the worker's consumer."""
        self._thread = threading.Thread(target=self._loop, name="mcp-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.beat()
            except Exception:
                logger.exception("worker registry: heartbeat failed")  # the next one tries again
            if self._stop.wait(self._interval_s):
                return

    def stop(self) -> None:
        """Stop beating and delete this process's row (best effort: it expires anyway)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._last is None or not self.registered:
            return
        try:
            self._store.deregister(self._last)
        except InfrastructureError:
            logger.info("worker registry: could not deregister; the row expires by itself")
        self._set(False)


def unrouted_queues(consumed: Iterable[str], routed: Collection[str]) -> list[str]:
    """The queues a worker consumes that nothing routes jobs to (a typo in ``-Q``, or tools that
    moved): its slots would sit idle, and the queue's real workers would be missing."""
    return sorted({queue for queue in consumed if queue not in routed})


class BeatStore(Protocol):
    def saw_beat(self, node: str, timeout_s: float, interval_s: float) -> list[str]: ...


_beats_warned: set[tuple[str, ...]] = set()


def note_beat(store: BeatStore, settings: Settings, origin: str | None) -> int:
    """The maintenance worker got a job beat sent (``origin``: the beat's node name): record
    that beat, and warn when another one ran beside it. Returns how many beats run (0: unknown).

    Two beats send every GC and sweep twice. Nothing is lost (the jobs are idempotent and take an
    advisory lock), but it is a deployment mistake (a second replica, a ``-B`` worker) worth a
    warning line and ``mcp_beats_running``."""
    if not origin:
        return 0
    interval_s = max(settings.sweep_interval_seconds, settings.gc_interval_seconds)
    timeout_s = 3 * settings.sweep_interval_seconds + interval_s
    try:
        others = store.saw_beat(origin, timeout_s, interval_s)
    except InfrastructureError:
        return 0  # the job itself reports the outage
    metrics.beats_running.set(1 + len(others))
    key = tuple(sorted([origin, *others]))
    if others and key not in _beats_warned:
        _beats_warned.add(key)
        logger.warning(
            "%d beats are running at once (%s): each GC and sweep runs twice; run exactly one beat "
            "(one replica, no worker started with -B)",
            len(key),
            ", ".join(key),
            extra={"event": "beat.duplicate", "beats": list(key)},
        )
    return 1 + len(others)
