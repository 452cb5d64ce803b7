"""The worker registry and the demand per queue, as store calls (``fleet_queries`` holds the SQL).

``RegistryCalls`` is mixed into ``WorkerStore`` (worker main processes, the maintenance worker,
the admin commands); the API reads the same demand rows through ``ApiStore.queue_demand``. A
registry that cannot be used (Postgres down, the table not migrated yet, the role not granted)
is an ``InfrastructureError``: a heartbeat that fails must never take a worker's jobs with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import LiteralString, TypedDict, TypeVar

import psycopg
from psycopg.rows import RowFactory
from psycopg.types.json import Jsonb

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.store import fleet_queries
from mcp_celery_tasks.store.row_types import OPEN_ROWS, typed_rows

__all__ = ["DEAD_KEPT_S", "DemandRow", "NodeHolder", "RegistryCalls", "WorkerInfo"]

R = TypeVar("R")

DEAD_KEPT_S = 3600.0
"""A dead worker's row stays this long past its expiry (``tasks workers --all`` shows it), then
the collector deletes it: pods come and go under new names."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker process says about itself at every heartbeat."""

    node: str
    """Celery's node name (``-n``), the row's key."""
    hostname: str
    """The machine (or pod): the first part of every worker identity its children claim jobs as."""
    pid: int
    pids: Sequence[int]
    """The main process and its pool children: the processes whose claims are this worker's."""
    queues: Sequence[str]
    slots: int
    version: str
    pool: str
    instance: str
    """Random per process: tells a second process started under the same node name apart."""
    started_at: datetime
    devices: JSONValue | None = None
    """The devices its children use (GPU assignment fills them); None: not known."""


class NodeHolder(TypedDict):
    """Another live process registered under a node name."""

    hostname: str
    pid: int
    started_at: datetime


class DemandRow(TypedDict):
    """One row of ``mcp_queue_demand``."""

    queue: str
    demand_slots: int
    backlog: int
    published: int
    running: int
    waiting_resident: int
    waiting_suspended: int
    oldest_queued_s: float
    worker_slots: int
    slots_available: int
    workers: int


class _BeatNode(TypedDict):
    node: str


class RegistryCalls:
    """The registry's store calls over the host store's one connection (``_rows``)."""

    def _rows(self, sql: LiteralString, params: Mapping[str, object], rows: RowFactory[R]) -> list[R]:
        raise NotImplementedError  # WorkerStore's

    def _execute(self, sql: LiteralString, params: Mapping[str, object]) -> int:
        raise NotImplementedError  # WorkerStore's

    def heartbeat(self, info: WorkerInfo, timeout_s: float) -> NodeHolder | None:
        """Register or refresh ``info``'s row, live for ``timeout_s``. None when it took; else
        the other live process that holds the node name (its row is left alone)."""
        params = {
            "node": info.node, "hostname": info.hostname, "pid": info.pid, "pids": list(info.pids),
            "queues": list(info.queues), "slots": info.slots, "version": info.version,
            "pool": info.pool, "instance": info.instance, "started_at": info.started_at,
            "devices": None if info.devices is None else Jsonb(info.devices), "timeout_s": timeout_s,
        }  # fmt: skip
        with _usable():
            if self._rows(fleet_queries.HEARTBEAT, params, typed_rows(_BeatNode)):
                return None
            holders = self._rows(fleet_queries.NODE_HOLDER, {"node": info.node}, typed_rows(NodeHolder))
        return holders[0] if holders else {"hostname": "?", "pid": 0, "started_at": info.started_at}

    def deregister(self, info: WorkerInfo) -> bool:
        """Delete this process's row (a clean shutdown); False if it was not there."""
        with _usable():
            return bool(
                self._execute(fleet_queries.DEREGISTER, {"node": info.node, "instance": info.instance})
            )

    def saw_beat(self, node: str, timeout_s: float, interval_s: float) -> list[str]:
        """Record that beat ``node`` (``gen<pid>@<host>``) just sent a job; the other beats that
        ran at the same time as it (more than one interval of overlap)."""
        name, _, host = node.partition("@")
        pid = int(name[3:]) if name.startswith("gen") and name[3:].isdigit() else 0
        params = {"node": node, "hostname": host or node, "pid": pid, "timeout_s": timeout_s,
                  "interval_s": interval_s}  # fmt: skip
        with _usable():
            return [row["node"] for row in self._rows(fleet_queries.SAW_BEAT, params, typed_rows(_BeatNode))]

    def delete_dead_workers(self, kept_s: float = DEAD_KEPT_S) -> int:
        with _usable():
            return self._execute(fleet_queries.DELETE_DEAD, {"kept_s": kept_s})

    def workers(self, *, include_dead: bool = False) -> list[Mapping[str, object]]:
        """Every live worker and beat (and the recently dead ones), with the jobs each runs."""
        with _usable():
            return self._rows(fleet_queries.WORKERS, {"all": include_dead}, OPEN_ROWS)

    def queue_demand(self) -> list[DemandRow]:
        with _usable():
            return self._rows(fleet_queries.DEMAND, {}, typed_rows(DemandRow))


@contextmanager
def _usable() -> Iterator[None]:
    """A registry not migrated yet, or not granted to this role, is as unusable as a database
    that is down: the caller warns and carries on."""
    try:
        yield
    except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege) as exc:
        raise InfrastructureError(
            "the worker registry cannot be used (run mcp-celery-tasks migrate, and migrate --roles)"
        ) from exc
