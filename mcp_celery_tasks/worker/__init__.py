"""The worker side: the Celery glue (``install``), the job runner, the runtime under a job's
context, the pool child's own state, leases, outcomes, the observer and the watchdog.

``from mcp_celery_tasks.worker import install`` adds MCP's tasks to a team's Celery app."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_celery_tasks.worker.celery_glue import check_input_timeouts, inbox_factory, install

__all__ = ["check_input_timeouts", "inbox_factory", "install"]

if not TYPE_CHECKING:  # Celery loads only with the glue: ``worker.runner`` and the rest stay Celery-free

    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.celery_glue"), name)
        globals()[name] = value
        return value
