"""The client's commands, ``call`` and ``tools``: any SEP-2663 server, found from the running dev
stack of this checkout when no URL is given. Registered on the app by ``cli.commands``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mcp_celery_tasks.cli.call_options import SaveArtifactsOpt
from mcp_celery_tasks.cli.dev import record as devrecord

__all__ = ["DEFAULT_URL", "call", "tools"]

DEFAULT_URL = "http://127.0.0.1:8000/mcp"
UrlOpt = Annotated[
    str | None,
    typer.Option(
        metavar="URL",
        envvar="MCP_TASKS_URL",
        help=f"MCP endpoint (default: the running dev stack of this checkout, else {DEFAULT_URL})",
    ),
]
TokenOpt = Annotated[str | None, typer.Option(metavar="TOKEN", envvar="MCP_TASKS_TOKEN", help="Bearer token")]
TimeoutOpt = Annotated[
    float, typer.Option(metavar="SECONDS", help="Longest wait for any one answer from the server")
]


def call(
    tool: Annotated[str | None, typer.Argument(metavar="TOOL", help="Tool to call (see: tools)")] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", metavar="KEY=VALUE", help="A tool argument; JSON values allowed (repeat it)"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    resume: Annotated[
        str | None, typer.Option(metavar="TASK_ID", help="Follow an existing task instead")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="No live display or forms; print the final task as JSON")
    ] = False,
    answers: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help='Answers to input requests by key, e.g. {"*": {"action": "accept"}}'
        ),
    ] = None,
    timeout: TimeoutOpt = 60.0,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="Ctrl-C, SIGTERM or a closed terminal leave the task running (follow it with --resume)",
        ),
    ] = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="Run at most once per KEY: calling again with it follows the task it made "
            "(default: a fresh key, reused by this call's own retries)",
        ),
    ] = None,
    save_artifacts: SaveArtifactsOpt = None,
) -> None:
    """Call a tool as a task on any SEP-2663 server and follow it.

    Ctrl-C, SIGTERM or a closed terminal cancel the task (with --detach: leave
    it running). Without a terminal (--json, or stdin not a terminal) every
    input request without an --answers entry is declined at once.

    Exit codes: 0 completed; 1 the task failed or was cancelled, the tool
    reported an error, or an artifact could not be saved; 2 refused (a usage mistake such as a wrong argument
    type, or a JSON-RPC error from the server); 3 no MCP answer from the
    server (refused, timed out); 130 interrupted (Ctrl-C, SIGTERM, SIGHUP).
    """
    from mcp_celery_tasks.client.call import run_call

    endpoint, named = _endpoint(url)
    raise typer.Exit(
        run_call(
            url=endpoint,
            url_given=named,
            token=token,
            tool=tool,
            args=arg or [],
            resume=resume,
            as_json=as_json,
            answers_file=answers,
            timeout=timeout,
            detach=detach,
            idempotency_key=idempotency_key,
            save_artifacts=save_artifacts,
        )
    )


def tools(
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tools as JSON")] = False,
    timeout: TimeoutOpt = 60.0,
) -> None:
    """List the tools a server offers: name, task mode, arguments and a one-line description."""
    from mcp_celery_tasks.client.call import run_tools

    raise typer.Exit(run_tools(url=_endpoint(url)[0], token=token, as_json=as_json, timeout=timeout))


def _endpoint(url: str | None) -> tuple[str, bool]:
    """The endpoint to use, and whether the user named it (--url or MCP_TASKS_URL)."""
    if url:
        return url, True
    record = devrecord.find()
    if record is not None:
        devrecord.announce(record, record.mcp_url)
        return record.mcp_url, False
    return DEFAULT_URL, False
