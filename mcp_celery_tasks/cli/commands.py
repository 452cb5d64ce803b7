"""The composition root: ``mcp-celery-tasks serve | console | worker | beat | migrate | dev | call | tasks``.

Every command reads Settings from ``MCP_TASKS_*``; flags override the common ones.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

# Prefork workers keep Prometheus metrics in a shared folder; prometheus_client reads this
# variable when it is first imported, so it is set before anything imports it.
if len(sys.argv) > 1 and sys.argv[1] == "worker" and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="mcp-worker-metrics-")

import ipaddress
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mcp_celery_tasks.cli.admin.connect import (
    EXIT_DATABASE,
    EXIT_USAGE,
    config_error_line,
    driver_reason,
    fail,
    redact,
)
from mcp_celery_tasks.cli.admin.tasks import admin_app
from mcp_celery_tasks.cli.client_commands import call, tools
from mcp_celery_tasks.cli.gpus import GpuMaxTasksOpt, GpusOpt, SlotsOpt, apply_gpu_options
from mcp_celery_tasks.cli.help import PlainHelpCommand, PlainHelpGroup
from mcp_celery_tasks.telemetry.logs import configure_logging

if TYPE_CHECKING:
    from mcp_celery_tasks.settings import Settings

# Each command imports what it needs when it runs: ``--help`` and ``call`` start in a fraction of
# a second without alembic, SQLAlchemy, Celery, psycopg or pydantic-settings (a test pins this).

app = typer.Typer(
    cls=PlainHelpGroup, add_completion=False, no_args_is_help=True, help="MCP Tasks on Celery and Postgres."
)
app.add_typer(admin_app, name="tasks")

DatabaseOpt = Annotated[
    str | None, typer.Option("--database-url", help="Postgres DSN (MCP_TASKS_DATABASE_URL)")
]
BrokerOpt = Annotated[str | None, typer.Option("--broker-url", help="Celery broker (MCP_TASKS_BROKER_URL)")]
ToolsOpt = Annotated[
    str | None, typer.Option("--tools", help="Comma-separated tool modules (MCP_TASKS_TOOL_MODULES)")
]


def _settings(
    database_url: str | None = None, broker_url: str | None = None, tools: str | None = None
) -> Settings:
    from mcp_celery_tasks.settings import Settings

    overrides: dict[str, object] = {}
    if database_url:
        overrides["database_url"] = database_url
    if broker_url:
        overrides["broker_url"] = broker_url
    if tools:
        overrides["tool_modules"] = [m.strip() for m in tools.split(",") if m.strip()]
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValueError as exc:  # pydantic's ValidationError, or a *_FILE that cannot be read
        fail(f"configuration: {config_error_line(exc)}", EXIT_USAGE)


def _drop_api_secrets() -> None:
    """Re-run this process without the API's secrets in its environment.

    Tool code runs in worker processes and could read ``/proc/self/environ``, which keeps the
    environment a process started with (``os.environ.pop`` does not change it): so the worker
    starts again, with the API-only variables gone, before anything else happens.
    """
    from mcp_celery_tasks.settings import api_only_variables

    found = api_only_variables(os.environ)
    if not found:
        return
    typer.echo(f"worker: not keeping {', '.join(found)} (only the API needs them)", err=True)
    env = {k: v for k, v in os.environ.items() if k not in found}
    os.execve(sys.executable, [sys.executable, "-m", "mcp_celery_tasks.cli", *sys.argv[1:]], env)


def _require_tools(settings: Settings, command: str, *, no_cuda: bool = False) -> None:
    """Nothing is served unless configured: load the tools (through the team's Celery app when
    there is one), and refuse to start without any, saying how to configure them. ``no_cuda``
    (a prefork worker's main process): one module at a time, refusing the one that brings CUDA
    up (``cuda_guard``)."""
    from mcp_celery_tasks.broker.celery_app import load_app
    from mcp_celery_tasks.tools.registry import ToolModuleError, all_tools, load_tool_modules
    from mcp_celery_tasks.worker.cuda_guard import CudaInParent, load_checked

    try:
        if no_cuda:
            load_checked([], load_tool_modules)  # nothing before the app either
        if settings.celery_app:
            load_app(settings)  # its module installs MCP and loads its tool modules
        if no_cuda:
            load_checked(settings.tool_modules, load_tool_modules)
        else:
            load_tool_modules(settings.tool_modules)
    except CudaInParent as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    except (ToolModuleError, ValueError) as exc:
        typer.echo(f"{command}: {exc}", err=True)
        raise typer.Exit(2) from None
    if not all_tools():
        typer.echo(
            f"{command}: no tools configured. Set MCP_TASKS_TOOL_MODULES (e.g. "
            "MCP_TASKS_TOOL_MODULES='[\"myproject.tools\"]') or pass --tools myproject.tools.",
            err=True,
        )
        raise typer.Exit(2)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000)")] = None,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    database_url: DatabaseOpt = None,
    broker_url: BrokerOpt = None,
    tools: ToolsOpt = None,
    log_level: Annotated[str, typer.Option(help="Log level")] = "info",
) -> None:
    """Run the MCP endpoint (POST /mcp)."""
    from mcp_celery_tasks.api import httpserver
    from mcp_celery_tasks.api.server import create_server

    settings = _settings(database_url, broker_url, tools)
    bind = host or settings.host
    if not _is_loopback(bind) and not settings.auth_enabled and not settings.allow_insecure_bind:
        typer.echo(
            f"Refusing to bind {bind} with auth off: set MCP_TASKS_AUTH_TOKENS, or "
            "MCP_TASKS_ALLOW_INSECURE_BIND=true if something in front authenticates.",
            err=True,
        )
        raise typer.Exit(2)
    _require_tools(settings, "serve")
    configure_logging(log_level)
    if workers > 1:
        # Several processes: uvicorn imports the app in each one, from the environment.
        for name, value in (("DATABASE_URL", database_url), ("BROKER_URL", broker_url)):
            if value:
                os.environ[f"MCP_TASKS_{name}"] = value
        if tools:
            os.environ["MCP_TASKS_TOOL_MODULES"] = json.dumps(settings.tool_modules)
    app_or_factory = (
        create_server(settings) if workers == 1 else "mcp_celery_tasks.api.server:from_environment"
    )
    httpserver.serve(
        app_or_factory, settings, host=bind, port=port or settings.port, workers=workers, log_level=log_level
    )


@app.command()
def console(
    host: Annotated[
        str, typer.Option(help="Bind address (a non-loopback one: put TLS in front)")
    ] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="Port (default 8090)")] = None,
    path: Annotated[str, typer.Option(help="Where the console sits, e.g. /console behind a proxy")] = "/",
    database_url: DatabaseOpt = None,
    broker_url: BrokerOpt = None,
    tools: ToolsOpt = None,
    log_level: Annotated[str, typer.Option(help="Log level")] = "info",
) -> None:
    """Run the admins' web console alone, on its own port (no MCP endpoint)."""
    from mcp_celery_tasks.cli.console import run_console

    settings = _settings(database_url, broker_url, tools)
    run_console(settings, host=host, port=port, path=path, log_level=log_level)


@app.command()
def worker(
    queues: Annotated[str | None, typer.Option("-Q", "--queues", help="Queues to consume")] = None,
    concurrency: Annotated[int | None, typer.Option("-c", "--concurrency")] = None,
    pool: Annotated[str, typer.Option("-P", "--pool", help="prefork or threads (never solo)")] = "prefork",
    hostname: Annotated[str | None, typer.Option("-n", "--hostname")] = None,
    gpus: GpusOpt = None,
    slots_per_gpu: SlotsOpt = None,
    gpu_max_tasks_per_child: GpuMaxTasksOpt = None,
    database_url: DatabaseOpt = None,
    broker_url: BrokerOpt = None,
    tools: ToolsOpt = None,
    log_level: Annotated[str, typer.Option(help="Log level")] = "info",
) -> None:
    """Run a Celery worker that executes tool jobs (and, with -Q mcp.maintenance, beat jobs)."""
    from celery import signals

    from mcp_celery_tasks.broker.celery_app import load_app
    from mcp_celery_tasks.worker.celery_glue import install

    if pool == "solo":
        typer.echo("The solo pool cannot see cancels while a job runs; use prefork or threads.", err=True)
        raise typer.Exit(2)
    _drop_api_secrets()
    settings = _settings(database_url, broker_url, tools)
    settings, concurrency = apply_gpu_options(
        settings, gpus, slots_per_gpu, pool, concurrency, gpu_max_tasks_per_child
    )
    consumed = [q.strip() for q in (queues or settings.default_queue).split(",") if q.strip()]
    # A maintenance-only worker runs the GC and the sweeper, never a tool: it needs none.
    runs_tools = any(q != settings.maintenance_queue for q in consumed)
    if runs_tools:
        _require_tools(settings, "worker", no_cuda=pool == "prefork")
    celery = load_app(settings)
    install(celery, settings, load_tools=runs_tools)

    @signals.setup_logging.connect(weak=False)
    def _logging(**_: object) -> None:  # Celery then leaves logging to us
        configure_logging(log_level)

    argv = ["worker", "-P", pool, "-Q", queues or settings.default_queue, "--loglevel", log_level]
    if concurrency:
        argv += ["-c", str(concurrency)]
    argv += ["-n", hostname or f"mcp-{os.getpid()}@{socket.gethostname()}"]
    celery.worker_main(argv)


@app.command()
def beat(
    schedule_file: Annotated[str, typer.Option(help="Beat's schedule file")] = "celerybeat-schedule",
    database_url: DatabaseOpt = None,
    broker_url: BrokerOpt = None,
    log_level: Annotated[str, typer.Option(help="Log level")] = "info",
) -> None:
    """Run Celery beat (exactly one per deployment): GC and the sweeper."""
    from mcp_celery_tasks.broker.celery_app import beat_schedule, load_app

    settings = _settings(database_url, broker_url)
    try:
        celery = load_app(settings)
    except ValueError as exc:
        typer.echo(f"beat: {exc}", err=True)
        raise typer.Exit(2) from None
    celery.conf.beat_schedule = {**(celery.conf.beat_schedule or {}), **beat_schedule(settings)}
    celery.start(["beat", "-s", schedule_file, "--loglevel", log_level])


@app.command()
def migrate(
    database_url: DatabaseOpt = None,
    revision: Annotated[str, typer.Argument(help="Target revision")] = "head",
    roles: Annotated[
        bool,
        typer.Option(
            "--roles",
            help="Also create the group roles mcp_tasks_api, _worker, _maintenance, _admin and _autoscaler "
            "and grant each only what it uses (see the README's Database roles)",
        ),
    ] = False,
) -> None:
    """Apply database migrations (alembic upgrade); exit 3 if the database cannot be used."""
    from mcp_celery_tasks.errors import InfrastructureError
    from mcp_celery_tasks.store import migrate as migrations
    from mcp_celery_tasks.store import roles as grants

    settings = _settings(database_url)
    try:
        migrations.upgrade(settings, revision)
        if roles:
            grants.grant_roles(settings)
            typer.echo(f"roles: granted {', '.join(grants.ROLES)}", err=True)
    except InfrastructureError as exc:
        reason = driver_reason(exc.__cause__ or exc)
        fail(f"cannot migrate {redact(settings.database_url)}: {reason}", EXIT_DATABASE)
    except migrations.UnknownRevision as exc:
        fail(str(exc), EXIT_USAGE)
    except grants.CannotGrant as exc:
        fail(f"cannot grant the roles: {exc} (run migrate --roles as the database's owner)", EXIT_DATABASE)


dev_app = typer.Typer(cls=PlainHelpGroup, add_completion=False)
app.add_typer(dev_app, name="dev")


@dev_app.callback(invoke_without_command=True)
def dev(
    ctx: typer.Context,
    data_dir: Annotated[Path, typer.Option(help="Where the embedded services keep their data")] = Path(
        ".mcp-tasks"
    ),
    port: Annotated[int | None, typer.Option(help="API port (default 8000)")] = None,
    tools: ToolsOpt = None,
) -> None:
    """Run everything on this machine: Postgres and Redis (embedded unless MCP_TASKS_DATABASE_URL /
    MCP_TASKS_BROKER_URL are set), migrations, the API, a worker, the maintenance worker and beat.
    `dev psql` opens psql on the running stack's database."""
    if ctx.invoked_subcommand is not None:
        return
    from mcp_celery_tasks.cli.dev.stack import run_dev

    raise typer.Exit(run_dev(data_dir, port=port, tools=tools))


@dev_app.command(
    "psql", cls=PlainHelpCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def dev_psql(ctx: typer.Context) -> None:
    """psql on the running dev stack's database (found from this folder); arguments go to psql,
    e.g. `dev psql -c 'SELECT * FROM mcp_tasks_overview'`."""
    from mcp_celery_tasks.cli.dev.psql import run_psql

    raise typer.Exit(run_psql(list(ctx.args)))


# The client's commands (any SEP-2663 server): ``cli.client_commands``.
app.command(cls=PlainHelpCommand)(call)
app.command(cls=PlainHelpCommand)(tools)


def main() -> None:
    app(prog_name="mcp-celery-tasks")


if __name__ == "__main__":
    main()
