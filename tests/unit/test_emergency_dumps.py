"""kombu's "emergency dump" (issue 28): a Redis connection lost with unacknowledged messages that
cannot be put back writes no pickle file into the temporary folder; the job ids are logged (the
sweeper publishes those jobs again)."""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import pytest
from kombu.transport import virtual

from mcp_celery_tasks.broker.profiles import keep_emergency_dumps_out


class _Unrestorable:
    """A delivered, unacknowledged Celery message of job ``job-1`` (``serializable`` as kombu's)."""

    def serializable(self) -> dict[str, Any]:
        return {"body": "…", "headers": {"id": "job-1", "task": "mcp_celery_tasks.run_tool"}}


def test_a_lost_connection_dumps_no_file_and_logs_the_jobs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_files(*_: Any, **__: Any) -> Any:
        raise AssertionError("kombu wrote an emergency dump file")

    monkeypatch.setattr(tempfile, "mkstemp", no_files)
    # Put kombu's own back afterwards (this process's other tests).
    monkeypatch.setattr(virtual.base, "emergency_dump_state", vars(virtual.base)["emergency_dump_state"])
    keep_emergency_dumps_out()
    qos: Any = virtual.QoS.__new__(virtual.QoS)  # the shutdown path only: no channel behind it
    qos._delivered = type("Delivered", (dict,), {})({1: _Unrestorable()})
    qos._on_collect = type("Timer", (), {"cancel": lambda self: None})()
    qos._flush = lambda: None
    qos.channel = type("Channel", (), {"do_restore": True})()
    qos.restore_unacked = lambda: [(ConnectionError("redis is gone"), _Unrestorable())]
    with caplog.at_level(logging.WARNING, logger="mcp_celery_tasks.channel"):
        qos.restore_unacked_once()
    assert any("jobs job-1" in r.getMessage() for r in caplog.records), caplog.records
