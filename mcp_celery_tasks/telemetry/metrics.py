"""Prometheus metrics (the home of ``prometheus_client``).

The API exposes its registry at ``/metrics``. Workers are prefork: their children write to
``PROMETHEUS_MULTIPROC_DIR`` and the worker's main process serves the merged view on
``MCP_TASKS_WORKER_METRICS_PORT``. Labels are tool names, queues, methods and outcomes:
never task ids or principals (task ids are bearer-like handles, and both are unbounded).
"""

from __future__ import annotations

import logging
import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client import multiprocess as _multiprocess

__all__ = [
    "CONTENT_TYPE_LATEST",
    "render",
    "serve_worker_metrics",
]

logger = logging.getLogger("mcp_celery_tasks.metrics")

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_DURATION = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)

rpc_requests = Counter(
    "mcp_rpc_requests", "JSON-RPC requests by method and result code (0 = success)", ["method", "code"]
)
rpc_seconds = Histogram("mcp_rpc_seconds", "JSON-RPC request latency", ["method"], buckets=_LATENCY)
operation_seconds = Histogram(
    "mcp_server_operation_duration_seconds",
    "MCP request duration as the server saw it (OpenTelemetry MCP convention: mcp.server.operation.duration)",
    ["mcp_method_name", "gen_ai_tool_name", "error_type"],
    buckets=_LATENCY,
)
tasks_created = Counter("mcp_tasks_created", "Tasks created by tool and how they run", ["tool", "mode"])
tasks_replayed = Counter(
    "mcp_tasks_replayed", "Calls answered with the task an idempotency key already named", ["tool", "mode"]
)
cancels_requested = Counter(
    "mcp_cancels_requested", "tasks/cancel calls that cancelled an active task", ["tool"]
)
hub_subscribers = Gauge("mcp_hub_subscribers", "Open subscriptions/listen streams")
breaker_open = Gauge("mcp_publisher_breaker_open", "1 while the publisher's circuit breaker is open")

tasks_finished = Counter("mcp_tasks_finished", "Jobs that ended, by tool and outcome", ["tool", "outcome"])
cancels_effective = Counter(
    "mcp_cancels_effective", "Jobs that stopped because their task was cancelled", ["tool"]
)
task_run_seconds = Histogram("mcp_task_run_seconds", "Tool run time", ["tool", "queue"], buckets=_DURATION)
task_pickup_seconds = Histogram(
    "mcp_task_pickup_seconds", "Time from creation to the first claim", ["tool", "queue"], buckets=_DURATION
)
inputs_waiting = Gauge(
    "mcp_inputs_waiting", "Jobs blocked waiting for input", ["tool"], multiprocess_mode="livesum"
)
input_wait_seconds = Histogram(
    "mcp_input_wait_seconds", "Time a job waited for input", ["tool"], buckets=_DURATION
)
jobs_suspended = Counter(
    "mcp_jobs_suspended", "Jobs that gave their worker slot back while waiting for input", ["tool"]
)
jobs_retried = Counter(
    "mcp_jobs_retried",
    "Attempts that ended in a scheduled retry (kind: retryable_error, retry_later)",
    ["tool", "kind"],
)
tasks_resumed = Counter(
    "mcp_tasks_resumed", "Suspended tasks whose answers put them back in the backlog", ["tool"]
)
resume_seconds = Histogram(
    "mcp_resume_seconds",
    "From the answer that resumed a suspended task to its tool running past the question",
    ["tool"],
    buckets=_LATENCY,
)
work_redone_seconds = Histogram(
    "mcp_work_redone_seconds",
    "Seconds a re-run (a resume or a redelivery) spent before reaching new work",
    ["tool"],
    buckets=_DURATION,
)
gc_deleted = Counter("mcp_gc_deleted", "Expired tasks deleted by the collector")
gc_last_run = Gauge(
    "mcp_gc_last_run_timestamp_seconds", "When the collector last ran", multiprocess_mode="max"
)
sweeper_republished = Counter("mcp_sweeper_republished", "Jobs the sweeper published again")
forced_stops = Counter(
    "mcp_forced_stops",
    "Jobs whose process was killed (cancel grace, time or memory limit)",
    ["tool", "reason"],
)

