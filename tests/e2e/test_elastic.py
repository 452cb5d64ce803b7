"""Elastic pools (issue 30) on real processes: the demand an autoscaler reads rises and falls with
the work and equals a hand count of the rows (suspended tasks left out, so a pool whose tasks all
wait for humans reaches zero); workers register, a SIGKILLed one drops out after its timeout, a
cleanly stopped one deregisters, and a worker consuming a queue no tool routes to is reported.

Each test starts its own API and prefork workers (Redis) with fast heartbeats and samples.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.e2e.test_observability import scrape, value
from tests.support import (
    REDIS_URL,
    ROOT,
    TEST_TOOL_MODULES,
    Client,
    Proc,
    meta,
    spawn,
    stack_env,
    start_api,
    start_worker,
    wait_until,
)

TOOLS = json.dumps([*json.loads(TEST_TOOL_MODULES), "tests.fixtures.suspend"])
FAST = {
    "MCP_TASKS_TOOL_MODULES": TOOLS,
    "MCP_TASKS_WORKER_HEARTBEAT_SECONDS": "0.3",
    "MCP_TASKS_WORKER_HEARTBEAT_TIMEOUT_SECONDS": "2",
    "MCP_TASKS_DEMAND_INTERVAL_SECONDS": "0.2",
    "MCP_TASKS_SUSPEND_AFTER_SECONDS": "0.5",
}
# The view and a hand count of the rows, in one statement: one snapshot, so they must agree.
COUNTS = """
SELECT d.demand_slots, d.waiting_suspended, d.worker_slots, d.workers,
       (SELECT count(*) FROM mcp_tasks t WHERE t.queue = %(queue)s
          AND t.status IN ('working', 'input_required') AND t.suspended_at IS NULL) AS hand,
       (SELECT count(*) FROM mcp_tasks t WHERE t.queue = %(queue)s
          AND t.status = 'input_required' AND t.suspended_at IS NOT NULL) AS hand_suspended
