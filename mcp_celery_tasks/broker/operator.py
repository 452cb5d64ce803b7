"""The broker's part of an operator's cancel (``mcp-celery-tasks tasks cancel``, the Django admin).

The cancel itself is one store statement (``WorkerStore.admin_cancel``); this only tells the
job, as ``tasks/cancel`` does: wake it when it waits for input, revoke it when it is still queued.
"""

from __future__ import annotations

import threading

from mcp_celery_tasks.broker.celery_app import load_app
from mcp_celery_tasks.broker.channel import send_wake
from mcp_celery_tasks.settings import Settings

__all__ = ["notify_cancelled"]

NOTIFY_TIMEOUT_S = 10.0


def notify_cancelled(settings: Settings, job_id: str, inbox: str | None) -> str | None:
    """Wake a job waiting for input (``inbox``: ``CancelOutcome.wake_inbox``) and revoke a queued
    one; the error, in one line, if the broker is down.

    The cancel is already in Postgres: a job that is not woken sees it at its next checkpoint,
    so a broker outage only delays the stop. Bounded (``NOTIFY_TIMEOUT_S``), never a hang."""
    failure: list[str] = []

    def notify() -> None:
        try:
            app = load_app(settings)
            if inbox:
                send_wake(app, inbox, job_id)  # wake-ups name the job, never the task
            with app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=3)
                app.control.revoke(job_id, connection=conn)
        except Exception as exc:  # the broker's many error types; the reason is shown, not raised
            failure.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    thread = threading.Thread(target=notify, daemon=True)
    thread.start()
    thread.join(NOTIFY_TIMEOUT_S)
    if thread.is_alive():
        return f"no answer within {NOTIFY_TIMEOUT_S:g} s"
    return failure[0] if failure else None
