"""What a task's detail page shows, built from its rows: the fields (never the bearer-like task
id), a timeline from the timestamps the rows keep, and the live page's state."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from mcp_celery_tasks.console.render import shown, text
from mcp_celery_tasks.console.retry import RETRYABLE
from mcp_celery_tasks.store.console_calls import TaskDetail

__all__ = ["ACTIVE", "live_state", "task_view", "timeline"]

ACTIVE = frozenset({"working", "input_required", "suspended"})
"""Display statuses a cancel still acts on."""

_MOMENTS = (
    ("created_at", "created"),
    ("dispatched_at", "released to the broker"),
    ("started_at", "claimed by a worker"),
    ("suspended_at", "suspended (slot given back)"),
    ("resumed_at", "resumed"),
    ("retry_at", "retry not before"),
    ("cancel_requested_at", "cancel requested"),
    ("finished_at", "finished"),
)

_LIVE = (
    "display_status", "status_message", "attempts", "worker", "lease_until", "device", "error_kind",
    "error_message", "stop_reason", "last_updated_at", "expires_at",
)  # fmt: skip


def timeline(task: Mapping[str, object], inputs: list[Mapping[str, object]]) -> list[tuple[str, str]]:
    """(moment, what happened) in time order: the task's own timestamps and each input request's
    asking and answer."""
    moments: list[tuple[datetime, str]] = []
    for column, label in _MOMENTS:
        value = task.get(column)
        if isinstance(value, datetime):
            moments.append((value, label))
    for item in inputs:
        key = text(item["key"])
        if isinstance(asked := item.get("requested_at"), datetime):
            moments.append((asked, f"asked {key} ({text(item['method'])})"))
        if isinstance(answered := item.get("answered_at"), datetime):
            moments.append((answered, f"answered {key}"))
    moments.sort(key=lambda moment: moment[0])
    return [(text(when), label) for when, label in moments]


def task_view(detail: TaskDetail) -> dict[str, Any]:
    """The detail page's context: the row without ``task_id``, its inputs, steps, artifacts."""
    task = {key: value for key, value in detail.task.items() if key != "task_id"}
    return {
        "task": task,
        "inputs": detail.inputs,
        "steps": detail.steps,
        "artifacts": detail.artifacts,
        "timeline": timeline(detail.task, detail.inputs),
        "cancellable": task["display_status"] in ACTIVE,
        "retryable": task["display_status"] in RETRYABLE,
    }


def live_state(row: Mapping[str, object], inputs: list[Mapping[str, object]]) -> dict[str, object]:
    """What the live page replaces in place (as text: the page sets ``textContent``)."""
    state: dict[str, object] = {name: text(row.get(name)) for name in _LIVE}
    state["result"] = shown(row.get("result"))
    state["error"] = shown(row.get("error"))
    state["progress"] = _progress(row)
    state["timeline"] = timeline(row, inputs)
    state["cancellable"] = state["display_status"] in ACTIVE
    # Nothing changes after a terminal task's worker has stopped: the page closes its stream.
    state["final"] = row.get("status") in ("completed", "failed", "cancelled") and (
        row.get("finished_at") is not None or row.get("started_at") is None
    )
    return state


def _progress(row: Mapping[str, object]) -> str:
    done, total = row.get("progress"), row.get("progress_total")
    if done is None:
        return ""
    return f"{done:g} / {total:g}" if isinstance(total, float) and isinstance(done, float) else text(done)
