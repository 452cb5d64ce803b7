"""A retryable failure of a tool's body: the next attempt after a backoff, or the last one's end.

The runner asks here what a ``retry_on`` error or a ``ctx.retry_later`` comes to. With attempts
left it is a ``backoff`` outcome: the job goes back to the backlog with a "not before" time
(``store.retry_queries``), its slot and its message freed. On the last attempt it ends as any
failure of the body does: ``completed`` with ``isError``, naming the error. Infrastructure errors
never get here: the runner gives those jobs back uncounted (``runner``'s docstring).
"""

from __future__ import annotations

import contextlib
from typing import Final, Protocol

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.lifecycle import COMPLETED
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.records import ClaimedTask
from mcp_celery_tasks.tools.registry import ToolSpec
from mcp_celery_tasks.tools.results import error_result
from mcp_celery_tasks.tools.retries import RetryLater, reason_text
from mcp_celery_tasks.transient import OUTCOME_WRITE, ride_out
from mcp_celery_tasks.worker.outcomes import MAX_DETAIL_CHARS, Outcome

__all__ = ["BACKOFF", "RetryStore", "after_error", "after_request", "schedule"]

BACKOFF: Final = "backoff"
"""The outcome status of a run that ends in a scheduled retry."""


class RetryStore(Protocol):
    def schedule_retry(
        self, task_id: str, worker: str, delay_s: float, message: str, kind: str, detail: str
    ) -> bool: ...


class _Flushes(Protocol):
    def flush(self) -> None: ...


def after_error(spec: ToolSpec, job: ClaimedTask, exc: Exception, settings: Settings) -> Outcome:
    """A ``retry_on`` error of attempt ``job.attempts``: the backoff policy's delay."""
    assert spec.retry is not None
    said = _said(exc)
    reason = reason_text(f"{type(exc).__name__}: {said}" if said else type(exc).__name__)
    delay = spec.retry.backoff.delay(job.attempts)
    last = f"The tool {spec.name!r} failed {_times(job.max_attempts)}; the last error: {reason}"
    return _outcome(job, delay, reason, last, "retryable_error", settings)


def after_request(spec: ToolSpec, job: ClaimedTask, request: RetryLater, settings: Settings) -> Outcome:
    """``ctx.retry_later(seconds, reason)``: the tool's own delay (checked when it asked)."""
    reason = reason_text(request.reason) or "the tool asked to retry later"
    last = (
        f"The tool {spec.name!r} asked to retry later after its last attempt "
        f"({_times(job.max_attempts)}): {reason}"
    )
    return _outcome(job, request.seconds, reason, last, "retry_later", settings)


def _said(exc: Exception) -> str:
    """The exception's text; tool code is not ours, so a ``__str__`` that raises says nothing."""
    try:
        return str(exc)
    except Exception:
        return ""


def _times(attempts: int) -> str:
    return "once" if attempts == 1 else f"{attempts} times"


def _outcome(
    job: ClaimedTask, delay_s: float, reason: str, last: str, kind: str, settings: Settings
) -> Outcome:
    final = error_result(last)
    if job.attempts >= job.max_attempts:
        return Outcome(COMPLETED, result=final, kind=f"{kind}_exhausted", detail=last[:MAX_DETAIL_CHARS])
    delay = min(max(delay_s, 0.0), settings.retry_max_delay_seconds)
    # The task stays ``working`` (no SEP-2663 status means "waiting to retry"); ``statusMessage``
    # is for any status and "MAY be exposed to the end-user or model" (SPEC-CHECKLIST, Task
    # fields): hence the reason is flattened and cut (``reason_text``), never a traceback.
    message = f"retrying in {_seconds(delay)} s (attempt {job.attempts + 1}/{job.max_attempts}): {reason}"
    return Outcome(BACKOFF, result=final, message=message, kind=kind, detail=reason, retry_in_s=delay)


def _seconds(delay: float) -> str:
    return f"{delay:.0f}" if delay >= 10 else f"{delay:.2g}"


def schedule(
    store: RetryStore, settings: Settings, job: ClaimedTask, me: str, runtime: _Flushes, outcome: Outcome
) -> bool:
    """Put the job back in the backlog until its time; False if it was not ours to put back any
    more (cancelled meanwhile, or no longer working). A database out of reach past
    ``finish_retry_seconds`` raises, as recording an outcome does."""
    with contextlib.suppress(InfrastructureError):
        runtime.flush()  # the last report lands before the retry's status message

    def write() -> bool:
        return store.schedule_retry(
            job.task_id,
            me,
            outcome.retry_in_s or 0.0,
            outcome.message or "",
            outcome.kind or "",
            outcome.detail or "",
        )

    return ride_out(
        write, budget_s=settings.finish_retry_seconds, what=f"scheduling the retry of job {job.job_id}",
        backoff=OUTCOME_WRITE,
    )  # fmt: skip