FROM (SELECT 1) one LEFT JOIN mcp_queue_demand d ON d.queue = %(queue)s
"""


def counts(database_url: str, queue: str) -> dict[str, Any]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(COUNTS, {"queue": queue}).fetchone()
    assert row is not None
    return {key: value or 0 for key, value in row.items()}


def workers(database_url: str, *, include_dead: bool = False) -> list[dict[str, Any]]:
    """What ``tasks workers --json`` prints: the real command, against the test's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TASKS_")}
    env["MCP_TASKS_DATABASE_URL"] = database_url
    args = [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "workers", "--json"]
    done = subprocess.run(args + (["--all"] if include_dead else []), env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    listed: list[dict[str, Any]] = json.loads(done.stdout)["workers"]
    return listed


def test_demand_rises_and_falls_with_mixed_work_and_leaves_suspended_tasks_out(
    db_url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = stack_env(
        db_url, REDIS_URL, "el" + db_url.rsplit("_", 1)[-1], MCP_TEST_SUSPEND_MARKS=str(marks), **FAST
    )
    queue = env["MCP_TASKS_DEFAULT_QUEUE"]
    worker = start_worker("elastic-load-worker", env, concurrency=2)
    api: Proc | None = None
    try:
        api, url = start_api("elastic-load-api", env)
        metrics_url = url.removesuffix("/mcp") + "/metrics"
        client = Client(url)
        client.wait_status(client.start("noop"), timeout=60)
        wait_until(lambda: counts(db_url, queue)["worker_slots"] == 2, 20, 0.1, what="the worker's slots")
        assert counts(db_url, queue)["demand_slots"] == 0

        sleeps = [client.start("sleep_ms", {"ms": 2000}) for _ in range(6)]
        asks = []
        for tag in ("x", "y"):
            params = {
                "name": "sp_prework_ask",
                "arguments": {"tag": tag},
                "_meta": meta(True, elicitation={}),
            }
            asks.append(str(client.request("tools/call", params).result["taskId"]))
        seen: list[dict[str, Any]] = []
        gauge: list[float] = []

        def settled() -> bool:
            now = counts(db_url, queue)
            seen.append(now)
            gauge.append(value(scrape(metrics_url), "mcp_queue_demand_slots", queue=queue))
            return all(client.get(t).result["status"] == "completed" for t in sleeps) and (
                now["hand_suspended"] == 2)  # fmt: skip

        wait_until(settled, 60, 0.1, what="the sleeps to finish and the questions to suspend")
        assert all(row["demand_slots"] == row["hand"] for row in seen), seen
        assert all(row["waiting_suspended"] == row["hand_suspended"] for row in seen), seen
        assert max(row["demand_slots"] for row in seen) >= 6, seen
        assert max(gauge) >= 5, gauge  # sampled every 0.2 s: it saw the peak, or one job short of it
        # Every task left waits for a human with no slot: nothing for an autoscaler to run.
        final = counts(db_url, queue)
        assert (final["demand_slots"], final["waiting_suspended"]) == (0, 2), final
        wait_until(lambda: value(scrape(metrics_url), "mcp_queue_demand_slots", queue=queue) == 0, 5, 0.1)
        suspended = value(scrape(metrics_url), "mcp_queue_waiting_input", queue=queue, where="suspended")
        assert suspended == 2

        for task_id in asks:  # the answers bring them back: demand again, then none
            assert (
                client.update(task_id, {"go": {"action": "accept", "content": {"answer": "ok"}}}).status
                == 200
            )
        for task_id in asks:
            assert client.wait_status(task_id, timeout=60)["status"] == "completed"
        assert counts(db_url, queue)["demand_slots"] == 0
        wait_until(lambda: value(scrape(metrics_url), "mcp_queue_waiting_input", queue=queue,
                                 where="suspended") == 0, 5, 0.1)  # fmt: skip
        client.close()
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)


def test_two_workers_register_a_killed_one_drops_out_and_a_stopped_one_deregisters(db_url: str) -> None:
    env = stack_env(db_url, REDIS_URL, "ew" + db_url.rsplit("_", 1)[-1], **FAST)
    queue, typo = env["MCP_TASKS_DEFAULT_QUEUE"], env["MCP_TASKS_DEFAULT_QUEUE"] + "-typo"
    first = start_worker("elastic-first", env, concurrency=2)
    second_node = f"elastic-second-{os.getpid()}@localhost"
    second = spawn("elastic-second", ["worker", "-P", "prefork", "-c", "3", "-Q", f"{queue},{typo}",
                                      "-n", second_node, "--log-level", "info"], env)  # fmt: skip
    api: Proc | None = None
    try:
        api, url = start_api("elastic-workers-api", env)
        metrics_url = url.removesuffix("/mcp") + "/metrics"
        wait_until(lambda: counts(db_url, queue)["workers"] == 2, 60, 0.1, what="both workers to register")
        listed = {row["node"]: row for row in workers(db_url)}
        assert set(listed) == {f"elastic-first-{os.getpid()}@localhost", second_node}
        assert (listed[second_node]["slots"], sorted(listed[second_node]["queues"])) == (
            3,
            sorted([queue, typo]),
        )
        assert listed[second_node]["pool"] == "prefork" and listed[second_node]["devices"] is None
        assert counts(db_url, queue)["worker_slots"] == 5

        # What each runs now: two long jobs, each listed under the worker whose child claimed it.
        client = Client(url)
        spins = [client.start("spin", {"seconds": 3}) for _ in range(2)]
        running = wait_until(lambda: sum(len(row["jobs"]) for row in workers(db_url)) == 2 or None, 30, 0.2)
        assert running

        # The queue nobody routes to: a warning line in the worker's log and in the API's, and a metric.
        assert "no tool routes jobs to it" in second.log.read_text()
        wait_until(lambda: value(scrape(metrics_url), "mcp_queue_unrouted_workers", queue=typo) == 1, 10, 0.1)
        assert "no tool of this API routes jobs to it" in api.log.read_text()
        for task_id in spins:
            assert client.wait_status(task_id, timeout=60)["status"] == "completed"
        client.close()

        second.kill()  # SIGKILL to the whole process group: no chance to deregister
        killed_at = time.monotonic()
        wait_until(lambda: counts(db_url, queue)["workers"] == 1, 10, 0.1, what="the dead worker to drop out")
        assert time.monotonic() - killed_at < 5  # the timeout is 2 s after the last heartbeat
        assert counts(db_url, queue)["worker_slots"] == 2
        dead = [row for row in workers(db_url, include_dead=True) if not row["alive"]]
        assert [row["node"] for row in dead] == [second_node]

        # The registry out of reach (here: its table renamed away, as before a migration): one
        # warning line, the jobs run on, and the worker registers again once it is back.
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE mcp_workers RENAME TO mcp_workers_away")
        wait_until(lambda: "heartbeat failed" in first.log.read_text(), 10, 0.1, what="the warning")
        client = Client(url)
        assert client.wait_status(client.start("noop"), timeout=30)["status"] == "completed"
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DELETE FROM mcp_workers_away")
            conn.execute("ALTER TABLE mcp_workers_away RENAME TO mcp_workers")
        wait_until(
            lambda: counts(db_url, queue)["workers"] == 1, 10, 0.1, what="the worker to register again"
        )
        assert first.log.read_text().count("heartbeat failed") == 1  # once per outage, not per beat
        client.close()

        first.stop(signal.SIGTERM, timeout=30)  # a warm shutdown deletes its row
        assert [row["node"] for row in workers(db_url)] == []
    finally:
        if api is not None:
            api.stop()
        first.stop(signal.SIGQUIT, timeout=20)
        second.kill()


def test_a_pod_told_to_stop_gives_its_job_back_without_using_an_attempt(db_url: str) -> None:
    # What Kubernetes does at a scale-down: SIGTERM to the container's main process (the worker's
    # main process, not its group), REMAP_SIGTERM=SIGQUIT as in deploy/k8s, a short soft shutdown.
    env = stack_env(db_url, REDIS_URL, "eg" + db_url.rsplit("_", 1)[-1], REMAP_SIGTERM="SIGQUIT",
                    MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS="1", **FAST)  # fmt: skip
    leaving = start_worker("elastic-leaving", env, concurrency=1)
    api: Proc | None = None
    staying: Proc | None = None
    try:
        api, url = start_api("elastic-stop-api", env)
        client = Client(url)
        client.wait_status(client.start("noop"), timeout=60)
        task_id = client.start("spin", {"seconds": 4})
        wait_until(lambda: _row(db_url, task_id)["worker"], 30, 0.05, what="the job to start")
        started = time.monotonic()
        os.kill(leaving.popen.pid, signal.SIGTERM)
        leaving.popen.wait(30)
        assert time.monotonic() - started < 15  # well inside the pod's grace period
        row = _row(db_url, task_id)
        assert (row["status"], row["worker"], row["attempts"], row["redeliveries"]) == (
            "working",
            None,
            0,
            1,
        ), row
        staying = start_worker("elastic-staying", env, concurrency=1)
        done = client.wait_status(task_id, timeout=60)
        assert done["status"] == "completed" and not done["result"].get("isError"), done
        assert _row(db_url, task_id)["attempts"] == 1  # the run that finished is the only attempt
        client.close()
    finally:
        if api is not None:
            api.stop()
        leaving.kill()
        if staying is not None:
            staying.stop(signal.SIGQUIT, timeout=20)


def _row(database_url: str, task_id: str) -> dict[str, Any]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert row is not None
    return row
