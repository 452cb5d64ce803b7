"""A whole deployment whose processes the fault tests kill and restart, clients that never raise,
and the checks every scenario ends with.

The stack is the production layout: the API, a prefork tool worker (2 children), a maintenance
worker and beat, each its own process group (``tests.support.spawn``), with short leases and a
fast sweeper so recovery happens within seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from kombu import Connection
from mcp_types import jsonrpc as codes
from psycopg.rows import dict_row

from tests import support
from tests.faults import RUN_DIR_ENV

TOKENS = {"alice": "faults-alice-token", "bob": "faults-bob-token"}
PRINCIPALS = tuple(TOKENS)
# The fault tools block a worker for as long as they are told to: only the fault stacks load them
# (a fuzzer calling them with a huge duration would starve every other stack's workers).
TOOL_MODULES = support.TEST_TOOL_MODULES[:-1] + ', "tests.faults.tools", "tests.fixtures.faults"]'
FAST_RECOVERY = {
    "MCP_TASKS_LEASE_SECONDS": "3",
    "MCP_TASKS_SWEEP_INTERVAL_SECONDS": "1",
    "MCP_TASKS_UNDISPATCHED_AFTER_SECONDS": "2",
    "MCP_TASKS_LEASE_GRACE_SECONDS": "1",
    "MCP_TASKS_GC_INTERVAL_SECONDS": "2",
}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (``q`` in 0..100) of ``values``."""
    assert values, "no samples"
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# ---- a client that records instead of raising -----------------------------------------------


@dataclass
class Call:
    """One request as the client saw it."""

    kind: str
    who: str
    started: float
    seconds: float
    status: int | None = None
    body: dict[str, Any] | None = None
    raw: str = ""
    failure: str | None = None  # no HTTP answer (connection refused, reset, timeout)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.body is not None and "result" in self.body

    @property
    def result(self) -> dict[str, Any]:
        """The JSON-RPC result of an ``ok`` call."""
        assert self.body is not None and "result" in self.body, self.describe()
        result: dict[str, Any] = self.body["result"]
        return result

    @property
    def task_id(self) -> str | None:
        if self.ok and self.body is not None:
            found = self.body["result"].get("taskId")
            return str(found) if found else None
        return None

    @property
    def error_code(self) -> int | None:
        error = (self.body or {}).get("error")
        return error.get("code") if isinstance(error, dict) else None

    def describe(self) -> str:
        what = self.failure or f"HTTP {self.status} {self.raw[:200]!r}"
        return f"{self.kind} by {self.who} at +{self.started:.2f}s took {self.seconds:.2f}s: {what}"


class FaultClient:
    """Plain-HTTP 2026-07-28 requests as one principal; every outcome becomes a ``Call``."""

    def __init__(self, url: str, who: str, *, timeout: float = 30.0, epoch: float | None = None) -> None:
        self.url = url
        self.who = who
        self.epoch = time.monotonic() if epoch is None else epoch
        self._timeout = timeout
        self._http = httpx.Client(timeout=timeout)
        self._next_id = 0

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        kind: str,
        method: str,
        params: dict[str, Any],
        name: str | None = None,
        *,
        extension: bool = True,
        timeout: float | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> Call:
        self._next_id += 1
        params = {**params, "_meta": support.meta(extension, **(capabilities or {}))}
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": support.VERSION,
            "Mcp-Method": method,
            "Authorization": f"Bearer {TOKENS[self.who]}",
        }
        if name is not None:
            headers["Mcp-Name"] = name
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        started = time.monotonic()
        call = Call(kind, self.who, started - self.epoch, 0.0)
        try:
            response = self._http.post(self.url, json=body, headers=headers, timeout=timeout or self._timeout)
        except httpx.HTTPError as exc:
            call.failure = f"{type(exc).__name__}: {exc}"
        else:
            call.status = response.status_code
            call.headers = dict(response.headers)
            call.raw = response.text
            try:
                call.body = support.parse_body(response)
            except ValueError:
                call.body = None  # not JSON: an HTML error page, say
        call.seconds = time.monotonic() - started
        return call

    def create(self, ms: int = 0) -> Call:
        params = {"name": "f_count", "arguments": {"ms": ms}}
        return self.request("create", "tools/call", params, name="f_count")

    def get(self, task_id: str) -> Call:
        return self.request("get", "tasks/get", {"taskId": task_id}, name=task_id)

    def sync_greet(self) -> Call:
        """A synchronous call (no tasks extension): it returns only once a worker ran the job."""
        params = {"name": "greet", "arguments": {"name": "ready"}}
        return self.request("greet", "tools/call", params, name="greet", extension=False, timeout=5)


