"""Blips cost nothing (issue 19): broker and Postgres restarts and rolling restarts of every worker,
while tasks report, wait for a human and run longer than the lease. For each: no task failed by
the fault, no body run twice at once, attempts unchanged by infrastructure, at most one live
message per job in the broker afterwards.

The broker is the suite's own ``redis-server`` (append-only file) and Postgres its own embedded
server; the RabbitMQ case runs in a vhost of its own and closes only that vhost's connections.
The 60 s Postgres outage takes about two minutes and is left to ``FAULTS_LONG=1``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import WorkerStore
from tests import support
from tests.faults.blips import (
    BLIP_SETTINGS,
    Mix,
    answer_all,
    redis_live_messages,
    settle_live_messages,
    start_blip_stack,
    verdict,
    wait_in_flight,
)
from tests.faults.services import FaultServices
from tests.faults.stack import FaultClient, FaultStack, delete_amqp_queues, running

long_outage = pytest.mark.skipif(
    os.environ.get("FAULTS_LONG") != "1", reason="a 60 s outage: run with FAULTS_LONG=1"
)


def blip(
    services: FaultServices,
    stack: FaultStack,
    fault: Callable[[], None],
    *,
    mix: Mix | None = None,
    count_messages: Callable[[], object] | None = None,
) -> str:
    """Tasks in flight, the fault, the answers, then every check; returns the numbers."""
    mix = mix or Mix()
    with running(stack):
        start_blip_stack(stack, mix)
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        mix.start(client)
        wait_in_flight(stack, mix)
        began = time.monotonic()
        fault()
        faulted = time.monotonic() - began
        answer_all(stack, mix)
        seen = verdict(stack, mix)
        ended = time.monotonic() - began
        job_ids = [r["job_id"] for r in stack.rows(list(mix.ids)).values()]
        messages = settle_live_messages(count_messages, job_ids, 15) if count_messages else None
        assert not seen.failed, seen.failed
        assert not seen.overlapping, f"bodies run twice at once: {seen.line()}"
        assert not seen.rerun, f"bodies restarted by a blip: {seen.line()}"
        assert set(seen.attempts) == {1} and set(seen.redeliveries) == {0}, seen.line()
        assert set(seen.keys) == {1}, seen.line()  # each question asked once, kept across the fault
        assert messages is None or messages <= 1, f"{messages} live messages for one job"
        return (
            f"fault {faulted:.1f} s, all ended {ended:.1f} s after it; {seen.line()}; "
            f"most live messages per job afterwards: {messages}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["graceful", "kill-9", "kill-9-no-persistence"])
def test_a_redis_restart_fails_no_task_and_reruns_no_body(
    services: FaultServices, fault_db: str, how: str
) -> None:
    name = f"blip-redis-{how}"
    stack = FaultStack(name, fault_db, services.broker.url, services.root / "runs" / name, **BLIP_SETTINGS)

    def restart() -> None:
        services.broker.stop(signal.SIGTERM if how == "graceful" else signal.SIGKILL)
        if how == "kill-9-no-persistence":
            services.broker.wipe()  # every message and inbox gone, as a Redis without AOF
        time.sleep(1.0)  # deliberate: the outage itself
        services.broker.start()

    numbers = blip(
        services,
        stack,
        restart,
        count_messages=lambda: redis_live_messages(services.broker.socket, stack.queues[0]),
    )
    print(f"\nredis {how}: {numbers}")


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "outage_s"), [("fast", 1.0), ("immediate", 1.0), ("fast", 15.0)])
def test_a_postgres_restart_fails_no_task_and_reruns_no_body(
    services: FaultServices, fault_db: str, mode: str, outage_s: float
) -> None:
    name = f"blip-pg-{mode}-{outage_s:.0f}"
    stack = FaultStack(name, fault_db, services.broker.url, services.root / "runs" / name, **BLIP_SETTINGS)

    def restart() -> None:
        services.postgres.stop(mode)
        try:
            time.sleep(outage_s)  # deliberate: the outage itself
        finally:
            services.postgres.start()

    # The jobs outlive the outage and the (3 s) lease: they report, wait and work through it.
    mix = Mix(work_ms=int(outage_s * 1000) + 5000)
    numbers = blip(
        services,
        stack,
        restart,
        mix=mix,
        count_messages=lambda: redis_live_messages(services.broker.socket, stack.queues[0]),
    )
    print(f"\npostgres {mode} restart, {outage_s:.0f} s down: {numbers}")


@long_outage
def test_a_60_second_postgres_outage_fails_no_task(services: FaultServices, fault_db: str) -> None:
    name = "blip-pg-60"
    stack = FaultStack(name, fault_db, services.broker.url, services.root / "runs" / name, **BLIP_SETTINGS)

    def outage() -> None:
        services.postgres.stop("fast")
        try:
            time.sleep(60.0)  # deliberate: the outage itself
        finally:
            services.postgres.start()

    numbers = blip(
        services,
        stack,
        outage,
        mix=Mix(work_ms=65_000),
        count_messages=lambda: redis_live_messages(services.broker.socket, stack.queues[0]),
    )
    print(f"\npostgres 60 s down: {numbers}")


@contextlib.contextmanager
def rabbitmq_vhost(name: str) -> Iterator[str]:
    """A vhost of our own (guest may use it), deleted afterwards: nobody else's connections are
    ever touched."""
    ctl = ["rabbitmqctl", "-q"]
    subprocess.run([*ctl, "add_vhost", name], check=True, timeout=60, capture_output=True)
    try:
        subprocess.run(
            [*ctl, "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
            check=True,
            timeout=60,
            capture_output=True,
        )
        yield urlunsplit(urlsplit(support.AMQP_URL)._replace(path=f"/{name}"))
    finally:
        subprocess.run([*ctl, "delete_vhost", name], timeout=60, capture_output=True)


def rabbitmq_queue_messages(vhost: str, queue: str) -> int:
    """Ready plus unacknowledged messages in ``queue`` of ``vhost``."""
    done = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "messages"],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        name, _, count = line.partition("\t")
        if name == queue:
            return int(count)
    return 0


def jobs_of(stack: FaultStack, mix: Mix) -> list[str]:
    return [row["job_id"] for row in stack.rows(list(mix.ids)).values()]


def rabbitmqctl_usable() -> bool:
    try:
        done = subprocess.run(["rabbitmqctl", "-q", "list_vhosts"], timeout=30, capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.rabbitmq
def test_closing_every_rabbitmq_connection_fails_no_task(services: FaultServices, fault_db: str) -> None:
    if not support.rabbitmq_reachable() or not rabbitmqctl_usable():
        if os.environ.get("CI") == "true":
            raise AssertionError("RabbitMQ (and rabbitmqctl) are required in CI")
        pytest.skip("no RabbitMQ or rabbitmqctl on this machine")
    vhost = f"mcpt-blips-{os.getpid()}"
    with rabbitmq_vhost(vhost) as url:
        name = "blip-amqp-close"
        stack = FaultStack(name, fault_db, url, services.root / "runs" / name, **BLIP_SETTINGS)

        def close_connections() -> None:
            subprocess.run(
                ["rabbitmqctl", "-q", "close_all_connections", "-p", vhost, "fault test: blip"],
                check=True,
                timeout=60,
                capture_output=True,
            )
            time.sleep(1.0)

        def messages() -> Counter[str]:
            # RabbitMQ counts per queue, not per job: every message is charged to each job, so
            # "at most one per job" here means at most one left in the whole queue.
            total = rabbitmq_queue_messages(vhost, stack.queues[0])
            return Counter(dict.fromkeys(jobs_of(stack, mix), total))

        mix = Mix()
        try:
            numbers = blip(services, stack, close_connections, mix=mix, count_messages=messages)
        finally:
            delete_amqp_queues(url, stack.queues)
        print(f"\nrabbitmq connections closed: {numbers}")


def wait_ready(stack: FaultStack, label: str, timeout: float = 60) -> None:
    """The worker's log says it is ready to consume."""
    support.wait_until(
        lambda: " ready." in stack.log_tail(label, 100_000), timeout, 0.2, what=f"{label} ready"
    )


