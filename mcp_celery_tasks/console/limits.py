"""The console's limits page: every principal's overrides, and a form that changes them.

A change goes through the same audited statement as ``tasks limits set`` (each changed field a
row of ``mcp_limit_changes``, actor ``admin:<name>``), and is also a console action. An empty
field leaves that limit as it was; a value that is not a number of the right kind refuses the
whole form (HTTP 400), so nothing half-applied is recorded. Under the roles of ``migrate --roles``
the API (``mcp_tasks_api``) only reads limits: the page then refuses with 403 and names the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mcp_celery_tasks.console.security import Refused
from mcp_celery_tasks.lifecycle import ALL_GROUPS
from mcp_celery_tasks.tools.concurrency import MAX_CONCURRENCY

__all__ = ["FIELDS", "ToolLimit", "parse_limits", "parse_tool_limit"]

FIELDS: dict[str, tuple[str, type[int] | type[float] | type[str], int]] = {
    "max_active_tasks": ("tasks working or waiting at once", int, 0),
    "creates_per_second": ("creates per second", float, 0),
    "create_burst": ("creates at once before the rate applies", int, 1),
    "max_concurrent_requests": ("requests in progress at once", int, 0),
    "max_waiting_inputs": ("jobs waiting for input per queue", int, 0),
    "note": ("note", str, 0),
}
"""Field -> (what it limits, its type, its least value)."""
MAX_NOTE_CHARS = 500
MAX_PRINCIPAL_CHARS = 256


def parse_limits(form: Mapping[str, str]) -> tuple[str, dict[str, object]]:
    """(principal, the limits given) from the form; ``Refused(400)`` for anything unusable."""
    principal = form.get("principal", "").strip()
    if not principal or len(principal) > MAX_PRINCIPAL_CHARS or not principal.isprintable():
        raise Refused(400, f"principal: 1 to {MAX_PRINCIPAL_CHARS} printable characters (token:alice)")
    limits: dict[str, object] = {}
    for name, (_, kind, least) in FIELDS.items():
        given = form.get(name, "").strip()
        if not given:
            continue
        if kind is str:
            if len(given) > MAX_NOTE_CHARS:
                raise Refused(400, f"{name}: at most {MAX_NOTE_CHARS} characters")
            limits[name] = given
            continue
        try:
            value = kind(given)
        except ValueError:
            raise Refused(400, f"{name}: not a number") from None
        if not isinstance(value, int | float) or not value >= least or value != value:  # NaN
            raise Refused(400, f"{name}: at least {least}")
        limits[name] = value
    if not limits:
        raise Refused(400, "give at least one limit to change")
    return principal, limits


@dataclass(frozen=True, slots=True)
class ToolLimit:
    """A tool concurrency change: ``concurrency`` None clears the override (back to the declared
    limit); ``group`` is one group's label (``model=moons``) or ``ALL_GROUPS``."""

    tool: str
    group: str
    concurrency: int | None
    note: str | None


def parse_tool_limit(form: Mapping[str, str]) -> ToolLimit:
    """The tool limit form (``op`` set or clear); ``Refused(400)`` for anything unusable."""
    tool, group = form.get("tool", "").strip(), form.get("key", "").strip() or ALL_GROUPS
    for name, value in (("tool", tool), ("key", group)):
        if not value or len(value) > MAX_PRINCIPAL_CHARS or not value.isprintable():
            raise Refused(400, f"{name}: 1 to {MAX_PRINCIPAL_CHARS} printable characters")
    note = form.get("note", "").strip() or None
    if note is not None and len(note) > MAX_NOTE_CHARS:
        raise Refused(400, f"note: at most {MAX_NOTE_CHARS} characters")
    op = form.get("op", "set")
    if op == "clear":
        return ToolLimit(tool, group, None, None)
    given = form.get("concurrency", "").strip()
    if op != "set" or not given.isdigit() or int(given) > MAX_CONCURRENCY:
        raise Refused(400, f"concurrency: runs at once, 0 (paused) to {MAX_CONCURRENCY}")
    return ToolLimit(tool, group, int(given), note)
