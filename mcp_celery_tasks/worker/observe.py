"""How a job's run is seen from outside: metrics, the ``task.finished`` log line, trace spans.

The runner and the runtime call a ``JobObserver`` at their step boundaries and never touch
``metrics``, ``tracing`` or the job log themselves. ``JobObserver`` observes nothing (the unit
tests subclass it to record the calls); ``Telemetry`` is what workers use.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from mcp_celery_tasks.lifecycle import CANCELLED
from mcp_celery_tasks.store.records import ClaimedTask
from mcp_celery_tasks.telemetry import metrics, tracing
from mcp_celery_tasks.worker.devices import current_device

__all__ = ["SILENT", "JobObserver", "Telemetry"]

# Job events keep the logger they were always logged under, so log filters keep working.
job_log = logging.getLogger("mcp_celery_tasks.worker")

Attributes = Mapping[str, str | int | float | bool]


class JobObserver:
    """The hooks of one job's run, in the order they come; each one does nothing here."""

    def job(self, job_id: str, headers: Mapping[str, Any] | None) -> AbstractContextManager[object]:
        """Around one delivery of the job, from the claim to the recorded outcome."""
        return contextlib.nullcontext()

    def step(self, name: str, attributes: Attributes | None = None) -> AbstractContextManager[object]:
        """Around a step worth timing on its own: ``claim``, ``record outcome``."""
        return contextlib.nullcontext()

    def on_claimed(self, job: ClaimedTask) -> None:
        span = tracing.trace.get_current_span()  # the job's own: the claim's step has ended
        span.update_name(f"execute_tool {job.tool_name}")
        span.set_attribute("gen_ai.tool.name", job.tool_name)
        """The claim succeeded: this worker holds the job's lease."""

    def waiting_for_input(self, tool: str, count: int) -> AbstractContextManager[None]:
        """Around a job blocked on ``count`` input requests."""
        return contextlib.nullcontext()

    def on_replayed(self, tool: str, *, redone_s: float, resumed_s: float) -> None:
        """A re-run reached new work: ``redone_s`` after it started (the work redone), and
        ``resumed_s`` after the answer that resumed it (for a redelivery: since its claim)."""

    def on_suspended(self, job: ClaimedTask, elapsed: float) -> None:
        """The job gave its slot back waiting for input after running ``elapsed`` seconds."""

    def on_retry_scheduled(self, job: ClaimedTask, kind: str, delay_s: float) -> None:
        """The attempt ended in a retry (``kind``: ``retryable_error``, ``retry_later``) that
        waits ``delay_s`` seconds in the backlog."""

    def on_ran(self, job: ClaimedTask, elapsed: float) -> None:
        """The tool returned or raised after ``elapsed`` seconds (an outage under it excluded)."""

    def on_finished(self, job: ClaimedTask, worker: str, outcome: str, elapsed: float) -> None:
        """The outcome is on the row: ``completed``, ``tool_error``, ``failed``, ``cancelled``, or
        ``superseded`` (the row moved on under the job, its result dropped)."""


SILENT = JobObserver()
"""An observer that observes nothing."""


class Telemetry(JobObserver):
    """Prometheus metrics, the ``task.finished`` log event and OpenTelemetry spans.

    Metric labels are tool names, queues and outcomes, never task ids (bearer-like handles).
    """

    # The tracer's own context managers, returned as they are: a wrapper per span would cost a
    # generator frame each, several per job.

    def job(self, job_id: str, headers: Mapping[str, Any] | None) -> AbstractContextManager[object]:
        # Continues the tools/call trace carried in the Celery message headers.
        # Named ``execute_tool <tool>`` once the claim says which tool (the GenAI conventions'
        # tool execution span; ``on_claimed``).
        return tracing.tracer.start_as_current_span(
            "execute_tool",
            context=tracing.extract(headers),
            attributes={"mcp.job_id": job_id, "gen_ai.operation.name": "execute_tool"},
        )

    def step(self, name: str, attributes: Attributes | None = None) -> AbstractContextManager[object]:
        return tracing.tracer.start_as_current_span(name, attributes=attributes)

    def on_claimed(self, job: ClaimedTask) -> None:
        span = tracing.trace.get_current_span()  # the job's own: the claim's step has ended
        span.update_name(f"execute_tool {job.tool_name}")
        span.set_attribute("gen_ai.tool.name", job.tool_name)
        device = current_device()
        if device is not None:
            metrics.gpu_jobs.labels(job.tool_name, device).inc()
            job_log.info(
                "job %s runs on GPU %s", job.job_id, device,
                extra={"event": "task.device", "job_id": job.job_id, "tool": job.tool_name, "device": device},
            )  # fmt: skip
        if job.attempts == 1:  # a redelivery's wait is not pickup latency
            metrics.task_pickup_seconds.labels(job.tool_name, job.queue).observe(job.age_s)

    @contextlib.contextmanager
    def waiting_for_input(self, tool: str, count: int) -> Iterator[None]:
        since = time.monotonic()
        metrics.inputs_waiting.labels(tool).inc()
        try:
            with tracing.tracer.start_as_current_span("input wait", attributes={"mcp.inputs": count}):
                yield
        finally:
            metrics.inputs_waiting.labels(tool).dec()
            metrics.input_wait_seconds.labels(tool).observe(time.monotonic() - since)

    def on_replayed(self, tool: str, *, redone_s: float, resumed_s: float) -> None:
        metrics.work_redone_seconds.labels(tool).observe(redone_s)
        metrics.resume_seconds.labels(tool).observe(resumed_s)

    def on_suspended(self, job: ClaimedTask, elapsed: float) -> None:
        metrics.jobs_suspended.labels(job.tool_name).inc()
        job_log.info(
            "job %s suspended waiting for input after %.3fs",
            job.job_id,
            elapsed,
            extra={
                "event": "task.suspended",
                "job_id": job.job_id,
                "tool": job.tool_name,
                "queue": job.queue,
            },
        )

    def on_retry_scheduled(self, job: ClaimedTask, kind: str, delay_s: float) -> None:
        metrics.jobs_retried.labels(job.tool_name, kind).inc()
        job_log.info(
            "job %s will retry in %.3fs (attempt %d of %d used)",
            job.job_id,
            delay_s,
            job.attempts,
            job.max_attempts,
            extra={"event": "task.retry_scheduled", "job_id": job.job_id, "tool": job.tool_name,
                   "queue": job.queue, "kind": kind, "delay_s": delay_s},
        )  # fmt: skip

    def on_ran(self, job: ClaimedTask, elapsed: float) -> None:
        metrics.task_run_seconds.labels(job.tool_name, job.queue).observe(elapsed)

    def on_finished(self, job: ClaimedTask, worker: str, outcome: str, elapsed: float) -> None:
        if outcome in (CANCELLED, "superseded"):
            # Either way the job stopped because the task was no longer its to finish.
            metrics.cancels_effective.labels(job.tool_name).inc()
            metrics.tasks_finished.labels(job.tool_name, CANCELLED).inc()
            if outcome == CANCELLED:
                job_log.info("job %s stopped after cancel (%.3fs)", job.job_id, elapsed)
            return
        metrics.tasks_finished.labels(job.tool_name, outcome).inc()
        job_log.info(
            "job %s %s in %.3fs",
            job.job_id,
            outcome,
            elapsed,
            extra={
                "event": "task.finished",
                "job_id": job.job_id,
                "tool": job.tool_name,
                "queue": job.queue,
                "attempt": job.attempts,
                "worker": worker,
                "outcome": outcome,
                "duration_s": round(elapsed, 4),
            },
        )
