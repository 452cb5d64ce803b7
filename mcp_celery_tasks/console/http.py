"""What every console page answers with: its path prefix, HTML under the console's headers, and
a refusal page.

The prefix is where the console's routes sit: ``/console`` on the API (``PREFIX``), any path a
host app chooses under ``mount(..., console=...)``, ``""`` (the root) under the ``console``
command. Every link, form, redirect and cookie path is built from it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from starlette.responses import HTMLResponse, Response

from mcp_celery_tasks.console.render import render
from mcp_celery_tasks.console.security import HEADERS, Refused

__all__ = ["PREFIX", "cookie_path", "html", "next_path", "prefix_of", "refusal"]

PREFIX = "/console"
"""The API's console prefix."""
_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")


def prefix_of(path: str) -> str:
    """A console path as its route prefix: ``/`` (or ``""``) is the root, ``/admin/tasks/`` is
    ``/admin/tasks``. Refused (``ValueError``) unless it is plain path segments of letters, digits
    and ``._~-``: the prefix goes into every URL and cookie path of the pages unescaped."""
    trimmed = path.rstrip("/")
    if trimmed == "" and path in ("", "/"):
        return ""
    if not _PATH.fullmatch(trimmed) or any(part in (".", "..") for part in trimmed.split("/")):
        raise ValueError(
            f"console path must be '/' or '/segment[/segment…]' of letters, digits and ._~- : {path!r}"
        )
    return trimmed


_NEXT = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*")
"""What a sign-in's ``next`` may hold: a URL path and query of plain characters (no space, tab,
backslash, fragment or control character, which a browser may read as a way off the site)."""


def next_path(target: str | None, prefix: str) -> str:
    """Where to go after signing in: a path of this console only, never another site (``//x``,
    ``/\\x``, a tab a browser drops), nor a host app's page beside it (``..`` in any spelling)."""
    home = f"{prefix}/"
    if not target or not target.startswith(home) or target.startswith("//") or not _NEXT.fullmatch(target):
        return home
    segments = target.partition("?")[0].split("/")
    if any(unquote(segment) in (".", "..") or "/" in unquote(segment) for segment in segments):
        return home
    return target


def cookie_path(prefix: str) -> str:
    """The console's cookies go back to its own paths only (the root's: every path)."""
    return prefix or "/"


def html(body: str, status: int = 200) -> Response:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def refusal(refused: Refused, prefix: str) -> Response:
    return html(render("refused.html", message=str(refused), prefix=prefix), refused.status)
