"""The body of ``run_tool(job_id)``: claim, run under a lease, record the outcome.

Celery-free on purpose (``celery_app`` wraps it in a task): the runner gets a job id, returns
what should happen to the message (done, or retry in N seconds), and touches Postgres only
through ``WorkerStore``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, signals
from mcp_types import jsonrpc as codes

from mcp_celery_tasks import channel, gc, metrics, tracing
from mcp_celery_tasks import context as ctxmod
from mcp_celery_tasks.broker import profile_for
from mcp_celery_tasks.celery_app import COLLECT_GARBAGE, RUN_TOOL, SWEEP, beat_schedule, load_installed_tools
from mcp_celery_tasks.channel import Inbox
from mcp_celery_tasks.context import TaskContext
from mcp_celery_tasks.errors import (
    TASKS_EXTENSION,
    InfrastructureError,
    McpError,
    TaskCancelled,
    ToolError,
)
from mcp_celery_tasks.leases import LeaseKeeper
from mcp_celery_tasks.registry import ToolSpec, all_tools, get_tool
from mcp_celery_tasks.results import error_result, to_call_tool_result
from mcp_celery_tasks.runtime import Runtime
from mcp_celery_tasks.settings import Settings, get_settings
from mcp_celery_tasks.store import ClaimedTask, WorkerStore

__all__ = ["JobOutcome", "JobRunner", "install", "worker_identity"]

logger = logging.getLogger(__name__)

_IDENTITY: str | None = None
_IDENTITY_PID: int | None = None


def worker_identity() -> str:
    """``host:pid:nonce`` for this process; a new nonce after a fork."""
    global _IDENTITY, _IDENTITY_PID
    if _IDENTITY is None or os.getpid() != _IDENTITY_PID:
        _IDENTITY_PID = os.getpid()
        _IDENTITY = f"{socket.gethostname()}:{_IDENTITY_PID}:{uuid.uuid4().hex[:8]}"
    return _IDENTITY


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What to do with the Celery message: ``retry_in`` seconds, or done (None)."""

    status: str
    retry_in: float | None = None