gpu_jobs = Counter(
    "mcp_gpu_jobs",
    "Jobs claimed by a pool child pinned to a GPU (worker --gpus), by device",
    ["tool", "device"],
)

steps_run = Counter("mcp_steps_run", "Durable steps (ctx.step) that ran and were recorded", ["tool"])
steps_replayed = Counter(
    "mcp_steps_replayed", "Durable steps a re-run took from the record instead of running", ["tool"]
)
checkpoint_bytes_saved = Counter(
    "mcp_checkpoint_bytes_saved", "Bytes of checkpoints saved (ctx.checkpoint.save)", ["tool"]
)


# ---- elastic pools: demand per queue (each API process, one query per interval) ---------------

queue_demand_slots = Gauge(
    "mcp_queue_demand_slots",
    "Work that wants a worker slot now: backlog + published + running + resident input waits "
    "(suspended tasks do not count); the number an autoscaler scales on",
    ["queue"],
)
queue_backlog = Gauge("mcp_queue_backlog", "Active tasks in the fair backlog, not yet published", ["queue"])
queue_published = Gauge("mcp_queue_published", "Jobs published to the broker, not yet started", ["queue"])
queue_running = Gauge("mcp_queue_running", "Jobs running (claimed, not waiting for input)", ["queue"])
queue_waiting_input = Gauge(
    "mcp_queue_waiting_input",
    "Tasks waiting for input: resident (holding a slot) or suspended (none)",
    ["queue", "where"],
)
queue_oldest_queued_seconds = Gauge(
    "mcp_queue_oldest_queued_seconds", "Age of the oldest task waiting for a slot", ["queue"]
)
queue_worker_slots = Gauge(
    "mcp_queue_worker_slots", "Slots of the live workers consuming the queue", ["queue"]
)
queue_slots_available = Gauge(
    "mcp_queue_slots_available", "Worker slots neither running a job nor holding an input wait", ["queue"]
)
queue_workers = Gauge("mcp_queue_workers", "Live workers consuming the queue", ["queue"])
queue_unrouted_workers = Gauge(
    "mcp_queue_unrouted_workers",
    "Live workers consuming a queue no tool of this API routes to (a typo in -Q?)",
    ["queue"],
)
demand_sample_failures = Counter(
    "mcp_demand_sample_failures", "Demand samples that could not read the database"
)

# ---- elastic pools: the worker registry (worker main processes, the maintenance worker) ---------

worker_registered = Gauge(
    "mcp_worker_registered",
    "1 while this worker's heartbeat reaches the registry",
    multiprocess_mode="livemax",
)
worker_heartbeat_failures = Counter(
    "mcp_worker_heartbeat_failures", "Heartbeats that could not reach the worker registry"
)
worker_node_conflicts = Counter(
    "mcp_worker_node_conflicts",
    "Heartbeats refused because another live worker holds the same node name (-n)",
)
beats_running = Gauge(
    "mcp_beats_running",
    "Beat processes seen sending jobs at the same time (more than 1: run exactly one)",
    multiprocess_mode="livemax",
)


def render() -> bytes:
    """The API process's metrics in the Prometheus text format."""
    return generate_latest(REGISTRY)


def serve_worker_metrics(port: int) -> None:
    """Serve the merged metrics of a prefork worker's children (multiprocess mode)."""
    registry = CollectorRegistry()
    _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    addr = "0.0.0.0" if os.environ.get("MCP_TASKS_METRICS_PUBLIC") else "127.0.0.1"
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError:
        logger.warning("cannot serve worker metrics on port %d (in use?)", port, exc_info=True)
