"""What a job run comes to: the outcome recorded on the row, and what becomes of the Celery
message. Plain values; the runner decides, the store records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mcp_types import jsonrpc as codes

from mcp_celery_tasks import lifecycle
from mcp_celery_tasks.errors import (
    ArtifactRefused,
    CheckpointTooLarge,
    InputNotSupported,
    InputTimedOut,
    SoftTimeLimitExceeded,
    StepOrderError,
    StepResultError,
    TaskError,
    ToolError,
)
from mcp_celery_tasks.json_types import JSONObject

__all__ = [
    "CANCELLED",
    "MAX_DETAIL_CHARS",
    "RETRY",
    "STOPPING",
    "SUPERSEDED",
    "SUSPENDED",
    "JobOutcome",
    "Outcome",
    "tool_error_kind",
]

MAX_DETAIL_CHARS: Final = 2000


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What to do with the Celery message: ``retry_in`` seconds, or done (None)."""

    status: str
    retry_in: float | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run came to: ``completed`` (``result``), ``failed`` (``error``), ``cancelled``,
    ``retry`` (an outage under the tool, never a result), ``backoff`` (a retryable error: run again
    later, ``worker.retries``) or ``superseded`` (recorded too late)."""

    status: str
    result: JSONObject | None = None
    """The ``CallToolResult`` to store (``tools.results``)."""
    error: TaskError | None = None
    message: str | None = None
    kind: str | None = None
    """For admins: why it failed or ended in a tool error (tool_error, crash, mcp_error, …)."""
    detail: str | None = None
    """For admins: what went wrong, as the tool said it (never a stack trace)."""
    retry_in_s: float | None = None
    """``backoff``: seconds until the next attempt (``result`` is what to record instead when the
    retry cannot be scheduled)."""

    @property
    def label(self) -> str:
        """The outcome as metrics and logs name it: a tool error is not a plain completion."""
        if self.status == lifecycle.COMPLETED and self.result is not None and self.result.get("isError"):
            return "tool_error"
        return self.status


CANCELLED: Final = Outcome(lifecycle.CANCELLED)
RETRY: Final = Outcome("retry")
STOPPING: Final = Outcome("stopping")
"""The worker process is being stopped: the job is given back and the process dies."""
SUPERSEDED: Final = Outcome("superseded")
SUSPENDED: Final = Outcome("suspended")
"""The job gave its slot back waiting for input: nothing to record, the message is done."""


def tool_error_kind(exc: ToolError) -> str:
    if isinstance(getattr(exc, "outcome_kind", None), str):  # an isolated body that died: "crash"
        return str(exc.outcome_kind)  # type: ignore[attr-defined]
    if isinstance(exc, SoftTimeLimitExceeded):
        return "soft_time_limit"
    if isinstance(exc, InputTimedOut):
        return "input_timeout"
    if isinstance(exc, InputNotSupported):
        return "input_not_supported"
    if isinstance(exc, StepOrderError):
        return "step_order"
    if isinstance(exc, StepResultError):
        return "step_result"
    if isinstance(exc, CheckpointTooLarge):
        return "checkpoint_too_large"
    if isinstance(exc, ArtifactRefused):
        return "artifact_refused"
    return "tool_error"


def missing_capability(exc: ToolError) -> TaskError | None:
    """Beside the isError result of a tool that asked for an undeclared input kind: the -32021
    a synchronous caller gets instead (a task's client sees the isError result)."""
    if not isinstance(exc, InputNotSupported) or exc.capability is None:
        return None
    data: JSONObject = {"requiredCapabilities": {exc.capability: {}}}
    return {"code": codes.MISSING_REQUIRED_CLIENT_CAPABILITY, "message": str(exc), "data": data}
