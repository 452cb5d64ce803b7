"""``mcp-celery-tasks console``: the admins' console on its own port (``api.consoleserver``),
127.0.0.1:8090 unless told otherwise.

It refuses to start without an admin token (a console nobody can sign in to is a mistake, not a
deployment) and warns when it listens beyond this machine. Behind a reverse proxy it takes the
client address the proxy forwards only from ``MCP_TASKS_TRUSTED_PROXIES``, as ``serve`` does
(the same uvicorn protocol: ``api.httpserver``), and the sign-in limit keys on that address.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import typer

from mcp_celery_tasks.telemetry.logs import configure_logging

if TYPE_CHECKING:
    from mcp_celery_tasks.settings import Settings

__all__ = ["run_console"]

logger = logging.getLogger("mcp_celery_tasks.console")


def run_console(settings: Settings, *, host: str, port: int | None, path: str, log_level: str) -> None:
    from mcp_celery_tasks.api import httpserver
    from mcp_celery_tasks.api.consoleserver import DEFAULT_PORT, create_console_server, exposure_warning

    try:
        app = create_console_server(settings, path=path)
    except ValueError as exc:  # no admins, a plain-text token, a bad --path
        typer.echo(f"console: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(log_level)
    warning = exposure_warning(host, settings)
    if warning:
        logger.warning("%s", warning)
    where = f"http://{host}:{port or DEFAULT_PORT}{path if path.startswith('/') else '/' + path}"
    logger.info("console: serving the admins' console at %s (no MCP endpoint here)", where)
    httpserver.serve(app, settings, host=host, port=port or DEFAULT_PORT, workers=1, log_level=log_level)
