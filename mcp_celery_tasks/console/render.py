"""Pages from templates (the home of jinja2): autoescaped, undefined names are errors.

Everything a tool or a caller wrote (arguments, results, status messages, principals, tool names)
is untrusted. Autoescape makes markup text; ``plain`` also drops terminal escapes, control and
bidi characters (``client.terminal``), so a value shows literally, as it would in ``tasks show``.
Large values are cut at ``FOLD_CHARS`` for the page (folded under ``<details>``) and at
``MAX_CHARS`` altogether.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import jinja2

from mcp_celery_tasks.client.terminal import plain

__all__ = ["FOLD_CHARS", "MAX_CHARS", "render", "shown", "text"]

FOLD_CHARS = 400
MAX_CHARS = 64_000


def text(value: object) -> str:
    """A value as one safe line of text ('' for None)."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(value, timedelta):
        return f"{value.total_seconds():.3f} s"
    return plain(str(value))


def shown(value: object) -> str:
    """A JSON value pretty-printed for a ``<pre>``, line breaks kept, cut at ``MAX_CHARS``."""
    if value is None:
        return ""
    dumped = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    more = f"\n… (cut: {len(dumped)} characters in all)" if len(dumped) > MAX_CHARS else ""
    cut = dumped[:MAX_CHARS] + more
    return plain(cut, newlines=True)


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("mcp_celery_tasks.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["text"] = text
_env.filters["shown"] = shown
_env.globals["FOLD_CHARS"] = FOLD_CHARS


def render(name: str, **context: Any) -> str:
    return _env.get_template(name).render(**context)