# ---- load ----------------------------------------------------------------------------------------


@dataclass
class Load:
    """Client threads that create ``f_count`` tasks (and poll the ones they got) until stopped.

    ``received`` maps every taskId a client was handed to the principal that created it.
    """

    url: str
    creators: int = 2
    pollers: int = 0
    job_ms: tuple[int, ...] = (0, 20, 50)
    pause: float = 0.0
    calls: list[Call] = field(default_factory=list)
    received: dict[str, str] = field(default_factory=dict)
    epoch: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for n in range(self.creators):
            self._spawn(f"creator-{n}", self._create_loop, PRINCIPALS[n % len(PRINCIPALS)])
        for n in range(self.pollers):
            self._spawn(f"poller-{n}", self._poll_loop, PRINCIPALS[n % len(PRINCIPALS)])
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
            assert not thread.is_alive(), f"{thread.name} still waits on a request"

    def now(self) -> float:
        return time.monotonic() - self.epoch

    def _spawn(self, name: str, loop: Callable[[FaultClient], None], who: str) -> None:
        def run() -> None:
            client = FaultClient(self.url, who, epoch=self.epoch)
            try:
                loop(client)
            finally:
                client.close()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
            if call.kind == "create" and call.task_id is not None:
                self.received[call.task_id] = call.who

    def _create_loop(self, client: FaultClient) -> None:
        rng = random.Random(client.who)
        while not self._stop.is_set():
            call = client.create(rng.choice(self.job_ms))
            self._record(call)
            self._breathe(call)

    def _poll_loop(self, client: FaultClient) -> None:
        rng = random.Random()
        while not self._stop.is_set():
            with self._lock:
                mine = [t for t, who in self.received.items() if who == client.who]
            if not mine:
                self._stop.wait(0.01)
                continue
            call = client.get(rng.choice(mine))
            self._record(call)
            self._breathe(call)

    def _breathe(self, call: Call) -> None:
        # After a refused connection (the API is down) do not spin; otherwise keep the pressure.
        self._stop.wait(0.05 if call.failure else self.pause)

    def between(self, start: float, end: float, kind: str | None = None) -> list[Call]:
        """Calls that were in flight at some point of [start, end] (seconds since ``epoch``)."""
        with self._lock:
            return [
                c
                for c in self.calls
                if c.started <= end and c.started + c.seconds >= start and kind in (None, c.kind)
            ]


# ---- the stack -----------------------------------------------------------------------------------


