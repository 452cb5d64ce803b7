"""Least privilege in Postgres: one group role per kind of process, each granted what it runs.

``mcp-celery-tasks migrate --roles`` creates the group roles (``NOLOGIN``) when they are missing
and grants them, in the migrated database, exactly the table privileges below; an operator then
makes the login roles the processes connect as members (``GRANT mcp_tasks_worker TO ml_worker``).

- ``mcp_tasks_api``: the API process (requests, its fair publisher, sessions). It writes tasks,
  input answers, sessions and spent request states; it reads the principal limits, never writes them.
- ``mcp_tasks_worker``: a worker running tools. It updates the rows of the jobs it claims (claim,
  lease, report, outcome), opens input rows, appends progress logs, records durable steps,
  replaces checkpoints and writes artifacts; it can neither create nor
  delete a task, nor touch limits or sessions.
- ``mcp_tasks_maintenance``: the maintenance worker (GC, sweeper): a worker that may also delete
  expired tasks, sessions and spent request states.
- ``mcp_tasks_admin``: the ``tasks`` commands: everything above, plus the principal limits and
  the workers overview (``mcp_workers_overview``).
- ``mcp_tasks_autoscaler``: an autoscaler (KEDA's PostgreSQL trigger): the demand view only (a
  view runs with its owner's rights, so it reads counts, never a task row).

Row-level scoping (a tool process seeing only its own job's rows) is not expressed here: a worker
role reads every task row. Migrations keep running as the database's owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import psycopg
from psycopg import sql

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store._conninfo import connect_kwargs

__all__ = ["GRANTS", "ROLES", "CannotGrant", "grant_roles", "grant_statements"]


class CannotGrant(Exception):
    """The migrating role may not create roles or grant on our tables (it is not their owner)."""


_READ: Final = ("SELECT",)
_WRITE: Final = ("SELECT", "INSERT", "UPDATE")
_ALL: Final = ("SELECT", "INSERT", "UPDATE", "DELETE")

GRANTS: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "mcp_tasks_api": {
        "mcp_tasks": _WRITE,  # a session's tasks go with it through the foreign key, as its owner
        "mcp_task_inputs": _WRITE,
        "mcp_task_logs": _READ,
        "mcp_task_artifacts": _READ,  # resources/read and resources/list, the caller's own
        "mcp_task_artifact_chunks": _READ,
        "mcp_sessions": _ALL,
        "mcp_spent_request_states": ("SELECT", "INSERT", "UPDATE"),  # a state's one use
        "mcp_principal_limits": _READ,  # never written: the console's edits need the admin role
        "mcp_tool_limits": _READ,  # the fair release applies tool concurrency overrides
        "mcp_principal_buckets": _WRITE,  # creates per second, shared by the replicas
        "mcp_api_load": _ALL,  # its requests in progress, and the others'
        "mcp_maintenance": _ALL,  # the publisher records the broker's outages, and their ends
        "mcp_tasks_overview": _READ,
        "mcp_limit_changes": _READ,  # the console's audit page shows them
        "mcp_console_actions": ("SELECT", "INSERT"),  # the console's audit: appended, never changed
        "mcp_console_revocations": _WRITE,  # sign-outs: its sessions are checked against them
        "mcp_workers": _READ,  # the demand gauges: live workers' queues and slots
        "mcp_queue_demand": _READ,
        "alembic_version": _READ,  # readiness compares the schema with the code's head
    },
    "mcp_tasks_worker": {
        "mcp_tasks": ("SELECT", "UPDATE"),
        "mcp_task_inputs": _WRITE,
        "mcp_task_logs": ("SELECT", "INSERT"),
        "mcp_task_steps": ("SELECT", "INSERT"),
        "mcp_task_checkpoints": _ALL,  # a save replaces the previous checkpoint's chunks
        "mcp_task_checkpoint_chunks": _ALL,
        "mcp_task_artifacts": _ALL,  # ctx.artifact, fenced; deleted only by its run, when refused
        "mcp_task_artifact_chunks": _WRITE,
        "mcp_principal_limits": _READ,
        "mcp_tool_limits": _READ,
        "mcp_maintenance": _ALL,
        "mcp_workers": _ALL,  # its own row: register, heartbeat, deregister
        "alembic_version": _READ,
    },
    "mcp_tasks_maintenance": {
        "mcp_tasks": ("SELECT", "UPDATE", "DELETE"),
        "mcp_task_inputs": _WRITE,
        "mcp_task_logs": ("SELECT", "INSERT"),
        "mcp_sessions": ("SELECT", "DELETE"),
        "mcp_spent_request_states": ("SELECT", "DELETE"),  # expired ones
        "mcp_task_checkpoints": _READ,  # steps and checkpoints go with their task (cascade)
        "mcp_task_artifacts": ("SELECT", "DELETE"),  # with their task, and the orphan sweep
        "mcp_task_artifact_chunks": ("SELECT", "DELETE"),
        "mcp_principal_limits": _READ,
        "mcp_tool_limits": _READ,  # the sweeper's release pass
        "mcp_principal_buckets": ("SELECT", "DELETE"),  # idle (full) buckets are collected
        "mcp_console_actions": ("SELECT", "DELETE"),  # the audit past console_audit_retention_seconds
        "mcp_console_revocations": ("SELECT", "DELETE"),  # sign-outs past their sessions' expiry
        "mcp_maintenance": _ALL,
        "mcp_workers": _ALL,  # its own row, the beats it hears from, and the long-dead rows
        "alembic_version": _READ,
    },
    "mcp_tasks_admin": {
        "mcp_tasks": _ALL,
        "mcp_task_inputs": _ALL,
        "mcp_task_logs": _ALL,
        "mcp_task_steps": _ALL,
        "mcp_task_checkpoints": _ALL,
        "mcp_task_checkpoint_chunks": _ALL,
        "mcp_task_artifacts": _ALL,
        "mcp_task_artifact_chunks": _ALL,
        "mcp_sessions": _ALL,
        "mcp_spent_request_states": _ALL,
        "mcp_principal_limits": _ALL,
        "mcp_tool_limits": _ALL,
        "mcp_principal_buckets": _ALL,
        "mcp_api_load": _ALL,
        "mcp_limit_changes": ("SELECT", "INSERT"),  # the audit is appended to, never rewritten
        "mcp_console_actions": ("SELECT", "INSERT"),  # likewise
        "mcp_console_revocations": _ALL,  # tasks console revoke
        "mcp_maintenance": _ALL,
        "mcp_workers": _ALL,
        "mcp_tasks_overview": _READ,
        "mcp_queue_demand": _READ,
        "mcp_workers_overview": _READ,  # live workers, their devices and the jobs on them
        "alembic_version": _READ,
    },
    "mcp_tasks_autoscaler": {
        "mcp_queue_demand": _READ,  # KEDA's PostgreSQL trigger: one number per queue, no task row
    },
}
"""Group role -> table (or view) -> privileges. Every table of the schema appears for every role
that may touch it; a test holds this map against ``schema.metadata``."""

ROLES: Final = tuple(GRANTS)


def grant_statements() -> list[sql.Composed]:
    """What ``migrate --roles`` runs, in order: create the missing group roles, revoke what they
    had on our tables, grant what the map says. Running it again converges to the map."""
    statements: list[sql.Composed] = []
    tables = sorted({table for grants in GRANTS.values() for table in grants})
    for role in ROLES:
        # Two deployments migrating at once may both find the role missing: the loser's
        # CREATE ROLE fails with one of these two, and the role exists either way.
        statements.append(
            sql.SQL(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN "
                "CREATE ROLE {role} NOLOGIN; END IF; "
                "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            ).format(name=sql.Literal(role), role=sql.Identifier(role))
        )
        statements.append(sql.SQL("GRANT USAGE ON SCHEMA public TO {role}").format(role=sql.Identifier(role)))
        statements.append(
            sql.SQL("REVOKE ALL ON {tables} FROM {role}").format(
                tables=sql.SQL(", ").join(sql.Identifier(table) for table in tables),
                role=sql.Identifier(role),
            )
        )
        for table, privileges in GRANTS[role].items():
            statements.append(
                sql.SQL("GRANT {privileges} ON {table} TO {role}").format(
                    privileges=sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    table=sql.Identifier(table),
                    role=sql.Identifier(role),
                )
            )
    return statements


def grant_roles(settings: Settings) -> None:
    """Apply ``grant_statements`` to ``settings.database_url``, as its owner (or a superuser).

    Raises InfrastructureError (the driver's error on ``__cause__``) when the database cannot be
    reached; CannotGrant when the role that runs it may not create roles or grant."""
    try:
        conn = psycopg.connect(settings.database_url, **connect_kwargs(settings, "mcp-celery-tasks-migrate"))
    except psycopg.OperationalError as exc:
        raise InfrastructureError("the task database is unavailable") from exc
    with conn:
        try:
            for statement in grant_statements():
                conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise CannotGrant(str(exc).strip()) from exc
