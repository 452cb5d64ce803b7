"""The console's limits page: every principal's overrides, and a form that changes them.

A change goes through the same audited statement as ``tasks limits set`` (each changed field a
row of ``mcp_limit_changes``, actor ``admin:<name>``), and is also a console action. An empty
field leaves that limit as it was; a value that is not a number of the right kind refuses the
whole form (HTTP 400), so nothing half-applied is recorded. Under the roles of ``migrate --roles``
the API (``mcp_tasks_api``) only reads limits: the page then refuses with 403 and names the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcp_celery_tasks.console.security import Refused

__all__ = ["FIELDS", "parse_limits"]

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
