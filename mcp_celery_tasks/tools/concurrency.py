"""Concurrency limits: at most N runs of a tool at once, cluster-wide or per argument value.

``@tool(concurrency=8)`` lets at most 8 jobs of the tool be in flight across every worker;
``@tool(concurrency_key="model", concurrency=1)`` at most one per value of the ``model``
argument (or of any function of the arguments). A task carries its **group** (``''`` for the
whole tool, else the key's label, ``model=moons``) and the declared limit; the fair release pass
(``store.backlog.RELEASE``) publishes a job only while its group has room, so a job waiting for
its group holds no worker slot and no broker message, and the principals waiting on one group
take turns as in the rest of the backlog. Admins override a limit per tool or per group
(``tasks limits tool``, table ``mcp_tool_limits``); 0 pauses a group.

Everything here is checked when the tool is registered (at import), so a bad limit fails the
start of the API and the workers, never a call.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final

from mcp_celery_tasks.lifecycle import ALL_GROUPS
from mcp_celery_tasks.tools.checks import takes_principal

__all__ = [
    "ALL_GROUPS",
    "MAX_CONCURRENCY",
    "ConcurrencyKey",
    "ConcurrencyLimit",
    "KeyUnavailable",
    "concurrency_limit",
    "waiting_message",
]

ConcurrencyKey = (
    str | Callable[[Mapping[str, object]], object] | Callable[[Mapping[str, object], str], object]
)
"""An argument's name, or a function of the validated (JSON) arguments (and, if it takes a second
parameter, of the calling principal: one run per file of each user) returning the key."""

MAX_CONCURRENCY: Final = 100_000
MAX_LABEL_CHARS: Final = 200
_UNSAFE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """A tool's declared limit: ``limit`` runs at once per group of ``key`` (None: the whole tool)."""

    tool: str
    limit: int
    key: ConcurrencyKey | None = None
    per_principal: bool = False
    """The key function takes the principal too."""

    def group(self, arguments: Mapping[str, object], principal: str = "") -> str:
        """The group of a call with these validated arguments: ``''`` for a tool-wide limit, else
        ``name=value`` (an argument) or the function's value. A value too long or holding control
        characters is labelled by its digest, so a group's label is always short and printable."""
        if self.key is None:
            return ""
        if isinstance(self.key, str):
            return f"{self.key}={_label(arguments.get(self.key))}"
        try:
            value = self.key(arguments, principal) if self.per_principal else self.key(arguments)  # type: ignore[call-arg]
        except Exception as exc:
            # The function runs on the caller's (validated) arguments: its failure is the call's
            # (``ToolSpec.concurrency_group`` answers it as invalid arguments).
            raise KeyUnavailable(
                f"Invalid arguments for tool {self.tool!r}: its concurrency key cannot be computed "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        return _label(value)


class KeyUnavailable(ValueError):
    """The key function failed on a call's arguments."""


def _label(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    if len(text) <= MAX_LABEL_CHARS and not _UNSAFE.search(text) and text != ALL_GROUPS:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_UNSAFE.sub('?', text[:40])}…#{digest}"


def concurrency_limit(
    tool: str, concurrency: int | None, key: ConcurrencyKey | None, parameters: Collection[str]
) -> ConcurrencyLimit | None:
    """The checked limit of ``@tool(concurrency=…, concurrency_key=…)``; ``parameters`` are the
    argument names the tool takes (a key naming another is a typo caught at import)."""
    if concurrency is None:
        if key is not None:
            raise TypeError(f"tool {tool!r}: concurrency_key needs concurrency=N (runs at once per key)")
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"tool {tool!r}: concurrency must be a whole number of runs, not {concurrency!r}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(
            f"tool {tool!r}: concurrency must be between 1 and {MAX_CONCURRENCY}, not {concurrency}"
        )
    if isinstance(key, str):
        if key not in parameters:
            valid = ", ".join(sorted(parameters)) or "none"
            raise ValueError(f"tool {tool!r}: concurrency_key {key!r} is not one of its arguments ({valid})")
    elif key is not None and not callable(key):
        raise TypeError(
            f"tool {tool!r}: concurrency_key must be an argument's name or a function, not {key!r}"
        )
    per_principal = callable(key) and takes_principal(key)
    return ConcurrencyLimit(tool=tool, limit=concurrency, key=key, per_principal=per_principal)


def waiting_message(tool: str, group: str, running: int, limit: int) -> str:
    """The statusMessage of a job held back by its group: ``waiting: 1 other run of train_model
    for model=moons``, or that an admin paused the group."""
    where = f"{tool} for {group}" if group else tool
    if limit <= 0:
        return f"waiting: runs of {where} are paused by an admin"
    return f"waiting: {running} other run{'' if running == 1 else 's'} of {where}"
