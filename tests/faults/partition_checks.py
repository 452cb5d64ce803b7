"""One partition scenario from start to verdict, and the table of every scenario's numbers.

A scenario puts work in flight on both tool workers (bodies that report, bodies that never touch
``ctx``, both longer than the lease, and questions waiting for a human), keeps a client creating
small ``f_count`` tasks, cuts the network where the scenario says (``Network``), waits, heals,
answers the questions and waits for every task to end. The verdict comes from the rows and
from the records the bodies left outside the database (``net_tools``, ``tools``):

- lost: a task a client was handed that did not complete (or completed with an error);
- doubles: a task whose body ran to its end more than once, except a *rerun*: where a worker
  was cut off from Postgres past its lease, a small job it had just claimed may end there, its
  outcome unwritable; the takeover runs it again and records its own outcome (at least once,
  one outcome). A rerun is told apart by the run id the recorded result carries (``f_count``)
  and the earlier end's mark, made before the heal;
- overlaps: a task two of whose bodies did work at once (beats of one run inside another's span);
- attempts burned: claims beyond the first, summed over the tasks;
- recovery: from the heal until every task handed out is terminal.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

from tests import support
from tests.faults.blips import ACCEPT, runs
from tests.faults.stack import FaultClient, FaultStack, Load, wait_all_terminal

LEASE_S = 3.0  # FAST_RECOVERY: lease 3 s + grace 1 s
LEASE_GRACE_S = 1.0
TAKEN_OVER_BOUND_S = 3.5
"""A cut-off body whose job was taken over stops this soon after the heal: the watchdog's next
tick (1 s), whose connect, begun during the cut, may wait for its SYN's next retransmission
(up to ~2 s); measured 0.2-1.3 s here."""
TABLE: list[str] = []
"""Every scenario's row of this run, printed once the module ends."""


@dataclass
class Result:
    name: str
    cut_s: float
    target: str
    tasks: int = 0
    lost: list[str] = field(default_factory=list)
    doubles: list[str] = field(default_factory=list)
    reruns: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    attempts_burned: int = 0
    recovery_s: float = 0.0
    on_target: int = 0
    notes: str = ""
    healed_at: float = 0.0  # wall clock
    ran_on_after_heal_s: float = 0.0
    """How long after the heal the last body that overlapped a takeover still did work."""

    def row(self) -> str:
        return (
            f"| {self.name} | {self.cut_s:g} | {self.target} ({self.on_target} bodies) | {self.tasks} | "
            f"{len(self.lost)} | {len(self.doubles)} | {len(self.overlaps)} | {self.attempts_burned} | "
            f"{self.recovery_s:.1f} | {self._notes()} |"
        )

    def _notes(self) -> str:
        said = [self.notes] if self.notes else []
        if self.reruns:
            said.append(f"{len(self.reruns)} finished cut off, outcome unwritable, run again")
        if self.overlaps:
            said.append(f"cut-off body stopped {self.ran_on_after_heal_s:.1f} s after the heal")
        return "; ".join(said)


