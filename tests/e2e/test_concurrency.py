"""Concurrency limits on a real stack: one API, prefork workers, Redis and the stack's own
Postgres. The fixture tools (tests/fixtures/limited.py) mark every run's start and finish from
inside the body, so "never two runs of one model at once" is checked on recorded intervals, not
on the rows that enforce it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import support
from tests.support import LOG_DIR, Client, Stack, wait_until

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.limited"]'


@pytest.fixture(scope="module")
def limit_stack(template_db: str) -> Iterator[Stack]:
    with support.stack_of_its_own("limit", template_db, TOOLS, concurrency=4) as stack:
        yield stack


@pytest.fixture
def client(limit_stack: Stack) -> Iterator[Client]:
    with_client = limit_stack.client()
    yield with_client
    with_client.close()


@pytest.fixture
def marks() -> Iterator[Path]:
    folder = LOG_DIR.parent / f"limit-marks-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


Run = tuple[str, str, str, float, float]
"""(tool, group, process, started, finished)."""


def recorded_runs(marks: Path) -> list[Run]:
    path = marks / "runs"
    started: dict[tuple[str, str, str], float] = {}
    runs: list[Run] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        event, tool, group, who, at = line.split()
        if event == "start":
            started[(tool, group, who)] = float(at)
        else:
            runs.append((tool, group, who, started.pop((tool, group, who)), float(at)))
    return runs


def most_at_once(runs: list[Run]) -> int:
    events = sorted([(r[3], 1) for r in runs] + [(r[4], -1) for r in runs])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def wait_all(client: Client, task_ids: list[str], timeout: float) -> None:
    for task_id in task_ids:
        done = client.wait_status(task_id, timeout=timeout)
        assert done["status"] == "completed" and done["result"]["isError"] is False, done


@pytest.mark.timeout(120)
def test_one_run_per_model_both_models_progress_and_other_tools_are_not_blocked(
    client: Client, marks: Path
) -> None:
    # 10 of model a, 10 of model b, on 4 slots, then two unlimited jobs behind them all.
    trains = [
        client.start("c_train", {"marks": str(marks), "model": m, "seconds": 0.3})
        for m in "a" * 10 + "b" * 10
    ]
    free = [client.start("c_free", {"marks": str(marks)}) for _ in range(2)]
    waiting = client.get(trains[5]).result
    assert waiting["status"] == "working"
    assert waiting["statusMessage"] == "waiting: 1 other run of c_train for model=a", waiting
    wait_all(client, trains + free, timeout=90)

    runs = recorded_runs(marks)
    for model in "ab":
        mine = sorted((r for r in runs if r[0] == "c_train" and r[1] == model), key=lambda r: r[3])
        assert len(mine) == 10
        assert most_at_once(mine) == 1, mine
    trained = [r for r in runs if r[0] == "c_train"]
    assert most_at_once(trained) == 2  # a and b ran side by side: both progressed
    last_train = max(r[4] for r in trained)
    assert all(r[4] < last_train - 1.0 for r in runs if r[0] == "c_free")  # not stuck behind them


@pytest.mark.timeout(60)
def test_a_job_waiting_for_its_key_is_cancelled_at_once_and_never_runs(client: Client, marks: Path) -> None:
    first = client.start("c_train", {"marks": str(marks), "model": "z", "seconds": 2.0})
    wait_until(lambda: recorded_runs(marks) or (marks / "runs").exists(), 20, what="the first run to start")
    second = client.start("c_train", {"marks": str(marks), "model": "z", "seconds": 0.1})
    assert client.get(second).result["statusMessage"] == "waiting: 1 other run of c_train for model=z"
    assert client.cancel(second).status == 200
    cancelled = client.get(second).result  # it held nothing: cancelled at once, no worker asked
    assert cancelled["status"] == "cancelled", cancelled
    wait_all(client, [first], timeout=30)
    runs = recorded_runs(marks)
    assert len(runs) == 1 and runs[0][1] == "z"


@pytest.mark.timeout(120)
def test_a_cluster_wide_limit_holds_across_two_workers(
    limit_stack: Stack, client: Client, marks: Path
) -> None:
    second = support.start_worker("limit-second", limit_stack.env, concurrency=4)
    try:
        jobs = [client.start("c_render", {"marks": str(marks), "seconds": 0.4}) for _ in range(12)]
        wait_all(client, jobs, timeout=90)
    finally:
        second.stop()
    runs = recorded_runs(marks)
    assert len(runs) == 12
    assert most_at_once(runs) == 2, sorted(runs, key=lambda r: r[3])
    assert len({r[2] for r in runs}) >= 2  # more than one process ran them
