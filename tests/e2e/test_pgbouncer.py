"""A whole stack through a real PgBouncer in transaction mode (docs/SCALING.md).

The API's pool and the worker's connections go through PgBouncer (``pool_mode=transaction``,
two server connections for many clients, so consecutive statements of one client land on
different server connections); the API's LISTEN connection and migrations go straight to
Postgres (``MCP_TASKS_DIRECT_DATABASE_URL``). Prepared statements or startup ``options``
through the pooler would fail here; a LISTEN through it would lose the notifications the
synchronous call waits for (the hub's re-read is set to 30 s, so only NOTIFY is fast enough).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests import support
from tests.conftest import IN_CI, SUFFIX

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
)


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[int]:
    """A PgBouncer of our own on a free port in front of the test Postgres; yields the port."""
    if PGBOUNCER is None:
        if IN_CI:
            pytest.fail("CI needs pgbouncer (scripts/test installs it)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    target = conninfo_to_dict(support.ADMIN_DSN)
    port = support.free_port()
    workdir = Path(tempfile.mkdtemp(prefix="mcpt-pgbouncer-"))
    workdir.chmod(0o755)  # PgBouncer drops root privileges (-u) and must still read its files
    users = workdir / "users.txt"
    users.write_text(f'"{target.get("user") or "postgres"}" ""\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={target.get('host') or '127.0.0.1'} port={target.get('port') or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {users}\n"
        "pool_mode = transaction\ndefault_pool_size = 2\nmin_pool_size = 0\nreserve_pool_size = 0\n"
        "max_client_conn = 200\nmax_db_connections = 4\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"admin_users = {target.get('user') or 'postgres'}\nlogfile =\npidfile =\n"
    )
    for path in (users, ini):
        path.chmod(0o644)
    argv = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", "nobody"]  # PgBouncer refuses to run as root
    log = support.LOG_DIR / f"pgbouncer-{SUFFIX}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    try:
        support.wait_until(listening, 15, 0.1, what="pgbouncer to listen")
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def pooled_stack(pgbouncer: int, template_db: str) -> Iterator[tuple[support.Stack, int]]:
    name = f"mcpt_{SUFFIX}_pgbouncer"
    direct = support.create_database(name, template=template_db)
    pooled = make_conninfo(direct, host="127.0.0.1", port=str(pgbouncer))
    try:
        with support.running_stack(
            "pgbouncer",
            pooled,
            support.REDIS_URL,
            f"{SUFFIX}b",
            MCP_TASKS_DB_TRANSACTION_POOLER="true",
            MCP_TASKS_DIRECT_DATABASE_URL=direct,
            MCP_TASKS_PUSH_RECHECK_SECONDS="30",
            MCP_TASKS_DB_POOL_MIN="4",
            MCP_TASKS_DB_POOL_MAX="8",
        ) as stack:
            yield stack, pgbouncer
    finally:
        support.drop_database(name)


def _transactions_through(port: int, database: str) -> int:
    """Transactions PgBouncer has passed to ``database`` so far (its admin console)."""
    admin = make_conninfo(support.ADMIN_DSN, host="127.0.0.1", port=str(port), dbname="pgbouncer")
    with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
        conn.cursor().execute("SHOW STATS")  # warm the console (first use may lag)
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        rows = cursor.execute("SHOW STATS").fetchall()
    return sum(int(row["total_xact_count"]) for row in rows if row["database"] == database)


def test_tasks_run_and_poll_through_a_transaction_pooler(pooled_stack: tuple[support.Stack, int]) -> None:
    stack, port = pooled_stack
    database = str(conninfo_to_dict(stack.database_url)["dbname"])
    before = _transactions_through(port, database)
    errors: list[Any] = []

    def client_run() -> None:
        client = stack.client()
        try:
            for _ in range(8):
                task_id = client.start("noop")
                for _ in range(6):  # past psycopg's prepare threshold (5), were it on
                    reply = client.get(task_id)
                    if reply.status != 200 or "error" in reply.body:
                        errors.append(reply.body)
                task = client.wait_status(task_id, timeout=60)
                if task["status"] != "completed" or task["result"]["isError"]:
                    errors.append(task)
        except Exception as exc:  # collected, then asserted in the test's thread
            errors.append(repr(exc))
        finally:
            client.close()

    threads = [threading.Thread(target=client_run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert errors == []
    # 32 creates, 192 polls, 32 claims and outcomes: all of it went through PgBouncer.
    assert _transactions_through(port, database) - before >= 32 * 6 + 32 * 2


def test_notifications_arrive_on_the_direct_listen_connection(
    pooled_stack: tuple[support.Stack, int],
) -> None:
    stack, _ = pooled_stack
    client = stack.client()
    try:
        for _ in range(3):
            started = time.monotonic()
            reply = client.call_tool("greet", {"name": "pooled"}, extension=False)
            elapsed = time.monotonic() - started
            assert reply.status == 200 and "error" not in reply.body, reply.body
            assert reply.result["isError"] is False
            # The hub re-reads only every 30 s: an answer well before that came by NOTIFY.
            assert elapsed < 10, f"the synchronous call took {elapsed:.1f} s: LISTEN lost the notification"
    finally:
        client.close()


def test_an_input_round_trip_through_a_transaction_pooler(pooled_stack: tuple[support.Stack, int]) -> None:
    stack, _ = pooled_stack
    client = stack.client()
    try:
        params = {"name": "ask", "arguments": {}, "_meta": support.meta(True, elicitation={})}
        task_id = str(client.request("tools/call", params).result["taskId"])
        task = client.wait_status(task_id, ("input_required",), timeout=60)
        key = next(iter(task["inputRequests"]))
        reply = client.update(task_id, {key: {"action": "accept", "content": {"answer": "pooled"}}})
        assert reply.status == 200 and "error" not in reply.body, reply.body
        done = client.wait_status(task_id, timeout=60)
        assert done["status"] == "completed"
        assert done["result"]["content"][0]["text"] == "answer: pooled"
    finally:
        client.close()