class FaultStack:
    """API, tool worker, maintenance worker and beat as separate process groups."""

    def __init__(self, name: str, database_url: str, broker_url: str, run_dir: Path, **extra: str) -> None:
        self.name = name
        self.database_url = database_url
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        suffix = f"f{os.getpid()}{name}"
        self.env = support.stack_env(
            database_url,
            broker_url,
            suffix,
            MCP_TASKS_TOOL_MODULES=TOOL_MODULES,
            MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS),
            **{RUN_DIR_ENV: str(run_dir)},
            **FAST_RECOVERY,
        )
        self.env.update(extra)
        self.queues = (self.env["MCP_TASKS_DEFAULT_QUEUE"], self.env["MCP_TASKS_MAINTENANCE_QUEUE"])
        self.port = support.free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.procs: dict[str, support.Proc] = {}
        self._clients: list[FaultClient] = []

    def closing(self, *clients: FaultClient) -> None:
        """Close these clients with the stack."""
        self._clients.extend(clients)

    # -- processes --

    def _spawn(self, label: str, args: list[str]) -> support.Proc:
        old = self.procs.get(label)
        assert old is None or old.popen.poll() is not None, f"{label} is already running"
        env = dict(self.env, MCP_TASKS_WORKER_METRICS_PORT=str(support.free_port()))  # one per worker
        proc = support.spawn(f"faults-{self.name}-{label}", args, env)
        self.procs[label] = proc
        return proc

    def start_api(self) -> None:
        """Serve on the stack's port (the same one after a restart, so clients just retry)."""
        proc = self._spawn("api", ["serve", "--port", str(self.port), "--log-level", "warning"])

        def healthy() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"the API exited: {self.log_tail('api')}")
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        support.wait_until(healthy, 30, 0.1, what="the API to answer /healthz")

    def start_worker(self, label: str = "worker", concurrency: int = 2) -> None:
        self._spawn(label, self._worker_args(label, self.queues[0], concurrency))

    def start_maintenance(self) -> None:
        self._spawn("maintenance", self._worker_args("maintenance", self.queues[1], 1))

    def start_beat(self) -> None:
        self._spawn("beat", ["beat", "--schedule-file", str(self.run_dir / "beat-schedule")])

    def _worker_args(self, label: str, queue: str, concurrency: int) -> list[str]:
        hostname = f"faults-{self.name}-{label}-{os.getpid()}@localhost"
        return ["worker", "-P", "prefork", "-c", str(concurrency), "-Q", queue, "-n", hostname]

    def start_workers(self) -> None:
        """Tool worker, maintenance worker and beat (not waiting for them)."""
        self.start_worker()
        self.start_maintenance()
        self.start_beat()

    def start_all(self) -> None:
        """API, tool worker, maintenance worker and beat; returns once each has done its job."""
        self.start_workers()
        self.start_api()
        self.wait_worker_ready()
        self.wait_sweeps(after=self.db_now())

    def kill(self, label: str) -> None:
        """SIGKILL the whole process group (a prefork worker's children included)."""
        proc = self.procs[label]
        proc.kill()
        assert_group_gone(proc)

    def close(self) -> None:
        for client in self._clients:
            client.close()
        stops = {"api": signal.SIGTERM, "beat": signal.SIGTERM}
        for label, proc in self.procs.items():
            proc.stop(stops.get(label, signal.SIGQUIT), timeout=20)

    def log_tail(self, label: str, chars: int = 3000) -> str:
        proc = self.procs.get(label)
        return proc.log.read_text(errors="replace")[-chars:] if proc else ""

    def pids_on(self, label: str) -> set[int]:
        """The pids of a worker's process group (its main process and pool children)."""
        group = self.procs[label].popen.pid
        found = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == group:
                    found.add(int(stat.parent.name))
        return found

    # -- readiness --

    def wait_worker_ready(self, timeout: float = 60) -> None:
        client = FaultClient(self.url, "alice")
        try:
            support.wait_until(
                lambda: client.sync_greet().ok, timeout, 0.2, what="a worker to run a synchronous call"
            )
        finally:
            client.close()

    def wait_sweeps(self, after: Any, timeout: float = 60) -> None:
        """Wait for beat and the maintenance worker: a sweep that ran after ``after`` (DB time)."""

        def swept() -> bool:
            row = self.query_one("SELECT last_run_at FROM mcp_maintenance WHERE job = 'sweep'")
            return row is not None and row["last_run_at"] > after

        support.wait_until(swept, timeout, 0.1, what="a sweep by beat and the maintenance worker")

    # -- the database --

    def db(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row, connect_timeout=5)

    def query(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        with self.db() as conn:
            return conn.execute(sql, args or None).fetchall()

    def query_one(self, sql: str, *args: Any) -> dict[str, Any] | None:
        rows = self.query(sql, *args)
        return rows[0] if rows else None

    def db_now(self) -> Any:
        row = self.query_one("SELECT now() AS now")
        assert row is not None
        return row["now"]

    def rows(self, task_ids: list[str] | None = None) -> dict[str, dict[str, Any]]:
        if task_ids is None:
            found = self.query("SELECT * FROM mcp_tasks")
        else:
            found = self.query("SELECT * FROM mcp_tasks WHERE task_id = ANY(%s)", task_ids)
        return {row["task_id"]: row for row in found}

    # -- marks left by f_count --

    def marks(self, task_id: str) -> Counter[str]:
        """``start`` and ``end`` counts of a task's runs, plus ``end:<run>`` per finished run."""
        folder = self.run_dir / task_id
        seen: Counter[str] = Counter()
        for path in folder.iterdir() if folder.exists() else ():
            event, attempt, run = path.name.split(".")
            seen[event] += 1
            seen[f"{event}@{attempt}"] += 1
            if event == "end":
                seen[f"end:{run}"] += 1
        return seen


def assert_group_gone(proc: support.Proc) -> None:
    """No process of the group survived (a prefork child must not keep running the job)."""

    def gone() -> bool:
        try:
            os.killpg(proc.popen.pid, 0)
        except ProcessLookupError:
            return True
        return False

    support.wait_until(gone, 10, 0.05, what=f"every process of {proc.name} to die")


@contextlib.contextmanager
def running(stack: FaultStack) -> Iterator[FaultStack]:
    """Stop every process of ``stack`` afterwards, whatever happened."""
    try:
        yield stack
    finally:
        stack.close()


# ---- the checks every scenario ends with -----------------------------------------------------


def wait_all_terminal(stack: FaultStack, timeout: float) -> dict[str, dict[str, Any]]:
    """Every row of the database (handed out or not) ends terminal: nothing stays working."""

    def settled() -> dict[str, dict[str, Any]] | None:
        rows = stack.rows()
        return rows if all(r["status"] in support.TERMINAL for r in rows.values()) else None

    try:
        return support.wait_until(settled, timeout, 0.2, what="every task to end")
    except AssertionError:
        stuck = {t: (r["status"], r["attempts"], r["dispatched_at"], r["lease_until"])
                 for t, r in stack.rows().items() if r["status"] not in support.TERMINAL}  # fmt: skip
        complaints = [
            line[:300]
            for label in ("worker", "maintenance")
            for line in stack.log_tail(label, 200_000).splitlines()
            if any(f'"level": "{level}"' in line for level in ("warning", "error", "critical"))
        ]
        exits = {label: proc.popen.poll() for label, proc in stack.procs.items()}  # None: running
        raise AssertionError(
            f"{len(stuck)} tasks never ended: {list(stuck.items())[:10]}; exit codes: {exits}; "
            f"what the workers complained of last: {complaints[-10:]}"
        ) from None


def assert_each_completed_once(
    stack: FaultStack,
    received: dict[str, str],
    rows: dict[str, dict[str, Any]],
    *,
    unrecorded_reruns: bool = False,
) -> Counter[str]:
    """Every taskId a client received completed once: one recorded result, from a run that
    really finished, for the principal that created it, and tasks/get (as that principal) shows
    that same result.

    Exactly one run finishes, unless ``unrecorded_reruns``: then a run that finished but could not
    record its outcome (the database was down) may be followed by another attempt. Returns
    ``attempts=N`` and ``rerun`` counts."""
    assert received, "the clients received no taskId"
    missing = set(received) - set(rows)
    assert not missing, f"{len(missing)} received taskIds have no row: {sorted(missing)[:5]}"
    summary: Counter[str] = Counter()
    problems: list[str] = []
    for task_id, who in received.items():
        row = rows[task_id]
        marks = stack.marks(task_id)
        summary[f"attempts={row['attempts']}"] += 1
        summary["rerun"] += marks["end"] > 1
        if row["owner"] != f"token:{who}":
            problems.append(f"{task_id}: owner {row['owner']} but created by {who}")
        if row["status"] != "completed" or row["result"].get("isError"):
            problems.append(f"{task_id}: {row['status']} {row['result'] or row['error']}")
            continue
        run = row["result"]["structuredContent"]["run"]
        finished_once = marks["end"] == 1 or (unrecorded_reruns and marks["end"] <= row["attempts"])
        if not finished_once or marks[f"end:{run}"] != 1:
            problems.append(f"{task_id}: finished runs {dict(marks)}, recorded run {run}")
        # A suspend's re-run (its question answered) is neither an attempt nor a blip.
        if marks["start"] != row["attempts"] + row.get("suspensions", 0):
            problems.append(f"{task_id}: {marks['start']} runs started but attempts = {row['attempts']}")
    assert not problems, f"{len(problems)} tasks broke the rules:\n" + "\n".join(problems[:20])
    clients = {who: FaultClient(stack.url, who) for who in PRINCIPALS}
    try:
        for task_id, who in received.items():
            seen = clients[who].get(task_id)
            assert seen.ok, seen.describe()
            task = seen.result
            assert task["status"] == "completed", task
            assert (
                task["result"]["structuredContent"]["run"]
                == rows[task_id]["result"]["structuredContent"]["run"]
            )
    finally:
        for client in clients.values():
            client.close()
    return summary


def assert_principals_isolated(stack: FaultStack, received: dict[str, str], sample: int = 20) -> None:
    """Nobody reads another principal's task: -32602, as for an unknown id."""
    clients = {who: FaultClient(stack.url, who) for who in PRINCIPALS}
    try:
        for task_id, who in list(received.items())[:sample]:
            stranger = next(p for p in PRINCIPALS if p != who)
            seen = clients[stranger].get(task_id)
            assert seen.error_code == codes.INVALID_PARAMS, seen.describe()
            assert seen.body is not None and "result" not in seen.body
    finally:
        for client in clients.values():
            client.close()


def delete_amqp_queues(url: str, names: tuple[str, ...]) -> None:
    """Remove a RabbitMQ stack's own queues and their exchanges (never anything shared)."""
    with Connection(url, connect_timeout=5) as conn:
        for name in names:
            for drop in ("queue_delete", "exchange_delete"):
                channel = conn.channel()
                try:
                    getattr(channel, drop)(name)
                except Exception:  # already gone: RabbitMQ closes the channel
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()  # type: ignore[attr-defined]