@pytest.mark.slow
def test_three_rolling_restarts_of_every_worker_keep_answers_and_attempts(
    services: FaultServices, fault_db: str
) -> None:
    name = "blip-rolling"
    stack = FaultStack(
        name,
        fault_db,
        services.broker.url,
        services.root / "runs" / name,
        REMAP_SIGTERM="SIGQUIT",
        # The waits stay resident, so each restart gives them back (a suspended wait holds no
        # process a restart could stop: tests/e2e/test_suspend.py).
        MCP_TASKS_SUSPEND_AFTER_SECONDS="",
        **BLIP_SETTINGS,
    )
    mix = Mix(asks=4, reports=0, busy=0)
    rounds = 3
    with running(stack):
        start_blip_stack(stack, mix)
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        mix.start(client)
        wait_in_flight(stack, mix)
        took: list[float] = []
        for n in range(1, rounds + 1):
            old, new = "worker" if n == 1 else f"worker{n - 1}", f"worker{n}"
            stack.start_worker(new, concurrency=mix.concurrency)
            wait_ready(stack, new)
            began = time.monotonic()
            proc = stack.procs[old]
            if n == 2:
                os.killpg(proc.popen.pid, signal.SIGQUIT)  # the whole group, as systemd stops a unit
            else:
                os.kill(proc.popen.pid, signal.SIGTERM)  # the main process only, as Kubernetes does
            proc.popen.wait(30)

            def waiting_again(n: int = n) -> bool:
                rows = stack.rows(mix.of("fb_ask"))
                return all(r["status"] == "input_required" and r["redeliveries"] == n for r in rows.values())

            support.wait_until(waiting_again, 60, 0.1, what=f"every task waiting again after restart {n}")
            took.append(time.monotonic() - began)
        answer_all(stack, mix)
        seen = verdict(stack, mix)
        job_ids = [r["job_id"] for r in stack.rows(list(mix.ids)).values()]
        messages = settle_live_messages(
            lambda: redis_live_messages(services.broker.socket, stack.queues[0]), job_ids, 15
        )
        assert not seen.failed, seen.failed
        assert not seen.overlapping, f"bodies run twice at once: {seen.line()}"
        assert set(seen.attempts) == {1} and set(seen.redeliveries) == {rounds}, seen.line()
        assert set(seen.keys) == {1}, seen.line()  # the question kept its key and was never re-asked
        assert set(seen.starts) == {rounds + 1}, seen.line()  # one run per worker generation
        assert messages <= 1, f"{messages} live messages for one job"
        print(
            f"\n{rounds} rolling restarts: waiting again {', '.join(f'{t:.1f}' for t in took)} s after each "
            f"stop; {seen.line()}; most live messages per job afterwards: {messages}"
        )


