"""The load and the checks of the blips scenarios (``test_blips``): tasks that report, wait for a
human and run longer than the lease are in flight when the broker or Postgres restarts, or when
every worker is restarted; afterwards each must have completed once, its body never run twice at
once, its attempts untouched, and the broker holding at most one live message for its job."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests import support
from tests.faults.stack import FaultClient, FaultStack, wait_all_terminal

ACCEPT = {"action": "accept", "content": {"confirm": True}}
# Blip stacks keep the suite's short lease (3 s) but a production-like ratio of grace to the
# watchdog's one-second renewal (default 5 s; FAST_RECOVERY's 1 s would race a renewal).
# Reports are written at most every 50 ms (not 250), so the job's own thread writes most of them
# and a short outage surely meets one.
BLIP_SETTINGS = {
    "MCP_TASKS_LEASE_GRACE_SECONDS": "3",
    "MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS": "1",
    "MCP_TASKS_REPORT_MIN_INTERVAL_SECONDS": "0.05",
}


@dataclass
class Mix:
    """The tasks in flight when the fault hits: ``asks`` wait for an answer, ``reports`` report
    every 100 ms for ``work_ms``, ``busy`` work ``work_ms`` without touching ``ctx``."""

    asks: int = 3
    reports: int = 2
    busy: int = 1
    work_ms: int = 6000
    ids: dict[str, str] = field(default_factory=dict)  # task id -> tool

    @property
    def concurrency(self) -> int:
        return self.asks + self.reports + self.busy + 1

    def start(self, client: FaultClient) -> None:
        plan = [("fb_ask", {"then_ms": 200})] * self.asks
        plan += [("fb_report", {"ms": self.work_ms})] * self.reports
        plan += [("fb_busy", {"ms": self.work_ms})] * self.busy
        for tool, arguments in plan:
            params = {"name": tool, "arguments": arguments}
            call = client.request("create", "tools/call", params, name=tool, capabilities={"elicitation": {}})
            assert call.task_id, call.describe()
            self.ids[call.task_id] = tool

    def of(self, tool: str) -> list[str]:
        return [task_id for task_id, name in self.ids.items() if name == tool]


def start_blip_stack(stack: FaultStack, mix: Mix) -> None:
    """API, one tool worker with a child per task (and one spare), maintenance worker and beat."""
    stack.start_worker(concurrency=mix.concurrency)
    stack.start_maintenance()
    stack.start_beat()
    stack.start_api()
    stack.wait_worker_ready()
    stack.wait_sweeps(after=stack.db_now())


def wait_in_flight(stack: FaultStack, mix: Mix, timeout: float = 30) -> None:
    """Every ask waits for its answer, every other job's body has started."""

    def ready() -> bool:
        rows = stack.rows(list(mix.ids))
        asking = all(rows[t]["status"] == "input_required" for t in mix.of("fb_ask"))
        started = all(stack.marks(t)["start"] for t in mix.ids if mix.ids[t] != "fb_ask")
        return asking and started

    support.wait_until(ready, timeout, 0.1, what="every task in flight")


def answer_all(stack: FaultStack, mix: Mix, timeout: float = 60) -> None:
    """Answer each ask's outstanding question through the API (retrying while it is down)."""
    client = FaultClient(stack.url, "alice", timeout=10)
    try:
        for task_id in mix.of("fb_ask"):

            def answered(task_id: str = task_id) -> bool:
                got = client.get(task_id)
                if not got.ok:
                    return False
                task = got.result
                if task["status"] != "input_required":
                    return task["status"] in ("working", "completed")
                keys = list(task.get("inputRequests") or {})
                params = {"taskId": task_id, "inputResponses": {key: ACCEPT for key in keys}}
                return client.request("update", "tasks/update", params, name=task_id).ok

            support.wait_until(answered, timeout, 0.2, what=f"an answer to be taken for {task_id[:8]}")
    finally:
        client.close()