class JobRunner:
    """Runs one job to an outcome written on its row."""

    def __init__(self, store: WorkerStore, settings: Settings, inbox: Callable[[], Inbox]) -> None:
        self._store = store
        self._settings = settings
        self._inbox = inbox
        self._leases = LeaseKeeper(settings.lease_seconds)

    def run(self, job_id: str, headers: dict[str, Any] | None = None) -> JobOutcome:
        with tracing.tracer.start_as_current_span("run_tool", context=tracing.extract(headers)) as span:
            span.set_attribute("mcp.job_id", job_id)
            return self._run(job_id)

    def _run(self, job_id: str) -> JobOutcome:
        me = worker_identity()
        try:
            with tracing.tracer.start_as_current_span("claim"):
                claimed = self._store.claim(job_id, me, self._settings.lease_seconds)
        except InfrastructureError:
            logger.warning("could not claim job %s; retrying", job_id, exc_info=True)
            return JobOutcome("infrastructure", retry_in=2.0)
        if claimed is None:
            return self._not_claimed(job_id)
        spec = get_tool(claimed.tool_name)
        if spec is None:
            missing = f"Tool {claimed.tool_name!r} is not available on this worker"
            self._finish_with_retries(
                claimed, me, "failed", error={"code": codes.INTERNAL_ERROR, "message": missing}
            )
            return JobOutcome("failed")
        return self._execute(spec, claimed, me)

    def _not_claimed(self, job_id: str) -> JobOutcome:
        state = self._store.job_state(job_id)
        if state is None or state["status"] not in ("working", "input_required"):
            return JobOutcome("skipped")  # deleted, finished or cancelled: nothing to run
        if state["lease_left_s"] and state["lease_left_s"] > 0:
            # Someone alive holds it (a duplicate delivery): come back when the lease would end.
            return JobOutcome("deferred", retry_in=float(state["lease_left_s"]) + 1.0)
        if state["attempts"] >= state["max_attempts"]:
            attempts = state["attempts"]
            message = f"The job was started {attempts} times without finishing; giving up"
            self._store.fail_exhausted(job_id, {"code": codes.INTERNAL_ERROR, "message": message}, message)
            return JobOutcome("failed")
        return JobOutcome("skipped")

    def _execute(self, spec: ToolSpec, claimed: ClaimedTask, me: str) -> JobOutcome:
        runtime = Runtime(
            self._store,
            task_id=claimed.task_id,
            job_id=claimed.job_id,
            tool_name=claimed.tool_name,
            worker=me,
            inbox=self._inbox,
            report_interval_s=self._settings.report_min_interval_seconds,
            check_interval_s=self._settings.cancel_check_interval_seconds,
            max_status_chars=self._settings.max_status_message_chars,
        )
        ctx = TaskContext(
            task_id=claimed.task_id,
            job_id=claimed.job_id,
            tool_name=claimed.tool_name,
            attempt=claimed.attempts,
            preflight=claimed.preflight,
            runtime=runtime,
            client_capabilities=claimed.client_capabilities,
            strict_capabilities=self._settings.strict_input_capabilities,
            input_timeout_s=self._input_timeout(spec, claimed),
            max_outstanding_inputs=self._settings.max_outstanding_inputs,
            sleep_slice_s=self._settings.cancel_check_interval_seconds,
        )
        if claimed.attempts == 1:
            metrics.task_pickup_seconds.labels(spec.name, claimed.queue).observe(claimed.age_s)
        self._leases.watch(runtime)
        started = time.monotonic()
        status = "completed"
        result: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        message: str | None = None
        try:
            with ctxmod.bind(ctx):
                value = _call(spec, ctx, claimed.arguments)
            result = self._bounded(to_call_tool_result(value))
        except TaskCancelled:
            status = "cancelled"
        except ToolError as exc:
            result = error_result(str(exc) or type(exc).__name__)
        except McpError as exc:
            status, error, message = "failed", exc.to_error(), exc.message
        except InfrastructureError:
            logger.warning(
                "job %s hit an infrastructure error; it will be retried", claimed.job_id, exc_info=True
            )
            self._leases.release(runtime)
            with contextlib.suppress(InfrastructureError):  # else the lease runs out by itself
                self._store.release(claimed.task_id, me)
            return JobOutcome("infrastructure", retry_in=min(60.0, 2.0**claimed.attempts))
        except Exception:
            logger.exception("tool %s raised in job %s", spec.name, claimed.job_id)
            result = error_result(
                f"The tool {spec.name!r} failed with an unexpected error. "
                f"Ask the operator to look up job {claimed.job_id} in the worker log."
            )
        finally:
            self._leases.release(runtime)
        elapsed = time.monotonic() - started
        metrics.task_run_seconds.labels(spec.name, claimed.queue).observe(elapsed)
        with contextlib.suppress(InfrastructureError):
            runtime.flush()
        if status == "cancelled":
            metrics.cancels_effective.labels(spec.name).inc()
            metrics.tasks_finished.labels(spec.name, "cancelled").inc()
            self._store_call(self._store.mark_stopped, claimed.task_id, me)
            logger.info("job %s stopped after cancel (%.3fs)", claimed.job_id, elapsed)
            return JobOutcome("cancelled")
        with tracing.tracer.start_as_current_span("record outcome") as span:
            span.set_attribute("mcp.outcome", status)
            recorded = self._finish_with_retries(
                claimed, me, status, result=result, error=error, message=message
            )
        if not recorded:
            # The row moved on under us (cancelled, or our lease was lost): drop the result.
            self._store_call(self._store.mark_stopped, claimed.task_id, me)
            metrics.cancels_effective.labels(spec.name).inc()
            metrics.tasks_finished.labels(spec.name, "cancelled").inc()
            return JobOutcome("superseded")
        outcome = "tool_error" if status == "completed" and result and result.get("isError") else status
        metrics.tasks_finished.labels(spec.name, outcome).inc()
        logger.info(
            "job %s %s in %.3fs",
            claimed.job_id,
            outcome,
            elapsed,
            extra={
                "event": "task.finished",
                "job_id": claimed.job_id,
                "tool": spec.name,
                "queue": claimed.queue,
                "attempt": claimed.attempts,
                "worker": me,
                "outcome": outcome,
                "duration_s": round(elapsed, 4),
            },
        )
        return JobOutcome(status)

    def _input_timeout(self, spec: ToolSpec, claimed: ClaimedTask) -> float:
        waits = spec.input_timeout or self._settings.input_timeout_seconds
        extensions = claimed.client_capabilities.get("extensions") or {}
        if TASKS_EXTENSION not in extensions:
            # A synchronous call asks through MRTR: if the client does not retry soon, it left.
            waits = min(waits, self._settings.sync_input_timeout_seconds)
        return waits

    def _bounded(self, result: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(result, separators=(",", ":")))
        if size > self._settings.max_result_bytes:
            limit = self._settings.max_result_bytes
            return error_result(f"The tool's result is {size} bytes, more than the server's limit of {limit}")
        return result

    def _finish_with_retries(self, claimed: ClaimedTask, me: str, status: str, **fields: Any) -> bool:
        """Record the outcome, riding out a database failover: the work is done and must not be
        redone, so keep trying for ``finish_retry_seconds`` (the fence makes a late write safe)."""
        deadline = time.monotonic() + self._settings.finish_retry_seconds
        delay = 0.5
        while True:
            try:
                return self._store.finish(claimed.task_id, me, status, **fields)
            except InfrastructureError:
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("could not record the outcome of job %s; retrying", claimed.job_id)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    @staticmethod
    def _store_call(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except InfrastructureError:
            logger.warning("store call %s failed", getattr(fn, "__name__", fn), exc_info=True)


def _call(spec: ToolSpec, ctx: TaskContext, arguments: dict[str, Any]) -> Any:
    kwargs = spec.call_kwargs(arguments)
    if spec.context_param:
        kwargs[spec.context_param] = ctx
    value = spec.fn(**kwargs)
    if inspect.isawaitable(value):
        value = asyncio.run(_await(value))
    return value


async def _await(awaitable: Any) -> Any:
    return await awaitable


_stores: list[WorkerStore] = []


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # Celery resets its own pools in the child; a psycopg connection inherited from the
    # parent must be neither used nor closed by the child.
    for store in _stores:
        store.forget_after_fork()


def install(
    app: Celery,
    settings: Settings | None = None,
    *,
    tools: Sequence[str] | None = None,
    load_tools: bool = True,
) -> WorkerStore:
    """Make ``app`` run MCP jobs: add ``run_tool`` and the beat jobs, and load the tools.

    ``app`` may be a team's own Celery app: its broker, serializer, routes, queues and signals
    stay as they are, and its own ``celery -A proj worker`` then runs MCP jobs beside its other
    tasks (the API publishes through the same app with ``MCP_TASKS_CELERY_APP``). ``tools`` are
    the tool modules (default: ``MCP_TASKS_TOOL_MODULES``). Calling it twice changes nothing.
    """
    installed: WorkerStore | None = getattr(app, "_mcp_store", None)
    if installed is not None:
        return installed
    settings = settings or get_settings()
    store = WorkerStore(settings)
    app._mcp_store = store  # type: ignore[attr-defined]
    _stores.append(store)
    tracing.configure(settings, "mcp-celery-tasks-worker")
    inboxes: dict[int, Inbox] = {}

    def inbox() -> Inbox:
        # One inbox queue per worker process (created after the fork), constant arguments.
        pid = os.getpid()
        if pid not in inboxes:
            inboxes.clear()
            inboxes[pid] = Inbox(app, f"mcp.inbox.{socket.gethostname()}.{pid}")
        return inboxes[pid]

    runner = JobRunner(store, settings, inbox)

    if settings.worker_metrics_port:
        port = settings.worker_metrics_port

        @signals.worker_ready.connect(weak=False)
        def _serve_metrics(**_: Any) -> None:
            metrics.serve_worker_metrics(port)

    @app.task(
        name=RUN_TOOL,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        max_retries=None,
    )
    def run_tool(self: Any, job_id: str) -> None:
        try:
            outcome = runner.run(job_id, dict(self.request.headers or {}))
        except Exception:
            # A bug or an outage outside tool code: never a tool result. Retry later; the
            # claim's attempt cap turns a job that keeps failing into a failed task.
            logger.exception("job %s could not be run; retrying", job_id)
            raise self.retry(countdown=5.0, max_retries=None) from None
        if outcome.retry_in is not None:
            raise self.retry(countdown=outcome.retry_in, max_retries=None)

    @app.task(name=COLLECT_GARBAGE, ignore_result=True)
    def collect_garbage() -> int:
        return gc.collect_garbage(store)

    @app.task(name=SWEEP, ignore_result=True)
    def sweep() -> int:
        return gc.sweep(
            store,
            lambda job_id, queue: channel.publish_job(app, job_id, queue),
            settings,
            queue_depth=lambda queue: channel.queue_depth(app, queue),
        )

    app.conf.beat_schedule = {**(app.conf.beat_schedule or {}), **beat_schedule(settings)}
    # The tool modules load when a worker or the API starts, not now: a project's tool module
    # usually imports its tasks module, which imports this app (and its install call).
    modules = list(settings.tool_modules if tools is None else tools) if load_tools else []
    app._mcp_tool_modules = modules  # type: ignore[attr-defined]

    @signals.worker_init.connect(weak=False)
    def _before_start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            load_installed_tools(app)  # before the pool forks: children inherit them
            check_input_timeouts(app, settings)

    return store


def check_input_timeouts(app: Celery, settings: Settings) -> None:
    """Refuse to start when a tool may wait for input longer than the broker keeps a job.

    The broker is the app's own (``app.conf``: a team may bring its app); its profile knows the
    limit (RabbitMQ ``consumer_timeout``, Redis ``visibility_timeout``).
    """
    profile = profile_for(app.conf.broker_url)
    limit = profile.redelivery_limit(app.conf.broker_transport_options or {}, settings)
    if limit is None:
        return
    for spec in all_tools():
        waits = spec.input_timeout or settings.input_timeout_seconds
        if waits >= limit.seconds:
            raise SystemExit(
                f"tool {spec.name!r} may wait {waits:.0f} s for input, but the {limit.name} is "
                f"{limit.seconds:.0f} s: "
                "lower the input timeout or raise the broker's limit (and its MCP_TASKS_ setting)"
            )
