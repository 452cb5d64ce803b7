"""The Celery app: ours (``create_app``) or a team's own (``MCP_TASKS_CELERY_APP``), shared by
the API, workers and beat.

The API uses the app only to publish; workers add the task bodies with ``worker.install``, which
also works on a team's existing app (their broker, serializer, routes and signals stay theirs).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TypedDict

from celery import Celery
from celery.schedules import schedule
from celery.utils.imports import symbol_by_name

from mcp_celery_tasks.broker.channel import RUN_TOOL
from mcp_celery_tasks.broker.profiles import profile_for
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tools.registry import load_tool_modules

__all__ = [
    "COLLECT_GARBAGE",
    "OUR_APP",
    "RUN_TOOL",
    "SWEEP",
    "beat_schedule",
    "create_app",
    "default_queue",
    "load_app",
    "load_installed_tools",
]

COLLECT_GARBAGE = "mcp_celery_tasks.collect_garbage"
OUR_APP = "mcp_celery_tasks"
"""The ``main`` name of the app ``create_app`` builds (a team's own app has its own)."""
SWEEP = "mcp_celery_tasks.sweep"


def create_app(settings: Settings) -> Celery:
    """A configured Celery app with no task bodies (publishing, beat, inspection)."""
    app = Celery(OUR_APP, broker=settings.broker_url, set_as_current=False)
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
        broker_transport_options=profile_for(settings.broker_url).transport_options(settings),
        worker_hijack_root_logger=False,
        worker_send_task_events=settings.worker_task_events,
        worker_max_tasks_per_child=settings.worker_max_tasks_per_child,
        worker_max_memory_per_child=(
            settings.worker_max_memory_per_child_mb * 1024
            if settings.worker_max_memory_per_child_mb
            else None
        ),
        beat_schedule=beat_schedule(settings),
    )
    return app


class BeatOptions(TypedDict):
    queue: str
    expires: float


class BeatEntry(TypedDict):
    """One ``beat_schedule`` entry: the task's name, how often, and its apply options."""

    task: str
    schedule: schedule
    options: BeatOptions


def beat_schedule(settings: Settings) -> dict[str, BeatEntry]:
    """The beat entries MCP needs (GC and the sweeper), on the maintenance queue."""
    return {
        "mcp-collect-garbage": {
            "task": COLLECT_GARBAGE,
            "schedule": schedule(settings.gc_interval_seconds),
            "options": {"queue": settings.maintenance_queue, "expires": settings.gc_interval_seconds * 0.9},
        },
        "mcp-sweep": {
            "task": SWEEP,
            "schedule": schedule(settings.sweep_interval_seconds),
            "options": {
                "queue": settings.maintenance_queue,
                "expires": settings.sweep_interval_seconds * 0.9,
            },
        },
    }


def load_app(settings: Settings) -> Celery:
    """The app MCP jobs travel through: the team's own (``MCP_TASKS_CELERY_APP``, e.g.
    ``proj.celery:app``, imported from the current directory as ``celery -A`` does; its module
    calls ``worker.install``), or one built from ``MCP_TASKS_*``."""
    if not settings.celery_app:
        return create_app(settings)
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        app = symbol_by_name(settings.celery_app)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot load MCP_TASKS_CELERY_APP={settings.celery_app!r}: {exc}") from exc
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)
    if not isinstance(app, Celery):
        raise ValueError(f"MCP_TASKS_CELERY_APP={settings.celery_app!r} is not a Celery app")
    load_installed_tools(app)
    return app


def load_installed_tools(app: Celery) -> None:
    """Import the tool modules ``worker.install`` recorded on ``app`` (none if not installed)."""
    load_tool_modules(getattr(app, "_mcp_tool_modules", ()))


def default_queue(app: Celery, settings: Settings) -> str:
    """Where jobs of tools that name no queue go: the app's own route for ``run_tool`` when it has
    one (``task_routes``), else ``MCP_TASKS_DEFAULT_QUEUE``."""
    route = app.amqp.router.route({}, RUN_TOOL, (), {})
    queue = route.get("queue")
    name = getattr(queue, "name", queue)
    if isinstance(name, str) and name and name != app.conf.task_default_queue:
        return name
    return settings.default_queue
