"""Running one job: claim, lease, run, record. No Celery here.

``worker.run_tool`` hands the runner a job id; the runner answers what should happen to the
Celery message (done, or retry in N seconds). Each step is a small method and ``JobRunner.run``
is their sequence; metrics, the job log and spans belong to the observer (``observe``), called
at the step boundaries. Postgres is reached only through the ``JobStore`` methods, so the unit
tests run the runner on an in-memory store.

**What an attempt is.** ``attempts`` (capped by ``max_attempts``) counts runs that ended in the
tool's own failure or in its process dying. A run the worker *gives back* is not one: the worker
is being stopped (a deploy's cold shutdown sends the pool child SIGTERM: ``WorkerStopping``), or
the database or broker failed under the job. Giving back is one guarded write by the worker
that holds the lease (``give_back``): the claim's increment is undone, ``redeliveries`` goes up
(capped separately by ``max_redeliveries``) and the lease is freed for the next worker. A
process that dies without that write (SIGKILL, the OOM killer, a segfault) is a crash and its
attempt stays counted: only a live process can say it stopped cleanly. A retry the tool's
policy schedules (``retry_on``, ``ctx.retry_later``: ``worker.retries``) is an attempt: the job
waits in the backlog for its time, holding no slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import (
    InfrastructureError,
    JobSuspended,
    McpError,
    TaskCancelled,
    TaskError,
    ToolError,
    WorkerStopping,
)
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.lifecycle import ACTIVE, COMPLETED, FAILED
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.records import ClaimedTask
from mcp_celery_tasks.store.row_types import JobState
from mcp_celery_tasks.tools.context import TaskContext, bind
from mcp_celery_tasks.tools.registry import ToolSpec, get_tool
from mcp_celery_tasks.tools.results import error_result, to_call_tool_result
from mcp_celery_tasks.tools.retries import RetryLater
from mcp_celery_tasks.transient import OUTCOME_WRITE, REQUEUE, Backoff, OutageTooLong, ride_out
from mcp_celery_tasks.wire import declares_tasks
from mcp_celery_tasks.worker import claims, retries
from mcp_celery_tasks.worker.artifacts import ArtifactRows, JobArtifacts
from mcp_celery_tasks.worker.child import in_job, running_tool, worker_identity
from mcp_celery_tasks.worker.devices import current_device
from mcp_celery_tasks.worker.isolation import run_body
from mcp_celery_tasks.worker.leases import LeaseKeeper
from mcp_celery_tasks.worker.limits import JobLimits
from mcp_celery_tasks.worker.observe import SILENT, JobObserver
from mcp_celery_tasks.worker.outcomes import (
    CANCELLED,
    MAX_DETAIL_CHARS,
    RETRY,
    STOPPING,
    SUPERSEDED,
    SUSPENDED,
    JobOutcome,
    Outcome,
    missing_capability,
    tool_error_kind,
)
from mcp_celery_tasks.worker.runtime import InboxWaiter, Runtime, RuntimeStore
from mcp_celery_tasks.worker.spill import json_size, spill
from mcp_celery_tasks.worker.steps import JobSteps, StepStore

__all__ = ["JobOutcome", "JobRunner", "JobStore", "Outcome", "worker_identity"]

logger = logging.getLogger("mcp_celery_tasks.runner")


class JobStore(RuntimeStore, StepStore, ArtifactRows, retries.RetryStore, Protocol):
    """The store calls of a job's claim and outcome (``WorkerStore`` in production)."""

    def claim(
        self, job_id: str, worker: str, lease_s: float, device: str | None = None
    ) -> ClaimedTask | None:
        """Take the job (one guarded update), recording the GPU the claiming child is pinned to."""
        ...

    def job_state(self, job_id: str) -> JobState | None: ...

    def fail_exhausted(self, job_id: str, error: TaskError, message: str, kind: str = ...) -> bool: ...

    def give_back(self, task_id: str, worker: str) -> bool: ...

    def finish(
        self,
        task_id: str,
        worker: str,
        status: str,
        *,
        result: JSONObject | None = None,
        error: TaskError | None = None,
        message: str | None = None,
        error_kind: str | None = None,
        error_message: str | None = None,
    ) -> bool: ...

    def mark_stopped(self, task_id: str, worker: str) -> None: ...


