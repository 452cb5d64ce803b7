"""What every console page answers with: its path prefix, HTML under the console's headers, and
a refusal page."""

from __future__ import annotations

from starlette.responses import HTMLResponse, Response

from mcp_celery_tasks.console.render import render
from mcp_celery_tasks.console.security import HEADERS, Refused

__all__ = ["PREFIX", "html", "refusal"]

PREFIX = "/console"


def html(body: str, status: int = 200) -> Response:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def refusal(refused: Refused) -> Response:
    return html(render("refused.html", message=str(refused), prefix=PREFIX), refused.status)