@pytest.mark.slow
def test_an_admin_cancel_of_a_task_whose_worker_died_ends_cancelled(
    services: FaultServices, fault_db: str
) -> None:
    name = "blip-dead-cancel"
    stack = FaultStack(name, fault_db, services.broker.url, services.root / "runs" / name, **BLIP_SETTINGS)
    mix = Mix(asks=1, reports=0, busy=1, work_ms=60_000)
    with running(stack):
        start_blip_stack(stack, mix)
        client = FaultClient(stack.url, "alice")
        stack.closing(client)
        mix.start(client)
        wait_in_flight(stack, mix)
        stack.kill("worker")  # every job's process dies with it; no worker takes them over
        store = WorkerStore(Settings(database_url=fault_db))
        try:
            for row in stack.rows(list(mix.ids)).values():
                assert store.admin_cancel(row["job_id"], "cancelled by an admin").found
        finally:
            store.close()
        cancelled_at = time.monotonic()

        def shown() -> dict[str, str]:
            found = stack.query(
                "SELECT task_id, status FROM mcp_tasks_overview WHERE task_id = ANY(%s)", list(mix.ids)
            )
            return {r["task_id"]: r["status"] for r in found}

        assert set(shown().values()) == {"stopping"}  # the leases have not run out yet
        support.wait_until(lambda: set(shown().values()) == {"cancelled"}, 30, 0.2, what="stopping to end")
        print(f"\nadmin cancel, worker dead: cancelled {time.monotonic() - cancelled_at:.1f} s later")
