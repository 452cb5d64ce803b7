"""A pool child's own signals, delivered for real to this process: the watchdog's soft-limit
signal reaches the running tool's runtime, and nowhere else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mcp_celery_tasks.errors import SoftTimeLimitExceeded
from mcp_celery_tasks.testing import MemoryInbox, MemoryStore
from mcp_celery_tasks.worker.child import SOFT_LIMIT_SIGNAL, after_fork, running_tool, signal_soft_limit
from mcp_celery_tasks.worker.runtime import Runtime


@pytest.fixture
def soft_limit_handler() -> Iterator[None]:
    previous = signal.getsignal(SOFT_LIMIT_SIGNAL)
    after_fork()
    try:
        yield
    finally:
        signal.signal(SOFT_LIMIT_SIGNAL, previous)


def runtime() -> Runtime:
    store = MemoryStore()
    row = store.add("some_tool")
    store.claim(row.job_id, "host:1:me", 30.0)
    box = MemoryInbox()
    return Runtime(
        store,
        task_id=row.task_id,
        job_id=row.job_id,
        tool_name="some_tool",
        worker="host:1:me",
        inbox=lambda: box,
    )


def test_the_soft_limit_signal_raises_in_the_running_tool(soft_limit_handler: None) -> None:
    with pytest.raises(SoftTimeLimitExceeded), running_tool(runtime()):
        signal_soft_limit(os.getpid())
        time.sleep(5)  # interrupted by the handler; never slept out


def test_the_soft_limit_signal_without_a_running_tool_is_ignored(soft_limit_handler: None) -> None:
    signal_soft_limit(os.getpid())  # no tool: nothing to raise in, and the process lives on


def test_signalling_a_child_that_is_gone_is_not_an_error() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    signal_soft_limit(gone.pid)
