"""``dev`` stops a child through its own process; the child's subprocesses hear from it, not dev."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from mcp_celery_tasks.cli.dev.procs import Child, stop_all
from tests.support import wait_until

# A stand-in for a prefork worker: on its stop signal (SIGQUIT) it stops its "pool child" with
# SIGTERM, as Celery's cold shutdown does, and waits for it. The pool child writes down every
# signal it gets; a SIGQUIT would mean dev had signalled the whole group.
LEADER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    pool = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    def stop(signum, frame):
        pool.send_signal(signal.SIGTERM)
        pool.wait()
        sys.exit(0)
    signal.signal(signal.SIGQUIT, stop)
    while True:
        time.sleep(0.05)
    """
)
POOL_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    # os.write, not a buffered file: a signal that lands inside a buffered write makes the
    # handler's own write a "reentrant call" (RuntimeError), and the SIGTERM goes unnoted.
    heard = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    def note(signum, frame):
        os.write(heard, (signal.Signals(signum).name + "\\n").encode())
        if signum == signal.SIGTERM:
            sys.exit(0)
    signal.signal(signal.SIGQUIT, note)
    signal.signal(signal.SIGTERM, note)
    os.write(heard, b"ready\\n")
    while True:
        time.sleep(0.05)
    """
)


def test_stop_reaches_the_leader_only_and_waits_for_its_group(tmp_path: Path) -> None:
    heard = tmp_path / "heard"
    proc = subprocess.Popen([sys.executable, "-c", LEADER, POOL_CHILD, str(heard)], start_new_session=True)
    child = Child("worker", proc, signal.SIGQUIT)
    try:
        wait_until(lambda: heard.exists() and "ready" in heard.read_text(), 30, 0.05, what="the pool child")
        said: list[str] = []
        stop_all([child], 10.0, said.append)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert heard.read_text().split() == ["ready", "SIGTERM"]
    assert not child.group_alive() and not any("killing" in line for line in said), said
