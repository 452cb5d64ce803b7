"""``lease_self_fence``: its three values (and the old booleans), the decision of ``auto``, and
the watchdog acting on it. The beacon on real brokers: tests/integration/test_beacon.py; the
partition itself: tests/faults/test_partitions.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mcp_celery_tasks.broker.beacon import beacon_body, namespace
from mcp_celery_tasks.broker.fencing import BEACON_FRESH_S, BEACON_INTERVAL_S, should_fence
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.worker.watchdog import RunningJob, Watchdog
from tests.unit.test_watchdog import HOST, Rows

JOB = RunningJob("j", 1, claimed_as=f"{HOST}:1:x")


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("off", "off"), ("on", "on"), ("auto", "auto"), ("AUTO", "auto"), (" On ", "on"),
        ("true", "on"), ("false", "off"), ("True", "on"), ("1", "on"), ("0", "off"),
        ("yes", "on"), ("no", "off"),
    ],
)  # fmt: skip
def test_the_environment_spells_the_mode_old_booleans_included(
    raw: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_TASKS_LEASE_SELF_FENCE", raw)
    assert Settings().lease_self_fence == mode


def test_the_default_is_auto_and_a_bool_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCP_TASKS_LEASE_SELF_FENCE", raising=False)
    assert Settings().lease_self_fence == "auto"
    assert Settings(lease_self_fence=True).lease_self_fence == "on"
    assert Settings(lease_self_fence=False).lease_self_fence == "off"


@pytest.mark.parametrize("raw", ["maybe", "2", "", "auto-ish"])
def test_an_unknown_mode_is_refused_naming_the_three(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_TASKS_LEASE_SELF_FENCE", raw)
    with pytest.raises(ValidationError, match="'off', 'on' or 'auto'"):
        Settings()


def test_on_always_fences_and_off_never_whatever_the_beacon() -> None:
    for heard in (None, 0.1, 100.0):
        assert should_fence("on", heard, 10.0)
        assert not should_fence("off", heard, 10.0)


def test_auto_fences_only_on_a_fresh_beacon_heard_after_the_failures_began() -> None:
    failing_for = 5.0
    assert should_fence("auto", 0.5, failing_for)  # Postgres answers the others: a partition
    assert should_fence("auto", BEACON_FRESH_S, failing_for)
    assert not should_fence("auto", None, failing_for)  # never heard: Postgres or the broker down
    assert not should_fence("auto", BEACON_FRESH_S + 0.1, failing_for)  # it stopped: Postgres down
    # Heard before the failures had lasted a beacon interval: it may have been sent just before
    # an outage of Postgres itself began, so it proves nothing.
    assert not should_fence("auto", 0.5, 0.5 + BEACON_INTERVAL_S - 0.01)
    assert should_fence("auto", 0.5, 0.5 + BEACON_INTERVAL_S)


def _dog(rows: Rows, heard: list[float | None], **settings: Any) -> tuple[Watchdog, list[str]]:
    terminated: list[str] = []
    base = {"cancel_grace_seconds": 5.0, "tool_memory_limit_mb": 0, "tool_time_limit_seconds": 0,
            "lease_seconds": 10.0, "watchdog_interval_seconds": 1.0}  # fmt: skip
    made = Watchdog(
        rows,
        Settings(**{**base, **settings}),
        terminate=lambda job: terminated.append(job.job_id),
        signal_soft_limit=lambda _: None,
        hostname=HOST,
        beacon_heard_ago=lambda: heard[0],
    )
    return made, terminated


def _cut_off(made: Watchdog, rows: Rows, clock: list[float], seconds: range) -> None:
    made.tick([JOB])  # renewed at 1000: the lease runs to 1010
    assert rows.renewed == ["j"]
    rows.down = True
    for second in seconds:
        clock[0] = 1000.0 + second
        made.tick([JOB])


def test_auto_with_the_beacon_heard_stops_the_job_before_its_lease_lapses(
    clock: list[float], procs: dict[int, Any]
) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    heard: list[float | None] = [0.4]  # the maintenance worker reaches Postgres all along
    made, terminated = _dog(rows, heard, lease_self_fence="auto")
    _cut_off(made, rows, clock, range(1, 9))
    assert terminated == []  # 8 s without a renewal: the lease still holds past the next tick
    clock[0] = 1009.0  # a lease less one interval
    made.tick([JOB])
    assert terminated == ["j"]
    clock[0] = 1010.0
    made.tick([JOB])
    assert terminated == ["j"]  # once


def test_auto_without_a_beacon_lets_the_job_run_through_a_postgres_outage(
    clock: list[float], procs: dict[int, Any], caplog: pytest.LogCaptureFixture
) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    heard: list[float | None] = [0.4]
    made, terminated = _dog(rows, heard, lease_self_fence="auto")
    made.tick([JOB])
    rows.down = True  # Postgres itself is down: the beacon stops with it
    for second in range(1, 61):
        clock[0] = 1000.0 + second
        heard[0] = 0.4 + second
        made.tick([JOB])
    assert terminated == []
    held_back = [r for r in caplog.records if getattr(r, "event", None) == "worker.fence_held_back"]
    assert len(held_back) == 1  # one line per outage, not one per tick


def test_auto_does_not_fence_on_a_beacon_heard_just_before_the_outage(
    clock: list[float], procs: dict[int, Any]
) -> None:
    """A lease short enough that the fence is due while the last beacon before an outage of
    Postgres is still fresh: that beacon was heard before the failures began, so nothing stops."""
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    heard: list[float | None] = [0.0]
    made, terminated = _dog(rows, heard, lease_self_fence="auto", lease_seconds=3.0)
    made.tick([JOB])  # renewed at 1000, the beacon heard at 1000 too
    rows.down = True
    for second in (1, 2, 3):  # the first failure goes out at 1001; due from 1002
        clock[0] = 1000.0 + second
        heard[0] = float(second)
        made.tick([JOB])
    assert terminated == []


def test_auto_fences_when_the_beacon_comes_back_while_renewals_still_fail(
    clock: list[float], procs: dict[int, Any]
) -> None:
    """Postgres down for everyone, then back for all but this worker: fence once a beacon is
    heard again (the job may be taken over from then on)."""
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    heard: list[float | None] = [None]
    made, terminated = _dog(rows, heard, lease_self_fence="auto")
    _cut_off(made, rows, clock, range(1, 15))
    assert terminated == []
    heard[0] = 0.2
    clock[0] = 1015.0
    made.tick([JOB])
    assert terminated == ["j"]


def test_a_renewal_that_works_again_ends_the_outage(clock: list[float], procs: dict[int, Any]) -> None:
    rows = Rows()
    rows.row("j")
    procs[1] = ("R", 0)
    heard: list[float | None] = [0.3]
    made, terminated = _dog(rows, heard, lease_self_fence="auto")
    _cut_off(made, rows, clock, range(1, 5))
    rows.down = False  # back within the lease
    clock[0] = 1005.0
    made.tick([JOB])
    rows.down = True
    for second in range(6, 14):  # the next failures count from 1005's renewal
        clock[0] = 1000.0 + second
        made.tick([JOB])
    assert terminated == []
    clock[0] = 1014.0
    made.tick([JOB])
    assert terminated == ["j"]


def test_the_beacon_namespace_is_the_deployments_whatever_role_or_host_reaches_its_database() -> None:
    def ns(url: str, **settings: Any) -> str:
        return namespace(Settings(database_url=url, **settings))

    api = ns("postgresql://mcp_tasks_api:pw@pg-a:5432/tasks")
    assert ns("postgresql://mcp_tasks_maintenance@pg-a:5432,pg-b:5432/tasks?target_session_attrs=any") == api
    assert ns("dbname=tasks host=pgbouncer user=worker") == api
    assert ns("postgresql://mcp_tasks_api:pw@pg-a:5432/other") != api  # another deployment
    assert ns("postgresql://mcp_tasks_api:pw@pg-a:5432/tasks", maintenance_queue="b.maintenance") != api
    body = beacon_body(api)
    assert set(body) == {"kind", "v", "ns", "sent"}  # no task, job, host or secret


def test_an_outage_seen_with_no_job_left_does_not_count_for_the_next_job(
    clock: list[float], procs: dict[int, Any]
) -> None:
    """The beacon must be heard a beacon interval after *this* job's renewals began to fail: an
    earlier outage, left while no job ran, does not make a fresh one look long."""
    rows = Rows()
    rows.row("j")
    rows.row("k")
    procs[1], procs[2] = ("R", 0), ("R", 0)
    heard: list[float | None] = [0.0]
    made, terminated = _dog(rows, heard, lease_self_fence="auto", lease_seconds=3.0)
    made.tick([JOB])
    rows.down = True
    clock[0] = 1001.0
    made.tick([JOB])  # failing since 1001
    clock[0] = 1001.5
    made.tick([])  # the job ended (its process died): nothing to renew
    second_job = RunningJob("k", 2, claimed_as=f"{HOST}:2:y")
    for second in (10, 11, 12, 13):  # claimed at 1010 just before Postgres itself went down
        clock[0] = 1000.0 + second
        heard[0] = second - 10.0  # the last beacon was heard at 1010
        made.tick([second_job])
    assert terminated == []