class JobRunner:
    """Runs one job to an outcome written on its row."""

    RECORD_BACKOFF: Backoff = OUTCOME_WRITE
    """The pauses between tries of the outcome write."""
    GIVE_BACK_BUDGET_S = 3.0
    """How long a stopping process tries to give its job back (it is being killed meanwhile)."""

    def __init__(
        self,
        store: JobStore,
        settings: Settings,
        inbox: Callable[[], InboxWaiter],
        *,
        observer: JobObserver = SILENT,
        leases: LeaseKeeper | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._inbox = inbox
        self._observer = observer
        # One keeper (one thread) per process: runners made per call share one (``testing``).
        self._leases = leases or LeaseKeeper(settings.lease_seconds)

    def run(self, job_id: str, headers: Mapping[str, Any] | None = None) -> JobOutcome:
        """Claim the job, run its tool under a lease, record the outcome (the lease is kept
        until the outcome is written: a finished result is never left for another run)."""
        with in_job():
            try:
                return self._run_job(job_id, headers)
            finally:
                claims.ended(job_id)

    def _run_job(self, job_id: str, headers: Mapping[str, Any] | None) -> JobOutcome:
        with self._observer.job(job_id, headers):
            me = worker_identity()
            job = self._claim(job_id, me)
            if isinstance(job, JobOutcome):
                return job
            spec = get_tool(job.tool_name)
            if spec is None:
                return self._refuse(job, me, f"Tool {job.tool_name!r} is not available on this worker")
            limits = JobLimits.for_tool(spec, self._settings)
            runtime = self._runtime(job, me, limits)
            started = time.monotonic()
            with self._leased(runtime):
                outcome = self._run(spec, job, runtime, limits)
                elapsed = time.monotonic() - started
                if outcome.status in (RETRY.status, STOPPING.status):
                    return self._give_back(job, me, outcome)
                if outcome.status == retries.BACKOFF:
                    if retries.schedule(self._store, self._settings, job, me, runtime, outcome):
                        self._observer.on_ran(job, elapsed)
                        self._observer.on_retry_scheduled(job, outcome.kind or "", outcome.retry_in_s or 0.0)
                        return JobOutcome(retries.BACKOFF)  # the release publishes it when due
                    # Not ours to put back (cancelled meanwhile): record the end, fenced as ever.
                    outcome = Outcome(
                        COMPLETED, result=outcome.result, kind=outcome.kind, detail=outcome.detail
                    )
                if outcome is SUSPENDED:
                    # The row says so already (one guarded write released it): no outcome to
                    # record, the message is done; the answer puts the job back in the backlog.
                    self._observer.on_suspended(job, elapsed)
                    return JobOutcome(SUSPENDED.status)
                self._observer.on_ran(job, elapsed)
                recorded = self._record(job, me, runtime, outcome)
            self._observer.on_finished(job, me, recorded.label, elapsed)
            return JobOutcome(recorded.status)

    # ---- claim -----------------------------------------------------------------------------------

    def _claim(self, job_id: str, me: str) -> ClaimedTask | JobOutcome:
        """Take the job with one guarded update; a job not taken ends in what to do instead."""
        try:
            with self._observer.step("claim"):
                job = self._store.claim(job_id, me, self._settings.lease_seconds, current_device())
        except InfrastructureError:
            logger.warning("could not claim job %s; retrying", job_id, exc_info=True)
            return JobOutcome("infrastructure", retry_in=2.0)
        if job is None:
            return self._not_claimed(job_id)
        claims.claimed(job_id, me)  # the main process's watchdog knows the job is ours from now on
        self._observer.on_claimed(job)
        return job

    def _not_claimed(self, job_id: str) -> JobOutcome:
        state = self._store.job_state(job_id)
        if state is None or state["status"] not in ACTIVE:
            return JobOutcome("skipped")  # deleted, finished or cancelled: nothing to run
        if state["lease_left_s"] and state["lease_left_s"] > 0:
            # Someone alive holds it (a duplicate delivery): come back when the lease would end.
            return JobOutcome("deferred", retry_in=float(state["lease_left_s"]) + 1.0)
        if state["attempts"] >= state["max_attempts"]:
            attempts = state["attempts"]
            message = f"The job was started {attempts} times without finishing; giving up"
            self._store.fail_exhausted(job_id, {"code": codes.INTERNAL_ERROR, "message": message}, message)
            return JobOutcome(FAILED)
        if state.get("redeliveries", 0) >= self._settings.max_redeliveries:
            times = state["redeliveries"]
            message = (
                f"The job was handed back {times} times (worker restarts or infrastructure outages) "
                "without finishing; giving up"
            )
            error: TaskError = {"code": codes.INTERNAL_ERROR, "message": message}
            self._store.fail_exhausted(job_id, error, message, "redeliveries_exhausted")
            return JobOutcome(FAILED)
        return JobOutcome("skipped")

    def _refuse(self, job: ClaimedTask, me: str, message: str) -> JobOutcome:
        """Fail a claimed job this worker cannot run (its tool is not loaded here)."""
        self._finish_with_retries(
            job, me, Outcome(FAILED, error={"code": codes.INTERNAL_ERROR, "message": message})
        )
        return JobOutcome(FAILED)

    # ---- lease -----------------------------------------------------------------------------------

    def _runtime(self, job: ClaimedTask, me: str, limits: JobLimits) -> Runtime:
        return Runtime(
            self._store,
            task_id=job.task_id,
            job_id=job.job_id,
            tool_name=job.tool_name,
            worker=me,
            inbox=self._inbox,
            report_interval_s=self._settings.report_min_interval_seconds,
            check_interval_s=self._settings.cancel_check_interval_seconds,
            max_status_chars=self._settings.max_status_message_chars,
            observer=self._observer,
            limits=limits,
            outage_budget_s=self._settings.outage_budget_seconds,
            # A re-run observes the work it redoes: a resume (since its answer), a redelivery.
            rerun_since_s=job.resumed_for_s
            if job.resumed_for_s is not None
            else 0.0
            if job.attempts > 1
            else None,
        )

    @contextlib.contextmanager
    def _leased(self, runtime: Runtime) -> Iterator[None]:
        """The process's lease thread keeps the claim's lease (and flushes reports) meanwhile."""
        self._leases.watch(runtime)
        try:
            yield
        finally:
            self._leases.release(runtime)

    # ---- run -------------------------------------------------------------------------------------

    def _run(self, spec: ToolSpec, job: ClaimedTask, runtime: Runtime, limits: JobLimits) -> Outcome:
        """Call the tool and map what it returned or raised to an outcome; once the job gave its
        slot back (suspend), whatever the tool did after that (a ``finally`` that raised) is
        ``SUSPENDED``: the row is no longer this run's."""
        outcome = self._outcome(spec, job, runtime, limits)
        return SUSPENDED if runtime.suspended else outcome

    def _outcome(self, spec: ToolSpec, job: ClaimedTask, runtime: Runtime, limits: JobLimits) -> Outcome:
        """Call the tool and map what it returned or raised to an outcome.

        One of the two places allowed ``except Exception``: tool code is not ours. A cancel is
        a ``BaseException`` and is caught by name, before anything broad.
        """
        ctx = self._context(job, runtime, limits)
        try:
            try:
                with bind(ctx), running_tool(runtime):
                    value = run_body(spec, ctx, job.arguments, runtime, self._settings, inline=_call)
            finally:
                if not runtime.suspended:
                    runtime.reached_new_work()
            return Outcome(COMPLETED, result=self._bounded(to_call_tool_result(value), ctx))
        except JobSuspended:
            return SUSPENDED
        except _TooLarge as exc:
            return Outcome(COMPLETED, result=error_result(str(exc)), kind="result_too_large", detail=str(exc))
        except TaskCancelled:
            return CANCELLED
        except WorkerStopping:
            return STOPPING
        except ToolError as exc:
            said = str(exc) or type(exc).__name__
            return Outcome(
                COMPLETED,
                result=error_result(said),
                error=missing_capability(exc),
                kind=tool_error_kind(exc),
                detail=said,
            )
        except McpError as exc:
            return Outcome(
                FAILED, error=exc.to_error(), message=exc.message, kind="mcp_error", detail=exc.message
            )
        except OutageTooLong as exc:
            budget = self._settings.outage_budget_seconds
            message = f"The task's database or broker stayed unreachable past the {budget:g} s outage budget"
            logger.error("job %s: %s (%s)", job.job_id, message, exc)
            return Outcome(
                FAILED,
                error={"code": codes.INTERNAL_ERROR, "message": message},
                message=message,
                kind="infrastructure",
                detail=str(exc)[:MAX_DETAIL_CHARS],
            )
        except InfrastructureError:
            logger.warning(
                "job %s hit an infrastructure error; it will be retried", job.job_id, exc_info=True
            )
            return RETRY
        except RetryLater as exc:
            return retries.after_request(spec, job, exc, self._settings)
        except Exception as exc:
            if spec.retry is not None and spec.retry.matches(exc):
                logger.warning(
                    "tool %s raised %s in job %s; retrying", spec.name, type(exc).__name__, job.job_id
                )
                return retries.after_error(spec, job, exc, self._settings)
            logger.exception("tool %s raised in job %s", spec.name, job.job_id)
            return Outcome(
                COMPLETED,
                result=error_result(
                    f"The tool {spec.name!r} failed with an unexpected error. "
                    f"Ask the operator to look up job {job.job_id} in the worker log."
                ),
                kind="crash",
                detail=f"{type(exc).__name__}: {exc}"[:MAX_DETAIL_CHARS],
            )

    def _context(self, job: ClaimedTask, runtime: Runtime, limits: JobLimits) -> TaskContext:
        waits = limits.input_wait_s(task_augmented=declares_tasks(job.client_capabilities))
        return TaskContext(
            task_id=job.task_id,
            job_id=job.job_id,
            tool_name=job.tool_name,
            attempt=job.attempts,
            preflight=job.preflight,
            principal=job.owner,
            device=current_device(),
            runtime=runtime,
            client_capabilities=job.client_capabilities,
            strict_capabilities=self._settings.strict_input_capabilities,
            input_timeout_s=waits,
            max_outstanding_inputs=self._settings.max_outstanding_inputs,
            sleep_slice_s=self._settings.cancel_check_interval_seconds,
            log_level=job.log_level,
            is_task=not job.synchronous,
            max_retry_delay_s=self._settings.retry_max_delay_seconds,
            steps=JobSteps(self._store, self._settings, task_id=job.task_id, job_id=job.job_id,
                           tool_name=job.tool_name, worker=runtime.worker, stopping=lambda: runtime.stopping,
                           replayed=runtime.replayed, new_work=runtime.reached_new_work),
            artifacts=JobArtifacts(self._store, job.task_id, runtime.worker, self._settings),
        )  # fmt: skip

    def _bounded(self, result: JSONObject, ctx: TaskContext) -> JSONObject:
        """The result as stored: over ``inline_result_bytes``, its large blocks become artifacts
        (``spill``); still over ``max_result_bytes``, ``_TooLarge``."""
        size = json_size(result)
        inline = min(self._settings.inline_result_bytes, self._settings.max_result_bytes)
        if size > inline:
            result = spill(result, ctx.artifact, inline)
            size = json_size(result)
        if size > self._settings.max_result_bytes:
            limit = self._settings.max_result_bytes
            raise _TooLarge(f"The tool's result is {size} bytes, more than the server's limit of {limit}")
        return result

    def _give_back(self, job: ClaimedTask, me: str, outcome: Outcome) -> JobOutcome:
        """An outage under the tool, or the process being stopped, is not a result: give the job
        back (its attempt uncounted, a redelivery counted instead) for another run. Stopping,
        the process dies next and the broker redelivers the message; after an outage, retry
        with backoff."""
        budget = self.GIVE_BACK_BUDGET_S if outcome is STOPPING else self._settings.outage_budget_seconds
        try:
            given = ride_out(
                lambda: self._store.give_back(job.task_id, me), budget_s=budget, what="giving the job back"
            )
        except InfrastructureError:
            # Not written: the lease runs out by itself and the run counts as a crash.
            logger.warning("could not give job %s back", job.job_id, exc_info=True)
            given = False
        if given:
            logger.info("job %s given back (%s)", job.job_id, outcome.status)
        if outcome is STOPPING:
            return JobOutcome("stopping")
        return JobOutcome("infrastructure", retry_in=REQUEUE.pause(job.attempts + 1))

    # ---- record ----------------------------------------------------------------------------------

    def _record(self, job: ClaimedTask, me: str, runtime: Runtime, outcome: Outcome) -> Outcome:
        """Write the outcome, fenced by ``worker = me``; returns the outcome as recorded."""
        with contextlib.suppress(InfrastructureError):
            runtime.flush()  # the last status message lands before the outcome
        if outcome.status == CANCELLED.status:
            self._mark_stopped(job, me)  # the row is cancelled already; say the job stopped
            return outcome
        with self._observer.step("record outcome", {"mcp.outcome": outcome.status}):
            recorded = self._finish_with_retries(job, me, outcome)
        if not recorded:
            # The row moved on under us (cancelled, or our lease was lost): drop the result.
            self._mark_stopped(job, me)
            return SUPERSEDED
        return outcome

    def _finish_with_retries(self, job: ClaimedTask, me: str, outcome: Outcome) -> bool:
        """Record the outcome, riding out a database failover: the work is done and must not be
        redone, so keep trying for ``finish_retry_seconds`` (the fence makes a late write safe)."""

        def finish() -> bool:
            return self._store.finish(
                job.task_id,
                me,
                outcome.status,
                result=outcome.result,
                error=outcome.error,
                message=outcome.message,
                error_kind=outcome.kind,
                error_message=outcome.detail,
            )

        return ride_out(
            finish,
            budget_s=self._settings.finish_retry_seconds,
            what=f"recording the outcome of job {job.job_id}",
            backoff=self.RECORD_BACKOFF,
        )

    def _mark_stopped(self, job: ClaimedTask, me: str) -> None:
        try:
            self._store.mark_stopped(job.task_id, me)
        except InfrastructureError:
            # finished_at only tells admins the job stopped; the outcome itself is on the row.
            logger.warning("could not mark job %s stopped", job.job_id, exc_info=True)


class _TooLarge(Exception):
    """The tool's result is over ``max_result_bytes``."""


def _call(spec: ToolSpec, ctx: TaskContext, arguments: Mapping[str, object]) -> Any:
    kwargs = spec.call_kwargs(arguments)
    if spec.context_param:
        kwargs[spec.context_param] = ctx
    value = spec.fn(**kwargs)
    if inspect.isawaitable(value):
        value = asyncio.run(_await(value))
    return value


async def _await(awaitable: Any) -> Any:
    return await awaitable