def runs(stack: FaultStack, task_id: str) -> list[tuple[float, float | None]]:
    """Each body run of a task: (started, ended or left; None if the process died in it)."""
    folder = stack.run_dir / task_id
    found: dict[str, dict[str, float]] = {}
    for path in folder.iterdir() if folder.exists() else ():
        event, _, run = path.name.split(".")
        found.setdefault(run, {})[event] = float(path.read_text())
    return sorted((marks["start"], marks.get("end", marks.get("left"))) for marks in found.values())


def overlapping(stack: FaultStack, task_id: str) -> bool:
    """Whether two runs of the task's body were ever under way at once (on live workers)."""
    spans = runs(stack, task_id)
    return any(end is None or end > nxt for (_, end), (nxt, _) in itertools.pairwise(spans))


def input_keys(stack: FaultStack, task_id: str) -> list[str]:
    return [r["key"] for r in stack.query("SELECT key FROM mcp_task_inputs WHERE task_id = %s", task_id)]


@dataclass
class Verdict:
    failed: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    overlapping: list[str] = field(default_factory=list)
    attempts: Counter[int] = field(default_factory=Counter)
    redeliveries: Counter[int] = field(default_factory=Counter)
    keys: Counter[int] = field(default_factory=Counter)
    starts: Counter[int] = field(default_factory=Counter)
    suspensions: Counter[int] = field(default_factory=Counter)

    def line(self) -> str:
        return (
            f"failed {len(self.failed)}, bodies rerun {len(self.rerun)}, run twice at once "
            f"{len(self.overlapping)}, attempts {dict(self.attempts)}, redeliveries "
            f"{dict(self.redeliveries)}, body starts {dict(self.starts)}, "
            f"input keys per ask {dict(self.keys)}, suspensions {dict(self.suspensions)}"
        )


def verdict(stack: FaultStack, mix: Mix, timeout: float = 90) -> Verdict:
    """Wait for every task to end, then judge each."""
    rows = wait_all_terminal(stack, timeout)
    seen = Verdict()
    for task_id, tool in mix.ids.items():
        row = rows[task_id]
        result = row["result"] or {}
        if row["status"] != "completed" or result.get("isError"):
            seen.failed.append(f"{tool} {row['status']} {row['error_kind']} {result or row['error']}")
        starts = stack.marks(task_id)["start"]
        seen.starts[starts] += 1
        # A job that suspended at its question runs again from the top when answered (by design,
        # not a blip): one start per suspend, besides the first.
        seen.suspensions[row.get("suspensions", 0)] += 1
        if starts != 1 + row.get("suspensions", 0):
            seen.rerun.append(task_id)
        if overlapping(stack, task_id):
            seen.overlapping.append(task_id)
        seen.attempts[row["attempts"]] += 1
        seen.redeliveries[row.get("redeliveries", 0)] += 1
        if tool == "fb_ask":
            seen.keys[len(input_keys(stack, task_id))] += 1
    return seen


# ---- what the broker still holds -------------------------------------------------------------


def _job_of(raw: bytes | str) -> str | None:
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if isinstance(message, list):  # the unacked hash: [message, exchange, routing key]
        message = message[0]
    headers = message.get("headers") or {}
    return headers.get("id") if headers.get("task") == "mcp_celery_tasks.run_tool" else None


def redis_live_messages(socket_path: Path, queue: str) -> Counter[str]:
    """``run_tool`` messages per job id in a Redis broker: queued, or delivered and unacked."""
    client = redis.Redis(unix_socket_path=str(socket_path))
    try:
        found: Counter[str] = Counter()
        for key in client.keys(f"{queue}*"):  # the queue and its priority lists
            if client.type(key) == b"list":
                for raw in client.lrange(key, 0, -1):
                    if job := _job_of(raw):
                        found[job] += 1
        for raw in client.hvals("unacked"):
            if job := _job_of(raw):
                found[job] += 1
        return found
    finally:
        client.close()


def settle_live_messages(count: Any, job_ids: list[str], timeout: float) -> int:
    """The most live messages any of ``job_ids`` has once the broker settles (deferred copies of
    a finished job are consumed and dropped when they come due): polled under ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = count()
        worst = max((found[j] for j in job_ids), default=0)
        if worst <= 1 or time.monotonic() > deadline:
            return worst
        time.sleep(0.5)
