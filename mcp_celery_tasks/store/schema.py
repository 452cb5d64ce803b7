"""Tables and metadata: the schema Alembic migrates and ``alembic check`` compares against.

Queries do not go through these objects at run time (``store`` holds plain SQL for the hot
paths); the tables exist so that the migration history can be checked against one source.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB

from mcp_celery_tasks import lifecycle
from mcp_celery_tasks.store.queries import NOTIFY_CHANNEL

__all__ = [
    "NOTIFY_CHANNEL",
    "VIEWS",
    "api_load",
    "artifact_chunks",
    "artifacts",
    "console_actions",
    "console_revocations",
    "limit_changes",
    "maintenance",
    "metadata",
    "principal_buckets",
    "principal_limits",
    "sessions",
    "spent_request_states",
    "task_checkpoint_chunks",
    "task_checkpoints",
    "task_inputs",
    "task_logs",
    "task_steps",
    "tasks",
    "tool_limits",
    "workers",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

STATUS_CHECK = lifecycle.CHECK

VIEWS = ("mcp_tasks_overview", "mcp_queue_demand", "mcp_workers_overview")
"""The views the migrations create (``alembic check`` does not see views, so they are named here):
the tasks overview (0001, last changed in 0015: ``device``), the demand per queue (0013, last
changed in 0019: a retry waiting for its time is not demand) and the live workers with the jobs on
them (0015). Each is granted in ``roles.GRANTS``."""

tasks = Table(
    "mcp_tasks",
    metadata,
    Column("task_id", Text, primary_key=True),
    # Unique through ``ix_mcp_tasks_job_id`` (0024), whose ``text_pattern_ops`` serve prefixes.
    Column("job_id", Text, nullable=False),
    Column("owner", Text, nullable=False),
    Column("tool_name", Text, nullable=False),
    Column("arguments", JSONB, nullable=False),
    Column("preflight", JSONB, nullable=True),
    Column("status", Text, nullable=False),
    Column("status_message", Text, nullable=True),
    Column("result", JSONB, nullable=True),
    Column("error", JSONB, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("ttl_ms", BigInteger, nullable=True),
    Column("retention_ms", BigInteger, nullable=False),
    Column("poll_interval_ms", Integer, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("cancel_requested_at", DateTime(timezone=True), nullable=True),
    Column("queue", Text, nullable=False),
    Column("dispatched_at", DateTime(timezone=True), nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("redeliveries", Integer, nullable=False, server_default=text("0")),
    Column("worker", Text, nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
    Column("inbox", Text, nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("protocol_version", Text, nullable=False),
    Column("client_capabilities", JSONB, nullable=False),
    Column("client_info", JSONB, nullable=True),
    Column("session_id", Text, nullable=True),
    Column("error_kind", Text, nullable=True),
    Column("error_message", Text, nullable=True),
    Column("stop_reason", Text, nullable=True),
    Column("progress", Float, nullable=True),
    Column("progress_total", Float, nullable=True),
    Column("log_level", Text, nullable=True),
    Column("log_seq", Integer, nullable=False, server_default=text("0")),
    Column("suspended_at", DateTime(timezone=True), nullable=True),
    Column("resumed_at", DateTime(timezone=True), nullable=True),
    Column("suspensions", Integer, nullable=False, server_default=text("0")),
    Column("device", Text, nullable=True),
    # Migration 0018: the row backs a synchronous call (``ctx.is_task`` is False).
    Column("synchronous", Boolean, nullable=False, server_default=text("false")),
    Column("idempotency_key", Text, nullable=True),
    Column("request_digest", Text, nullable=True),
    # A retry's "not before" (``store.retry_queries``): set, the job waits outside the backlog.
    Column("retry_at", DateTime(timezone=True), nullable=True),
    # Migration 0020: a tool's concurrency limit (``store.backlog.RELEASE``): the group ('' for
    # the whole tool, else its key's label, ``model=moons``) and the declared limit.
    Column("concurrency_group", Text, nullable=True),
    Column("concurrency_limit", Integer, nullable=True),
    CheckConstraint(STATUS_CHECK, name="status"),
    Index("ix_mcp_tasks_expires_at", "expires_at"),
    Index("ix_mcp_tasks_owner_created_at", "owner", "created_at"),
    Index(
        "ix_mcp_tasks_active",
        "status",
        "lease_until",
        postgresql_where=text(f"status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"),
    ),
    Index("ix_mcp_tasks_undispatched", "created_at", postgresql_where=text("dispatched_at IS NULL")),
    # The fair publisher: the backlog per queue and principal, oldest first; the in-flight set.
    Index(
        "ix_mcp_tasks_backlog",
        "queue",
        "owner",
        "created_at",
        "task_id",
        postgresql_include=["concurrency_limit"],  # 0020: the plain release skips limited jobs
        postgresql_where=text(
            f"dispatched_at IS NULL AND retry_at IS NULL AND status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"
        ),
    ),
    # Queues whose backlog holds jobs of a limited tool (``backlog.RELEASE_LIMITED`` runs for them).
    Index(
        "ix_mcp_tasks_limited_backlog",
        "queue",
        postgresql_where=text(
            "concurrency_limit IS NOT NULL AND dispatched_at IS NULL AND retry_at IS NULL"
            f" AND status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"
        ),
    ),
    # Retries waiting for their time, soonest first: the release pass moves the due ones into
    # the backlog (``retry_at`` cleared), so the backlog index never holds a job not yet due.
    Index(
        "ix_mcp_tasks_retry_wait",
        "retry_at",
        postgresql_where=text(
            "retry_at IS NOT NULL AND dispatched_at IS NULL"
            f" AND status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"
        ),
    ),
    Index(
        "ix_mcp_tasks_inflight",
        "queue",
        "owner",
        postgresql_where=text(
            "dispatched_at IS NOT NULL AND suspended_at IS NULL"
            f" AND status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"
        ),
    ),
    # Suspended tasks per principal (the cap on stored suspended tasks).
    Index(
        "ix_mcp_tasks_suspended",
        "owner",
        postgresql_where=text(
            f"suspended_at IS NOT NULL AND status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"
        ),
    ),
    Index(
        "ix_mcp_tasks_owner_active",
        "owner",
        postgresql_where=text(f"status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"),
    ),
    # Idempotent calls: one live task per (owner, key); rows without a key stay out of it.
    Index(
        "ix_mcp_tasks_idempotency",
        "owner",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # A concurrency group's jobs in flight (published or running, not suspended).
    Index(
        "ix_mcp_tasks_concurrency",
        "tool_name",
        "concurrency_group",
        postgresql_where=text(
            "concurrency_limit IS NOT NULL AND dispatched_at IS NOT NULL AND suspended_at IS NULL"
            f" AND status IN {lifecycle.sql_list(lifecycle.ACTIVE)}"
        ),
    ),
    # Migration 0023: the console's keyset list (newest first) and its overview's failures.
    Index("ix_mcp_tasks_created_at_job_id", "created_at", "job_id"),
    Index(
        "ix_mcp_tasks_failures",
        "finished_at",
        postgresql_include=["tool_name", "status", "error_kind", "stop_reason"],  # 0024: index-only
        postgresql_where=text("status = 'failed' OR error_kind IS NOT NULL OR stop_reason IS NOT NULL"),
    ),
    # Migration 0024: job-id lookups and prefixes (the unique constraint of 0001 it replaced
    # served no prefix), and the list by finish time (finished rows only).
    Index("ix_mcp_tasks_job_id", "job_id", unique=True, postgresql_ops={"job_id": "text_pattern_ops"}),
    Index(
        "ix_mcp_tasks_finished_at_job_id",
        "finished_at",
        "job_id",
        postgresql_where=text("finished_at IS NOT NULL"),
    ),
    # Cancelled while running, the worker not stopped yet: the list's and the overview's "stopping".
    Index(
        "ix_mcp_tasks_stopping",
        "created_at",
        "job_id",
        postgresql_where=text("status = 'cancelled' AND started_at IS NOT NULL AND finished_at IS NULL"),
    ),
    Index(
        "ix_mcp_tasks_session_created_at",
        "session_id",
        "created_at",
        postgresql_where=text("session_id IS NOT NULL"),
    ),
)

task_inputs = Table(
    "mcp_task_inputs",
    metadata,
    Column("task_id", Text, ForeignKey("mcp_tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("key", Text, nullable=False),
    Column("method", Text, nullable=False),
    Column("params", JSONB, nullable=True),
    Column("params_hash", Text, nullable=False),
    Column("response", JSONB, nullable=True),
    Column("superseded", Boolean, nullable=False, server_default=text("false")),
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("answered_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("task_id", "key"),
    CheckConstraint(
        "method IN ('elicitation/create', 'sampling/createMessage', 'roots/list')", name="method"
    ),
)

task_logs = Table(
    "mcp_task_logs",
    metadata,
    Column("task_id", Text, ForeignKey("mcp_tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("level", Text, nullable=False),
    Column("logger", Text, nullable=True),
    Column("data", JSONB, nullable=False),
    PrimaryKeyConstraint("task_id", "seq"),
)

maintenance = Table(
    "mcp_maintenance",
    metadata,
    Column("job", Text, primary_key=True),
    Column("last_run_at", DateTime(timezone=True), nullable=False),
    Column("last_count", BigInteger, nullable=False, server_default=text("0")),
)

principal_limits = Table(
    "mcp_principal_limits",
    metadata,
    Column("principal", Text, primary_key=True),
    Column("max_active_tasks", Integer, nullable=True),
    Column("creates_per_second", Float, nullable=True),
    Column("create_burst", Integer, nullable=True),
    Column("max_concurrent_requests", Integer, nullable=True),
    Column("max_waiting_inputs", Integer, nullable=True),
    Column("note", Text, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# Migration 0020: admins' overrides of tool concurrency limits (``'*'``: every group of the
# tool), and the audit of every limit change (principal and tool limits).
tool_limits = Table(
    "mcp_tool_limits",
    metadata,
    Column("tool_name", Text, nullable=False),
    Column("concurrency_group", Text, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("note", Text, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_by", Text, nullable=True),
    PrimaryKeyConstraint("tool_name", "concurrency_group"),
    CheckConstraint("concurrency >= 0", name="concurrency"),
)

limit_changes = Table(
    "mcp_limit_changes",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("actor", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("field", Text, nullable=False),
    Column("old_value", Text, nullable=True),
    Column("new_value", Text, nullable=True),
    PrimaryKeyConstraint("id"),
    Index("ix_mcp_limit_changes_changed_at", "changed_at"),
)

# Migration 0020: each principal's creates-per-second bucket, shared by every API replica.
principal_buckets = Table(
    "mcp_principal_buckets",
    metadata,
    Column("principal", Text, primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("stamp", DateTime(timezone=True), nullable=False),
)

# Migration 0020: requests in progress per principal on each API replica (shared every second).
api_load = Table(
    "mcp_api_load",
    metadata,
    Column("replica", Text, nullable=False),
    Column("principal", Text, nullable=False),
    Column("in_progress", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("replica", "principal"),
)

sessions = Table(
    "mcp_sessions",
    metadata,
    Column("session_id", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("protocol_version", Text, nullable=False),
    Column("client_capabilities", JSONB, nullable=False),
    Column("client_info", JSONB, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_used_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("log_level", Text, nullable=True),
    Index("ix_mcp_sessions_owner", "owner"),
    Index("ix_mcp_sessions_last_used_at", "last_used_at"),
)

# ---- durable steps and checkpoints (migration 0012) ---------------------------------------------

task_steps = Table(
    "mcp_task_steps",
    metadata,
    Column("task_id", Text, ForeignKey("mcp_tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", Text, nullable=False),
    Column("result", JSON, nullable=False),  # json, not jsonb: replayed exactly as written
    Column("size", Integer, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("task_id", "seq"),
    UniqueConstraint("task_id", "name"),
)

task_checkpoints = Table(
    "mcp_task_checkpoints",
    metadata,
    Column("task_id", Text, ForeignKey("mcp_tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("generation", Text, nullable=False),
    Column("storage", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("chunks", Integer, nullable=False),
    Column("path", Text, nullable=True),
    Column("saved_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("task_id", "name"),
    CheckConstraint("storage IN ('postgres', 'directory')", name="storage"),
)

task_checkpoint_chunks = Table(
    "mcp_task_checkpoint_chunks",
    metadata,
    Column("task_id", Text, ForeignKey("mcp_tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("generation", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("task_id", "name", "generation", "seq"),
)

# ---- the worker registry (migration 0013; its views: mcp_queue_demand there, mcp_workers_overview in 0015)

workers = Table(
    "mcp_workers",
    metadata,
    Column("node", Text, primary_key=True),
    Column("kind", Text, nullable=False, server_default=text("'worker'")),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("pids", ARRAY(Integer), nullable=False, server_default=text("'{}'")),
    Column("queues", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("slots", Integer, nullable=False, server_default=text("0")),
    Column("devices", JSONB, nullable=True),  # filled by GPU assignment (issue 29); null until then
    Column("version", Text, nullable=True),
    Column("pool", Text, nullable=True),
    Column("instance", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("kind IN ('worker', 'beat')", name="kind"),
)

# ---- spent MRTR request states (migration 0017) -------------------------------------------------

spent_request_states = Table(
    "mcp_spent_request_states",
    metadata,
    Column("digest", Text, primary_key=True),  # of the state's sealed nonce (protocol.sealing)
    Column("spent_by", Text, nullable=False),  # the spending request: its own retry is not a replay
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_mcp_spent_request_states_expires_at", "expires_at"),
)
"""A sealed ``requestState`` is usable once across every API replica: the round that advances
with it inserts its digest here; a replay finds the row. Rows go once the state has expired
(the collector), when ``open`` refuses the state anyway."""

# ---- artifacts: files a job publishes, read with resources/read (migrations 0021, 0022) --------

artifacts = Table(
    "mcp_task_artifacts",
    metadata,
    Column("artifact_id", Text, primary_key=True),
    Column("task_id", Text, ForeignKey("mcp_tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("owner", Text, nullable=False),  # the task's principal, copied: reads filter on it
    Column("name", Text, nullable=False),
    Column("mime_type", Text, nullable=False),
    Column("size", BigInteger, nullable=False, server_default=text("0")),
    Column("sha256", Text, nullable=True),  # set when complete
    Column("chunks", Integer, nullable=False, server_default=text("0")),
    Column("complete", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Where the bytes are: chunk rows, or a file under artifact_dir named by the id (0022).
    Column("storage", Text, nullable=False, server_default=text("'postgres'")),
    CheckConstraint("storage IN ('postgres', 'directory')", name="storage"),
    Index("ix_mcp_task_artifacts_owner_created_at", "owner", "created_at"),
    # The principal's stored bytes, summed for the quota without touching the heap (0022).
    Index("ix_mcp_task_artifacts_owner_size", "owner", postgresql_include=["size"]),
    Index("ix_mcp_task_artifacts_task_id", "task_id"),
    Index("ix_mcp_task_artifacts_incomplete", "created_at", postgresql_where=text("NOT complete")),
)

artifact_chunks = Table(
    "mcp_task_artifact_chunks",
    metadata,
    Column(
        "artifact_id",
        Text,
        ForeignKey("mcp_task_artifacts.artifact_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("seq", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("artifact_id", "seq"),
)

# ---- the admins' web console (migration 0023) -------------------------------------------------

console_actions = Table(
    "mcp_console_actions",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("acted_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("affected", Integer, nullable=False),
    Column("detail", JSONB, nullable=True),
    PrimaryKeyConstraint("id"),
    Index("ix_mcp_console_actions_acted_at", "acted_at"),  # migration 0025: the retention's order
)
"""Each console action: who (``admin:<name>``), when, what (``cancel``), its target (a job id)
and how many rows it changed."""

console_revocations = Table(
    "mcp_console_revocations",
    metadata,
    Column("subject", Text, nullable=False),
    Column("not_before", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_by", Text, nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("subject"),
    Index("ix_mcp_console_revocations_expires_at", "expires_at"),
)
"""Console sessions ended before their expiry (migration 0025): ``admin:<name>`` or ``*`` (every
session issued before ``not_before``), or ``session:<sha256 of its nonce>`` (one signed-out
session). Rows past ``expires_at`` no longer matter and are collected."""
