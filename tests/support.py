"""Test support: database cloning, the API + worker stack as subprocesses, an HTTP MCP client."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / ".cache" / "test-logs"
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""``gw0``, ``gw1``, … in a pytest-xdist worker, empty otherwise. Whatever a test process creates
that others could see carries a per-process name (databases and queues: ``SUFFIX`` in
tests/conftest.py; Celery node names: the pid; log files: this id)."""

ADMIN_DSN = os.environ.get("MCP_TASKS_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("MCP_TASKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
AMQP_URL = os.environ.get("MCP_TASKS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")

TASKS_EXT = "io.modelcontextprotocol/tasks"
TEST_TOOL_MODULES = (
    '["tests.fixtures.bench", "tests.fixtures.conformance", "workers", "tests.fixtures.testing",'
    ' "tests.fixtures.everything", "tests.fixtures.conformance_resources"]'
)
"""The examples plus every test fixture module: what the test stacks serve. ``noop`` comes first:
the conformance suite's header checks call the first listed tool with no arguments. The last
module registers no tool, only the conformance suite's fixed resources."""
TEST_SECRET_KEY = base64.urlsafe_b64encode(b"k" * 32).decode().rstrip("=")
VERSION = "2026-07-28"
TERMINAL = ("completed", "failed", "cancelled")


def dsn_for(database: str) -> str:
    """``ADMIN_DSN`` with another database name (keeps a ``?host=/socket/dir`` query)."""
    parts = urlsplit(ADMIN_DSN)
    return urlunsplit(parts._replace(path=f"/{database}"))


def reachable(check: Callable[[], object]) -> bool:
    try:
        check()
    except Exception:
        return False
    return True


def postgres_reachable() -> bool:
    return reachable(lambda: psycopg.connect(ADMIN_DSN, connect_timeout=2).close())


def rabbitmq_reachable() -> bool:
    def probe() -> None:
        with socket.create_connection(("127.0.0.1", 5672), timeout=2):
            pass

    return urlsplit(AMQP_URL).hostname in ("127.0.0.1", "localhost") and reachable(probe)


def admin_execute(sql: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def create_database(name: str, template: str | None = None) -> str:
    admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin_execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return dsn_for(name)


def drop_database(name: str) -> None:
    with contextlib.suppress(psycopg.Error):
        admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | Literal[False] | None], timeout: float, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy (that value), under a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


# ---- the MCP client --------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: httpx.Headers

    @property
    def result(self) -> dict[str, Any]:
        assert "result" in self.body, f"expected a result, got {self.body} (HTTP {self.status})"
        result: dict[str, Any] = self.body["result"]
        return result

    @property
    def error(self) -> dict[str, Any]:
        assert "error" in self.body, f"expected an error, got {self.body} (HTTP {self.status})"
        error: dict[str, Any] = self.body["error"]
        return error


def parse_body(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                event: dict[str, Any] = httpx.Response(200, content=line[5:].strip()).json()
                return event
        return {}
    if not response.content:
        return {}
    body: dict[str, Any] = response.json()
    return body


def meta(extension: bool = True, **capabilities: Any) -> dict[str, Any]:
    caps: dict[str, Any] = dict(capabilities)
    if extension:
        caps.setdefault("extensions", {})[TASKS_EXT] = {}
    return {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"},
    }


@dataclass
class Client:
    """A plain-HTTP 2026-07-28 client: every request is one POST with the per-request envelope."""

    url: str
    token: str | None = None
    accept: str = "application/json, text/event-stream"
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))
    _next_id: int = 0

    def close(self) -> None:
        self.http.close()

    def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        extension: bool = True,
        headers: dict[str, str] | None = None,
        with_meta: bool = True,
        name: str | None = None,
        timeout: float = 60,
    ) -> Reply:
        self._next_id += 1
        params = dict(params or {})
        if with_meta:
            params.setdefault("_meta", meta(extension))
        sent = {
            "Content-Type": "application/json",
            "Accept": self.accept,
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
        }
        if name is None:
            name = params.get("name") if method == "tools/call" else params.get("taskId")
        if name is not None:
            sent["Mcp-Name"] = (
                name if name.isascii() else "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
            )
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        sent.update(headers or {})
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        response = self.http.post(self.url, json=body, headers=sent, timeout=timeout)
        return Reply(response.status_code, parse_body(response), response.headers)

    def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *, extension: bool = True
    ) -> Reply:
        return self.request("tools/call", {"name": name, "arguments": arguments or {}}, extension=extension)

    def start(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        result = self.call_tool(name, arguments).result
        assert result["resultType"] == "task", result
        return str(result["taskId"])

    def get(self, task_id: str) -> Reply:
        return self.request("tasks/get", {"taskId": task_id})

    def cancel(self, task_id: str) -> Reply:
        return self.request("tasks/cancel", {"taskId": task_id})

    def update(self, task_id: str, responses: dict[str, Any]) -> Reply:
        return self.request("tasks/update", {"taskId": task_id, "inputResponses": responses})

    def wait_status(
        self, task_id: str, statuses: tuple[str, ...] = TERMINAL, timeout: float = 30
    ) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            task = self.get(task_id).result
            return task if task["status"] in statuses else None

        return wait_until(seen, timeout, interval=0.05, what=f"task status in {statuses}")


# ---- the stack: API + worker subprocesses ------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def kill(self) -> None:
        self.stop(signal.SIGKILL, timeout=10)


def _die_with_parent() -> None:
    # Linux: if pytest itself is killed, its API and worker processes go too (no orphans).
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def log_path(name: str) -> Path:
    """``.cache/test-logs/<name>.log``, or ``<name>.gw1.log`` in an xdist worker: two workers
    start stacks of the same name, and neither may truncate the other's log."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return LOG_DIR / (f"{name}.{XDIST_WORKER}.log" if XDIST_WORKER else f"{name}.log")


def spawn(name: str, args: list[str], env: dict[str, str]) -> Proc:
    log = log_path(name)
    handle = log.open("wb")
    popen = subprocess.Popen(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    return Proc(name, popen, log)


def examples_dirs(suffix: str) -> tuple[Path, Path]:
    """Where a stack's example tools may read and write: ``(files root, models dir)``, under
    ``.cache/`` and unique per stack suffix (parallel runs never share them)."""
    base = LOG_DIR.parent / f"examples-{suffix}"
    return base / "files", base / "models"


def stack_env(database_url: str, broker_url: str, suffix: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "MCP_EXAMPLES_"))}
    files, models = examples_dirs(suffix)
    env.update(
        {
            "MCP_TASKS_DATABASE_URL": database_url,
            "MCP_TASKS_BROKER_URL": broker_url,
            "MCP_TASKS_DEFAULT_QUEUE": f"mcpt.{suffix}.default",
            "MCP_TASKS_MAINTENANCE_QUEUE": f"mcpt.{suffix}.maintenance",
            "MCP_TASKS_TOOL_MODULES": TEST_TOOL_MODULES,
            "MCP_TASKS_SSE_KEEPALIVE_SECONDS": "0.5",
            "MCP_TASKS_LEASE_SECONDS": "6",
            "MCP_TASKS_WORKER_METRICS_PORT": str(free_port()),
            # Every API replica of a stack seals with the same key; workers drop it at start.
            "MCP_TASKS_SECRET_KEYS": f'["{TEST_SECRET_KEY}"]',
            # The suites create tasks as fast as they can from one principal; the quota tests
            # start an API with the rate limit on (tests/e2e/test_quotas.py).
            "MCP_TASKS_CREATES_PER_SECOND_PER_PRINCIPAL": "0",
            # Likewise, earlier tests leave questions unanswered on the shared stack; the fair
            # share tests start their own stack with the limit on (tests/e2e/test_fair_share.py).
            "MCP_TASKS_MAX_WAITING_INPUTS_PER_PRINCIPAL": "0",
            "MCP_EXAMPLES_FILES_ROOT": str(files),
            "MCP_EXAMPLES_MODELS_DIR": str(models),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def start_api(name: str, env: dict[str, str]) -> tuple[Proc, str]:
    port = free_port()
    proc = spawn(name, ["serve", "--port", str(port), "--log-level", "warning"], env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{name} exited: {proc.log.read_text()[-3000:]}")
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 30, 0.1, what=f"{name} to answer /healthz")
    return proc, url + "/mcp"


def start_worker(name: str, env: dict[str, str], concurrency: int = 2, pool: str = "prefork") -> Proc:
    queues = f"{env['MCP_TASKS_DEFAULT_QUEUE']},{env['MCP_TASKS_MAINTENANCE_QUEUE']}"
    return spawn(
        name,
        [
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            queues,
            "-n",
            # Unique on the machine: two workers of one name on a broker share a RabbitMQ
            # pidbox queue, and each then hears only part of the broadcasts (revoke).
            f"{name}-{os.getpid()}@localhost",
            "--log-level",
            "info",
        ],
        env,
    )


@dataclass
class Stack:
    """A live deployment: one API process and one prefork worker on a real broker and Postgres."""

    url: str
    database_url: str
    broker_url: str
    env: dict[str, str]
    api: Proc
    worker: Proc

    def client(self, **kwargs: Any) -> Client:
        return Client(self.url, **kwargs)

    def db(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database_url, autocommit=True)

    def row(self, task_id: str) -> dict[str, Any]:
        with self.db() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            found = cur.execute("SELECT * FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
        assert found is not None
        return found


@contextlib.contextmanager
def stack_of_its_own(
    label: str, template_db: str, tools: str, *, concurrency: int = 2, **extra: str
) -> Iterator[Stack]:
    """``running_stack`` on a database of its own (copied from the migrated template, dropped
    after), loading the tool modules ``tools`` (a JSON list): a module's stack that no other
    module's rows or quotas can disturb."""
    name = f"mcpt_{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = create_database(name, template=template_db)
    try:
        with running_stack(
            label, dsn, REDIS_URL, f"{label[:1]}{uuid.uuid4().hex[:6]}", concurrency=concurrency,
            MCP_TASKS_TOOL_MODULES=tools, **extra,
        ) as stack:  # fmt: skip
            yield stack
    finally:
        drop_database(name)


@contextlib.contextmanager
def running_stack(
    name: str, database_url: str, broker_url: str, suffix: str, *, concurrency: int = 2, **extra: str
) -> Iterator[Stack]:
    env = stack_env(database_url, broker_url, suffix, **extra)
    examples = examples_dirs(suffix)
    for directory in examples:
        directory.mkdir(parents=True, exist_ok=True)
    worker = start_worker(f"{name}-worker", env, concurrency=concurrency)
    api: Proc | None = None
    try:
        api, url = start_api(f"{name}-api", env)
        stack = Stack(url, database_url, broker_url, env, api, worker)
        client = stack.client()
        # The worker is ready once a synchronous call goes through it.
        wait_until(
            lambda: client.call_tool("greet", {"name": "ready"}, extension=False).status == 200,
            60,
            0.2,
            what="the worker to run a job",
        )
        client.close()
        yield stack
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        shutil.rmtree(examples[0].parent, ignore_errors=True)
