"""The worker registry's heartbeat and the API's demand gauges, over doubles: what an operator
sees when the registry cannot be reached, when two workers share a node name, when two beats
run, and when a queue empties (tests/integration/test_fleet.py and tests/e2e/test_elastic.py
run the same code on Postgres and real workers)."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from prometheus_client import REGISTRY

from mcp_celery_tasks.api.demand import DemandGauges
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.fleet import DemandRow, NodeHolder, WorkerInfo
from mcp_celery_tasks.worker import presence
from mcp_celery_tasks.worker.presence import Presence, note_beat, unrouted_queues

INFO = WorkerInfo(
    node="w@h", hostname="h", pid=1, pids=[2], queues=["q"], slots=2, version="1", pool="prefork",
    instance="i", started_at=dt.datetime(2026, 12, 2, tzinfo=dt.UTC),
)  # fmt: skip


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


class Registry:
    def __init__(self) -> None:
        self.down = False
        self.holder: NodeHolder | None = None
        self.beats = 0
        self.deregistered: list[str] = []
        self.others: list[str] = []

    def heartbeat(self, info: WorkerInfo, timeout_s: float) -> NodeHolder | None:
        if self.down:
            raise InfrastructureError("the task database is unavailable")
        self.beats += 1
        return self.holder

    def deregister(self, info: WorkerInfo) -> bool:
        if self.down:
            raise InfrastructureError("the task database is unavailable")
        self.deregistered.append(info.node)
        return True

    def saw_beat(self, node: str, timeout_s: float, interval_s: float) -> list[str]:
        if self.down:
            raise InfrastructureError("the task database is unavailable")
        return self.others


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_an_unreachable_registry_is_one_warning_and_a_metric_and_the_next_beat_registers_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    store = Registry()
    beat = Presence(store, Settings(), lambda: INFO)
    failures = sample("mcp_worker_heartbeat_failures_total")
    store.down = True
    assert [beat.beat() for _ in range(3)] == [False, False, False]
    assert sample("mcp_worker_heartbeat_failures_total") == failures + 3
    assert sample("mcp_worker_registered") == 0
    assert len([m for m in warnings(caplog) if "heartbeat failed" in m]) == 1  # once per outage
    store.down = False
    assert beat.beat() is True
    assert sample("mcp_worker_registered") == 1
    assert any("reach the database again" in r.getMessage() for r in caplog.records)


def test_a_node_name_held_by_another_live_worker_is_a_warning_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Registry()
    store.holder = {"hostname": "other-host", "pid": 77, "started_at": INFO.started_at}
    beat = Presence(store, Settings(), lambda: INFO)
    conflicts = sample("mcp_worker_node_conflicts_total")
    assert beat.beat() is False and beat.beat() is False
    assert sample("mcp_worker_node_conflicts_total") == conflicts + 2
    (line,) = [m for m in warnings(caplog) if "is held by another live worker" in m]
    assert "other-host" in line and "pid 77" in line
    beat.stop()
    assert store.deregistered == []  # never deletes the other process's row


def test_a_clean_stop_deregisters_and_an_outage_at_stop_leaves_the_row_to_expire() -> None:
    store = Registry()
    beat = Presence(store, Settings(worker_heartbeat_seconds=0.01), lambda: INFO)
    beat.start()
    beat.stop()
    assert store.deregistered == ["w@h"] and store.beats >= 1
    store.down = True
    again = Presence(Registry(), Settings(), lambda: INFO)
    again.beat()
    again._store = store  # the database goes away before the stop
    again.stop()  # no exception: the row expires by itself


def test_two_beats_at_once_are_a_warning_and_a_gauge(caplog: pytest.LogCaptureFixture) -> None:
    store = Registry()
    assert note_beat(store, Settings(), "gen1@a") == 1
    assert sample("mcp_beats_running") == 1
    store.others = ["gen2@b"]
    presence._beats_warned.clear()
    assert note_beat(store, Settings(), "gen1@a") == 2
    assert note_beat(store, Settings(), "gen1@a") == 2
    assert sample("mcp_beats_running") == 2
    (line,) = [m for m in warnings(caplog) if "beats are running at once" in m]
    assert "gen1@a, gen2@b" in line
    assert note_beat(store, Settings(), None) == 0  # a job sent by hand, not by a beat
    store.down = True
    assert note_beat(store, Settings(), "gen1@a") == 0


def test_a_consumed_queue_nothing_routes_to_is_reported() -> None:
    assert unrouted_queues(["mcp.default", "gpu", "gpu-typo"], {"mcp.default", "gpu"}) == ["gpu-typo"]


def row(queue: str, demand: int, **counts: int) -> DemandRow:
    base: DemandRow = {"queue": queue, "demand_slots": demand, "backlog": 0, "published": 0, "running": 0,
                       "waiting_resident": 0, "waiting_suspended": 0, "oldest_queued_s": 0.0,
                       "worker_slots": 0, "slots_available": 0, "workers": 0}  # fmt: skip
    base.update(counts)  # type: ignore[typeddict-item]
    return base


class Demand:
    def __init__(self) -> None:
        self.rows: list[DemandRow] = []
        self.down = False
        self.queries = 0

    async def queue_demand(self) -> list[DemandRow]:
        self.queries += 1
        if self.down:
            raise InfrastructureError("the task database is unavailable")
        return self.rows


async def test_the_gauges_follow_the_view_and_a_queue_that_empties_goes_to_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Demand()
    gauges = DemandGauges(store, 15, routed={"u-default", "u-gpu"})
    store.rows = [row("u-gpu", 5, backlog=2, running=3, waiting_suspended=4, worker_slots=3, workers=1),
                  row("u-typo", 0, worker_slots=2, workers=2)]  # fmt: skip
    await gauges.sample()
    assert sample("mcp_queue_demand_slots", queue="u-gpu") == 5
    assert sample("mcp_queue_waiting_input", queue="u-gpu", where="suspended") == 4
    assert sample("mcp_queue_unrouted_workers", queue="u-typo") == 2
    (line,) = [m for m in warnings(caplog) if "no tool of this API routes" in m]
    assert "'u-typo'" in line
    store.rows = []
    await gauges.sample()
    assert sample("mcp_queue_demand_slots", queue="u-gpu") == 0
    assert sample("mcp_queue_worker_slots", queue="u-gpu") == 0
    assert sample("mcp_queue_unrouted_workers", queue="u-typo") == 0
    store.rows = [row("u-gpu", 1, backlog=1)]
    await gauges.sample()
    store.down = True
    failures = sample("mcp_demand_sample_failures_total")
    assert await gauges.sample() is None
    assert sample("mcp_demand_sample_failures_total") == failures + 1
    assert sample("mcp_queue_demand_slots", queue="u-gpu") == 1  # the last value stays
    assert store.queries == 4  # one query per sample, never one per scrape


def test_tasks_workers_shows_each_worker_its_jobs_and_the_demand() -> None:
    from rich.console import Console

    from mcp_celery_tasks.cli.admin.workers import workers_view

    jobs = [{"job_id": "j1", "tool": "train", "status": "working"}, {"job_id": "j2", "tool": "train"},
            {"job_id": "j3", "tool": "search"}]  # fmt: skip
    live = {"node": "gpu@pod-a", "kind": "worker", "hostname": "pod-a", "queues": ["gpu"], "slots": 4,
            "pool": "prefork", "version": "0.1.0", "devices": None, "started_at": None, "alive": True,
            "heartbeat_age_s": 3.0, "jobs": jobs}  # fmt: skip
    dead = {**live, "node": "gpu@pod-b", "alive": False, "heartbeat_age_s": 300.0, "jobs": []}
    console = Console(record=True, width=250)
    console.print(workers_view([live, dead], [row("gpu", 3, running=3, worker_slots=4, slots_available=1)]))
    text = console.export_text()
    assert "3: search, train x2" in text and "3s ago" in text and "5m ago (dead)" in text
    assert "gpu@pod-b" in text and "demand per queue" in text