HEADER = (
    "| scenario | cut s | faulted host | tasks | lost | doubles | overlaps | attempts burned "
    "| recovery s | notes |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def beat_spans(run_dir: Path, task_id: str) -> list[tuple[int, float, float]]:
    """(pid, first beat, last beat) of each run of a beating body."""
    spans = []
    for path in (run_dir / task_id).glob("beats.*"):
        lines = path.read_text().split("\n")[:-1]
        if len(lines) > 1:
            beats = [float(x) for x in lines[1:]]
            spans.append((int(lines[0]), beats[0], beats[-1]))
    return sorted(spans, key=lambda span: span[1])


def overlapped(stack: FaultStack, task_id: str, beating: bool) -> float | None:
    """When the earlier of two runs of the task's body that were at once under way last did
    work (None if no two were): for a beating body, a run's first beat before the previous
    run's last; otherwise a run that started before the previous one ended (or left)."""
    if beating:
        spans = beat_spans(stack.run_dir, task_id)
        found = [prev[2] for prev, nxt in itertools.pairwise(spans) if nxt[1] < prev[2]]
    else:
        marks = runs(stack, task_id)
        found = [end for (_, end), (nxt, _) in itertools.pairwise(marks) if end is not None and end > nxt]
    return max(found) if found else None


def ends(run_dir: Path, task_id: str) -> int:
    folder = run_dir / task_id
    return len(list(folder.glob("end.*"))) if folder.exists() else 0


def rerun_after_a_cut(run_dir: Path, task_id: str, recorded: object, healed_at: float) -> bool:
    """Whether a body that ran to its end twice is a rerun: the recorded result is the last
    run's (its run id, ``f_count``), and every earlier run ended before the heal."""
    marks = sorted((run_dir / task_id).glob("end.*"), key=lambda path: path.stat().st_mtime)
    last_run = marks[-1].name.split(".")[-1]
    earlier_cut_off = all(path.stat().st_mtime < healed_at for path in marks[:-1])
    return earlier_cut_off and last_run in json.dumps(recorded)


def _create(client: FaultClient, tool: str, arguments: dict[str, object]) -> str:
    params = {"name": tool, "arguments": arguments}
    call = client.request("create", "tools/call", params, name=tool, capabilities={"elicitation": {}})
    assert call.task_id, call.describe()
    return call.task_id


def _answer(client: FaultClient, task_id: str) -> bool:
    got = client.get(task_id)
    if not got.ok:
        return False
    task = got.result
    if task["status"] != "input_required":
        return task["status"] in ("working", "completed")
    params = {"taskId": task_id, "inputResponses": dict.fromkeys(task.get("inputRequests") or {}, ACCEPT)}
    return client.request("update", "tasks/update", params, name=task_id).ok


def holders(stack: FaultStack, task_ids: list[str]) -> dict[str, str]:
    """Which worker (label) runs each task now, by the pid in the row's worker identity."""
    pids = {label: stack.pids_on(label) for label in ("worker", "worker2")}
    found = {}
    for task_id, row in stack.rows(task_ids).items():
        if row["worker"]:
            pid = int(row["worker"].split(":")[1])
            found[task_id] = next((label for label, group in pids.items() if pid in group), "?")
    return found


class Healer(Protocol):
    """What ends a scenario's fault: a ``Network``'s heal, or a failover's promotion."""

    def heal(self) -> None: ...


def run_scenario(
    stack: FaultStack,
    net: Healer,
    name: str,
    cut_s: float,
    fault: Callable[[str], None],
    *,
    work_ms: int | None = None,
    asks: int = 2,
    target: str | None = None,
    during: Callable[[Result, Load], None] | None = None,
    cuts_off_past_the_lease: bool = False,
) -> Result:
    """``fault(host)`` breaks the network around ``host`` (the worker host that runs the most
    bodies, unless ``target`` names one); after ``cut_s`` every rule is removed.

    Where the fault ``cuts_off_past_the_lease``, the bodies work on past the heal by more than
    ``TAKEN_OVER_BOUND_S``: a cut-off body must then be stopped by its watchdog, never reach its
    end beside the takeover's run. (Shorter bodies could end before the watchdog reaches
    Postgres again, which proves nothing and counts as a double.)"""
    client = FaultClient(stack.url, "alice", timeout=60)
    stack.closing(client)
    after_heal_s = TAKEN_OVER_BOUND_S + 2 if cuts_off_past_the_lease else 2
    work_ms = work_ms or int((cut_s + after_heal_s) * 1000)
    beating = [
        _create(client, "np_work", {"ms": work_ms, "cooperate": c}) for c in (True, True, False, False)
    ]
    asking = [_create(client, "fb_ask", {"then_ms": 200}) for _ in range(asks)]

    def in_flight() -> bool:
        rows = stack.rows(beating + asking)
        return all(rows[t]["status"] == "input_required" for t in asking) and all(
            (stack.run_dir / t).exists() for t in beating
        )

    support.wait_until(in_flight, 30, 0.05, what="every body in flight")
    where = holders(stack, beating + asking)
    labels = {"worker": "w1", "worker2": "w2"}
    if target is None:
        busiest = max(("worker", "worker2"), key=lambda label: sum(1 for w in where.values() if w == label))
        target = labels[busiest]
    result = Result(name, cut_s, target)
    result.on_target = sum(1 for w in where.values() if labels.get(w) == target)
    load = Load(stack.url, creators=1, pause=0.05, job_ms=(0, 20)).start()
    try:
        time.sleep(0.3)  # deliberate: some small tasks before the cut
        fault(target)
        try:
            if during is not None:
                during(result, load)
            remaining = cut_s - 0.0
            time.sleep(max(0.0, remaining))  # deliberate: the partition itself
        finally:
            net.heal()
        healed = time.monotonic()
        result.healed_at = time.time()
        time.sleep(0.3)  # deliberate: some small tasks after the heal
    finally:
        load.stop()
    for task_id in asking:
        support.wait_until(partial(_answer, client, task_id), 60, 0.2, what=f"an answer for {task_id[:8]}")
    received = dict(load.received) | dict.fromkeys(beating + asking, "alice")
    rows = wait_all_terminal(stack, 120)
    result.recovery_s = time.monotonic() - healed
    result.tasks = len(received)
    for task_id in received:
        row = rows.get(task_id)
        if row is None:  # a commit the client was answered for is gone (a failover lost it)
            result.lost.append(f"{task_id[:8]} has no row")
            continue
        if row["status"] != "completed" or (row["result"] or {}).get("isError"):
            result.lost.append(
                f"{task_id[:8]} {row['tool_name']} {row['status']} {row['result'] or row['error']}"
            )
        if ends(stack.run_dir, task_id) > 1:
            marks = sorted(path.name for path in (stack.run_dir / task_id).iterdir())
            said = f"{task_id[:8]} {row['tool_name']} attempts={row['attempts']} {marks}"
            rerun = cuts_off_past_the_lease and rerun_after_a_cut(
                stack.run_dir, task_id, row["result"], result.healed_at
            )
            (result.reruns if rerun else result.doubles).append(said)
        if task_id in beating + asking:
            last = overlapped(stack, task_id, task_id in beating)
            if last is not None:
                result.overlaps.append(
                    f"{task_id[:8]} {row['tool_name']} {beat_spans(stack.run_dir, task_id)}"
                )
                result.ran_on_after_heal_s = max(result.ran_on_after_heal_s, last - result.healed_at)
        result.attempts_burned += max(0, row["attempts"] - 1)
    TABLE.append(result.row())
    print(f"\n{HEADER}\n{result.row()}")
    return result
