"""The composition root of an API process: settings in, the running ``Services`` out.

Everything one process shares is built here once, in order, and torn down in reverse: the
Postgres pool, the task event hub, the publisher thread with the Celery app it publishes
through (ours, or a team's own), the sealer, the task service, and the console's admin pool
when ``console_database_url`` is set. ``server`` wraps this in the
FastAPI lifespan and hands ``Services`` to requests as lifespan state. No HTTP here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from mcp_celery_tasks.api.demand import DemandGauges
from mcp_celery_tasks.backlog.publisher import FairPublisher
from mcp_celery_tasks.broker.celery_app import default_queue, load_app
from mcp_celery_tasks.broker.channel import CircuitBreaker, Publisher
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.protocol.sealing import Sealer
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import ApiStore, WorkerStore
from mcp_celery_tasks.tasks import shared_load
from mcp_celery_tasks.tasks.events import TaskEvents
from mcp_celery_tasks.tasks.service import TaskService
from mcp_celery_tasks.telemetry import tracing
from mcp_celery_tasks.tools.registry import all_tools, load_tool_modules

__all__ = ["SERVER_VERSION", "running"]

logger = logging.getLogger("mcp_celery_tasks.app")

try:
    SERVER_VERSION = version("mcp-celery-tasks")
except PackageNotFoundError:  # running from a source tree
    SERVER_VERSION = "0.0.0"


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Services]:
    """The process's services, started; stopped again on exit."""
    tracing.configure(settings, "mcp-celery-tasks-api")
    celery = load_app(settings)  # a team's own app loads its tool modules here
    load_tool_modules(settings.tool_modules)
    store = ApiStore(settings)
    await store.open()
    await _check_connection_budget(store, settings)
    events = TaskEvents(store, poll_s=settings.push_recheck_seconds)
    await events.start()
    marker = WorkerStore(settings, application_name="mcp-celery-tasks-publisher")
    publisher = Publisher(
        celery,
        on_published=marker.mark_dispatched,
        deadline_s=settings.publish_deadline_seconds,
        breaker=CircuitBreaker(settings.breaker_failures, settings.breaker_reset_seconds),
    )
    publisher.start()
    # Jobs go out through the fair publisher (the backlog waits in Postgres); wake-ups and
    # revokes through the broker thread.
    fair = FairPublisher(celery, settings, publisher)
    events.on_notify(fair.poke)
    fair.start()
    if not settings.secret_keys:
        logger.warning("MCP_TASKS_SECRET_KEYS is not set: MRTR request states only open in this process")
    queue = default_queue(celery, settings)
    tasks = TaskService(settings, store, events, fair, queue)
    demand = _start_demand_gauges(store, settings, queue)
    load = asyncio.create_task(
        shared_load.share_load(store, tasks.quotas, shared_load.replica_id()), name="mcp-load"
    )
    console_store = await _open_console_store(settings)
    try:
        yield Services(
            settings, tasks, store, events, fair, Sealer(settings.secret_keys), SERVER_VERSION,
            console_store=console_store,
        )  # fmt: skip
    finally:
        if console_store is not None:
            await console_store.close()
        if demand is not None:
            demand.cancel()
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load
        await events.stop()
        await asyncio.to_thread(fair.stop)
        await asyncio.to_thread(publisher.stop)
        await asyncio.to_thread(marker.close)
        await store.close()


CONSOLE_POOL_MAX = 2
"""Connections of the console's admin pool (opened on first use: admins' form posts)."""


async def _open_console_store(settings: Settings) -> ApiStore | None:
    """The console's own pool on ``console_database_url`` (an admin login: limits are the admin
    role's to write), or None to write through the API's pool."""
    if settings.console_database_url is None:
        return None
    admin = settings.model_copy(
        update={
            "database_url": settings.console_database_url,
            "db_pool_min": 0,
            "db_pool_max": CONSOLE_POOL_MAX,
        }
    )
    store = ApiStore(admin)
    await store.open()
    return store


def _start_demand_gauges(store: ApiStore, settings: Settings, default: str) -> asyncio.Task[None] | None:
    """The ``mcp_queue_*`` gauges, sampled by this process (off with metrics or a 0 interval)."""
    if not settings.metrics_enabled or settings.demand_interval_seconds <= 0:
        return None
    routed = {spec.queue or default for spec in all_tools()} | {settings.maintenance_queue}
    gauges = DemandGauges(store, settings.demand_interval_seconds, routed)
    return asyncio.create_task(gauges.run(), name="mcp-demand-gauges")


async def _check_connection_budget(store: ApiStore, settings: Settings) -> None:
    """Warn at start-up when this process's pool would not fit under max_connections (the
    README's budget: api * (db_pool_max + 2) + sum of worker (concurrency + 1) + 5)."""
    try:
        used, limit = await store.connection_headroom()
    except InfrastructureError:
        logger.warning("Postgres is not reachable at start-up; the API will keep trying")
        return
    needed = settings.db_pool_max + 2
    if used + needed > limit - 5:
        logger.warning(
            "connection budget: %d of max_connections=%d are in use and this API process may open %d "
            "more; raise max_connections or lower MCP_TASKS_DB_POOL_MAX",
            used,
            limit,
            needed,
        )
