"""The limits and timings of one job, resolved once from its tool's spec and the settings.

A per-tool value (``@tool(time_limit=…)``) wins over the worker's setting; an unset or zero one
falls back to it. Every part of the pipeline that bounds a job reads this object instead of the
spec and the settings: the runner (the soft limit for the runtime, the input wait for the
context), the watchdog (hard, soft and memory limits, the cancel grace) and the start-up check
of input waits against the broker's redelivery limit. A new per-job setting is one field here
and one line in ``for_tool``.

The lease is not here: a job is claimed (and leased) before its tool is known, and one
statement renews the leases of all of a worker's children, so it stays a per-worker setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tools.registry import ToolSpec

__all__ = ["JobLimits"]


@dataclass(frozen=True, slots=True)
class JobLimits:
    """What bounds one run of a tool. ``None`` (or 0, for the hard limits): no such limit."""

    time_limit_s: float | None
    """Hard limit of running (input waits not counted): past it the watchdog kills the process."""
    soft_time_limit_s: float | None
    """Past it the tool gets ``SoftTimeLimitExceeded`` (once)."""
    memory_limit_mb: int | None
    """Most resident memory of the job's process; above it the watchdog kills the process."""
    input_timeout_s: float
    """How long one input request waits for its answer (a task-augmented call)."""
    sync_input_timeout_s: float
    """The cap of an input wait in a synchronous call (MRTR: the client retries soon or left)."""
    cancel_grace_s: float
    """How long a cancelled job may keep running before the watchdog kills its process."""
    suspend_after_s: float | None
    """Waiting for input this long, the job gives its slot back (None: it stays resident)."""
    gpu_memory_limit_mb: int | None = None
    """Most device memory the job's process may hold on its GPU (measured through NVML)."""

    @classmethod
    def for_tool(cls, spec: ToolSpec | None, settings: Settings) -> JobLimits:
        """The limits of a run of ``spec`` (``None``: a tool this process does not know)."""
        return cls(
            time_limit_s=(spec.time_limit if spec else None) or settings.tool_time_limit_seconds,
            soft_time_limit_s=(spec.soft_time_limit if spec else None)
            or settings.tool_soft_time_limit_seconds,
            memory_limit_mb=(spec.memory_limit_mb if spec else None) or settings.tool_memory_limit_mb,
            input_timeout_s=(spec.input_timeout if spec else None) or settings.input_timeout_seconds,
            sync_input_timeout_s=settings.sync_input_timeout_seconds,
            cancel_grace_s=settings.cancel_grace_seconds,
            suspend_after_s=settings.suspend_after_seconds
            if spec is None or spec.suspend_after == "settings"
            else spec.suspend_after,
            gpu_memory_limit_mb=(spec.gpu_memory_limit_mb if spec else None)
            or settings.tool_gpu_memory_limit_mb,
        )

    @property
    def resident_wait_s(self) -> float:
        """The longest a job of this tool holds its slot waiting for input (what the broker's
        redelivery limit must exceed)."""
        if self.suspend_after_s is None:
            return self.input_timeout_s
        return min(self.input_timeout_s, self.suspend_after_s)

    def input_wait_s(self, *, task_augmented: bool) -> float:
        """How long an input request of this job waits: a synchronous call's is capped."""
        if task_augmented:
            return self.input_timeout_s
        return min(self.input_timeout_s, self.sync_input_timeout_s)
