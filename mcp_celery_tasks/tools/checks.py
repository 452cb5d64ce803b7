"""The checks ``@tool`` runs on its arguments when a tool module is imported: a bad value fails
the import, naming the tool, never a call."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = [
    "INPUT_KINDS",
    "ISOLATIONS",
    "InputKind",
    "Isolation",
    "checked_inputs",
    "checked_isolation",
    "checked_scopes",
    "checked_suspend_after",
    "takes_principal",
]

InputKind = Literal["elicitation", "sampling", "roots"]
INPUT_KINDS: tuple[InputKind, ...] = ("elicitation", "sampling", "roots")
"""The client capabilities a tool's input requests need: ``elicitation/create``,
``sampling/createMessage``, ``roots/list``."""


Isolation = Literal["none", "process"]
ISOLATIONS: tuple[Isolation, ...] = ("none", "process")
"""Where a tool's body runs: in the pool child (``none``) or in a fresh process of its own that
holds no credentials (``process``: ``worker.isolation``)."""


def checked_isolation(tool_name: str, value: str) -> Isolation:
    if value not in ISOLATIONS:
        raise ValueError(f"tool {tool_name!r}: isolation is one of {', '.join(ISOLATIONS)}, not {value!r}")
    return value


def checked_suspend_after(value: float | Literal["settings"] | None) -> float | Literal["settings"] | None:
    if value is None or value == "settings":
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"suspend_after must be a number of seconds >= 0, None or 'settings', not {value!r}")
    return float(value)


_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,128}")
r"""RFC 6749 §3.3 ``scope-token``: printable ASCII without space, ``"`` and ``\``."""


def checked_inputs(tool_name: str, kinds: Sequence[str]) -> tuple[InputKind, ...]:
    if isinstance(kinds, str):
        raise TypeError(f"tool {tool_name!r}: needs_inputs is a list of input kinds, not one string")
    for kind in kinds:
        if kind not in INPUT_KINDS:
            raise ValueError(f"tool {tool_name!r}: {kind!r} is not an input kind ({', '.join(INPUT_KINDS)})")
    return tuple(dict.fromkeys(kinds))  # type: ignore[arg-type]  # checked just above


def checked_scopes(tool_name: str, scopes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(scopes, str):
        raise TypeError(f"tool {tool_name!r}: scopes is a list of scope names, not one string")
    for scope in scopes:
        if not isinstance(scope, str) or not _SCOPE_TOKEN.fullmatch(scope):
            raise ValueError(f"tool {tool_name!r}: {scope!r} is not an OAuth scope token (RFC 6749 §3.3)")
    return tuple(dict.fromkeys(scopes))


def takes_principal(function: Callable[..., object]) -> bool:
    """Whether a function of a call's arguments (``ask_first``, ``concurrency_key``) takes the
    calling principal as well."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)
