"""``mcp-celery-tasks dev``: a whole deployment as child processes of one command.

The same processes production runs (API, tool worker, maintenance worker, beat) on the same
code paths; only Postgres and Redis may come from wheels (``embedded``). Ctrl-C stops the
children first, then the services, so nothing is left running.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from mcp_celery_tasks import migrate
from mcp_celery_tasks.embedded import embedded_services
from mcp_celery_tasks.sealing import generate_key
from mcp_celery_tasks.settings import Settings

__all__ = ["run_dev"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux: a child gets SIGTERM if `dev` itself is killed, so no orphans are left behind.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    stop_signal: int


def _spawn(name: str, args: list[str], env: dict[str, str], log_dir: Path, stop_signal: int) -> _Child:
    log = (log_dir / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcp_celery_tasks.cli", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    return _Child(name, proc, stop_signal)


def _stop(children: list[_Child], grace: float = 30.0) -> None:
    for child in children:
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, child.stop_signal)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait(5)


@contextlib.contextmanager
def _services(data_dir: Path) -> Iterator[tuple[str, str]]:
    database_url = os.environ.get("MCP_TASKS_DATABASE_URL")
    broker_url = os.environ.get("MCP_TASKS_BROKER_URL")
    if database_url and broker_url:
        yield database_url, broker_url
        return
    with embedded_services(data_dir) as services:
        yield database_url or services.database_url, broker_url or services.broker_url


def run_dev(data_dir: Path, *, port: int | None = None, tools: str | None = None) -> int:
    data_dir = data_dir.resolve()
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    with _services(data_dir) as (database_url, broker_url):
        env = dict(os.environ)
        env["MCP_TASKS_DATABASE_URL"] = database_url
        env["MCP_TASKS_BROKER_URL"] = broker_url
        if tools:
            env["MCP_TASKS_TOOL_MODULES"] = str([t.strip() for t in tools.split(",") if t.strip()]).replace(
                "'", '"'
            )
        if "MCP_TASKS_SECRET_KEYS" not in env:
            env["MCP_TASKS_SECRET_KEYS"] = json.dumps([_dev_secret_key(data_dir)])
        settings = Settings(database_url=database_url, broker_url=broker_url)
        migrate.upgrade(settings)
        api_port = port or settings.port
        host = "127.0.0.1"
        # One worker takes the default queue and the example tools' ``gpu`` queue.
        tool_worker = ["worker", "-Q", f"{settings.default_queue},gpu", "-c", "2", "-n", "dev-worker@%h"]
        maintenance = ["worker", "-Q", settings.maintenance_queue, "-c", "1", "-n", "dev-maint@%h"]
        beat = ["beat", "--schedule-file", str(data_dir / "celerybeat-schedule")]
        api = ["serve", "--host", host, "--port", str(api_port)]
        children = [
            # Workers stop cold (SIGQUIT): a job blocked on input would hold a warm shutdown forever.
            _spawn("worker", tool_worker, env, log_dir, signal.SIGQUIT),
            _spawn("maintenance", maintenance, env, log_dir, signal.SIGQUIT),
            _spawn("beat", beat, env, log_dir, signal.SIGTERM),
            _spawn("api", api, env, log_dir, signal.SIGTERM),
        ]
        try:
            url = f"http://{host}:{api_port}"
            if not _wait_ready(url, children, lambda: stop_requested):
                return 1
            print(_banner(url, data_dir, database_url, broker_url), flush=True)
            while not stop_requested:
                for child in children:
                    if child.proc.poll() is not None:
                        print(
                            f"{child.name} exited ({child.proc.returncode}); see {log_dir / child.name}.log"
                        )
                        return 1
                time.sleep(0.2)
            print("stopping…", flush=True)
            return 0
        finally:
            _stop(children)


def _dev_secret_key(data_dir: Path) -> str:
    """A key for sealing MRTR request states, kept in the data folder across runs."""
    path = data_dir / "secret-key"
    if not path.exists():
        path.write_text(generate_key())
        path.chmod(0o600)
    return path.read_text().strip()


def _wait_ready(url: str, children: list[_Child], stopping: object) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if callable(stopping) and stopping():
            return False
        for child in children:
            if child.proc.poll() is not None:
                print(f"{child.name} exited during start-up ({child.proc.returncode})", file=sys.stderr)
                return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return True
        time.sleep(0.2)
    print("the API did not come up within 60 s", file=sys.stderr)
    return False


def _banner(url: str, data_dir: Path, database_url: str, broker_url: str) -> str:
    meta = (
        '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",\n'
        '    "io.modelcontextprotocol/clientCapabilities":'
        '{"extensions":{"io.modelcontextprotocol/tasks":{}}}}'
    )
    call = (
        f"curl -s {url}/mcp -H 'Content-Type: application/json' -H 'Accept: application/json' \\\n"
        "  -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' \\\n"
        '  -H \'Mcp-Name: slow_compute\' -d \'{"jsonrpc":"2.0","id":1,"method":"tools/call",\n'
        f'  "params":{{"name":"slow_compute","arguments":{{"seconds":5}},\n    {meta}}}}}\''
    )
    return (
        f"\nmcp-celery-tasks is running\n"
        f"  MCP endpoint  {url}/mcp\n"
        f"  Postgres      {database_url}\n"
        f"  broker        {broker_url}\n"
        f"  logs          {data_dir / 'logs'}\n\n"
        f"Call a tool as a task (then poll tasks/get with the taskId it answers):\n{call}\n\n"
        "Ctrl-C stops everything.\n"
    )
