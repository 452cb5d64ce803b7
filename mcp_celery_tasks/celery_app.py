"""The Celery app factory: configuration and the beat schedule, shared by API, workers and beat.

The API uses the app only to publish; workers add the task bodies with ``worker.install``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.schedules import schedule

from mcp_celery_tasks.channel import RUN_TOOL
from mcp_celery_tasks.settings import Settings

__all__ = ["COLLECT_GARBAGE", "RUN_TOOL", "SWEEP", "create_app"]

COLLECT_GARBAGE = "mcp_celery_tasks.collect_garbage"
SWEEP = "mcp_celery_tasks.sweep"


def create_app(settings: Settings) -> Celery:
    """A configured Celery app with no task bodies (publishing, beat, inspection)."""
    app = Celery("mcp_celery_tasks", broker=settings.broker_url, set_as_current=False)
    transport_options: dict[str, Any] = {}
    if settings.broker_url.startswith(("redis", "rediss")):
        # Above the longest job including input waits: the lease sweeper, not the visibility
        # timeout, is the fast recovery path after a crash.
        transport_options["visibility_timeout"] = settings.redis_visibility_timeout_seconds
    if settings.broker_url.startswith("amqp"):
        transport_options["confirm_publish"] = True
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        result_backend=None,
        worker_soft_shutdown_timeout=settings.worker_soft_shutdown_seconds,
        task_default_queue=settings.default_queue,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=4.0,
        broker_transport_options=transport_options,
        worker_hijack_root_logger=False,
        worker_send_task_events=settings.worker_task_events,
        beat_schedule={
            "mcp-collect-garbage": {
                "task": COLLECT_GARBAGE,
                "schedule": schedule(settings.gc_interval_seconds),
                "options": {
                    "queue": settings.maintenance_queue,
                    "expires": settings.gc_interval_seconds * 0.9,
                },
            },
            "mcp-sweep": {
                "task": SWEEP,
                "schedule": schedule(settings.sweep_interval_seconds),
                "options": {
                    "queue": settings.maintenance_queue,
                    "expires": settings.sweep_interval_seconds * 0.9,
                },
            },
        },
    )
    return app
