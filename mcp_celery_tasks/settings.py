"""One frozen Settings object, read from the environment (``MCP_TASKS_*``).

Every knob the server, the workers and beat share lives here, so that the API and the
workers always agree on queue names, timeouts and the database they talk to.
"""

from __future__ import annotations

import json
import os
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from mcp_celery_tasks.json_types import JSONValue

__all__ = ["API_ONLY_SECRETS", "Settings", "api_only_variables", "get_settings", "markdown_table"]

PREFIX = "MCP_TASKS_"
FenceMode = typing.Literal["off", "on", "auto"]
"""``lease_self_fence`` (``broker.fencing``)."""
_BOOLEAN_FENCE = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}

API_ONLY_SECRETS = (
    "secret_keys",
    "auth_tokens",
    "jwt_public_key",
    "metrics_token",
    "console_admin_tokens",
    "console_database_url",
)
"""Settings only the API process uses: workers, beat and admin commands never need them, so
``worker`` drops them from its environment (a tool could otherwise read them)."""


def api_only_variables(environ: typing.Mapping[str, str]) -> list[str]:
    """The variables of ``environ`` that carry an API-only secret (or name its file), sorted."""
    names = {f"{PREFIX}{name.upper()}" for name in API_ONLY_SECRETS}
    return sorted(k for k in environ if k in names or k.removesuffix("_FILE") in names)


class FileSecretsSource(PydanticBaseSettingsSource):
    """``MCP_TASKS_<NAME>_FILE=/run/secrets/x``: the setting's value is that file's content (the
    Docker and Kubernetes secrets convention), so no secret sits in a process environment.

    Setting both ``MCP_TASKS_<NAME>`` and ``MCP_TASKS_<NAME>_FILE`` is an error. A list setting
    may be a JSON list or one value per line; a mapping must be JSON.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every field at once

    def __call__(self) -> dict[str, JSONValue]:
        values: dict[str, JSONValue] = {}
        for name, field in self.settings_cls.model_fields.items():
            variable = f"{PREFIX}{name.upper()}"
            path = os.environ.get(f"{variable}_FILE")
            if path is None:
                continue
            if variable in os.environ:
                raise ValueError(f"both {variable} and {variable}_FILE are set; keep one")
            try:
                text = Path(path).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"{variable}_FILE: cannot read {path}: {exc.strerror or exc}") from None
            values[name] = _decode(text, field.annotation, f"{variable}_FILE")
        return values


def _decode(text: str, annotation: object, source: str) -> JSONValue:
    """A file's text as the setting's value: JSON for a list or a mapping, else the text."""
    origin = typing.get_origin(annotation)
    value: JSONValue
    if origin is list:
        if text.startswith("["):
            value = json.loads(text)
            return value
        return [line.strip() for line in text.splitlines() if line.strip()]
    if origin is dict:
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError(f"{source}: the file must hold a JSON object") from None
        return value
    return text


class Settings(BaseSettings):
    """Configuration shared by every process of a deployment."""

    model_config = SettingsConfigDict(
        env_prefix="MCP_TASKS_", frozen=True, extra="ignore", use_attribute_docstrings=True
    )

    database_url: str = "postgresql://postgres@127.0.0.1:5432/mcp_tasks"
    """Postgres DSN (libpq form). The task rows live here. A primary and its standby:
    ``postgresql://app@pg-a:5432,pg-b:5432/tasks?target_session_attrs=read-write`` (every
    process follows a promotion; docs/SCALING.md, "Failover to a standby")."""

    broker_url: str = "redis://127.0.0.1:6379/0"
    """Celery broker: ``redis://…`` or ``amqp://…``."""

    tool_modules: list[str] = Field(default_factory=list)
    """Python modules that define the tools (imported by the API and by workers), e.g.
    ``["myproject.tools"]``. Nothing is served by default: ``serve`` and tool workers refuse to
    start without one (``dev`` serves the examples in ``workers/``)."""

    celery_app: str | None = None
    """A team's own Celery app (``proj.celery:app``) to publish and run MCP jobs through, instead
    of one built from these settings; its module calls ``mcp_celery_tasks.worker.install(app)``."""

    host: str = "127.0.0.1"
    """Address the API binds (``serve``)."""
    port: int = 8000
    """Port the API listens on."""
    allow_insecure_bind: bool = False
    """Allow a non-loopback bind address while auth is off."""

    auth_tokens: dict[str, str] = Field(default_factory=dict)
    """Static bearer tokens, ``{"name": "token"}``; the principal is ``token:<name>``. Empty: auth off."""

    jwt_issuer: str | None = None
    """OAuth 2.1 resource-server mode: accept JWT access tokens from this issuer (``iss``);
    the principal is ``jwt:<issuer>#<sub>``. Static tokens keep working beside it."""
    jwt_audience: str | None = None
    """Required ``aud`` of access tokens (this server's resource identifier)."""
    jwt_jwks_url: str | None = None
    """Where the issuer publishes its signing keys (JWKS)."""
    jwt_public_key: str | None = None
    """A PEM public key (or an HMAC secret for HS* algorithms) instead of a JWKS URL."""
    jwt_algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"])
    """Signature algorithms accepted for access tokens."""
    jwt_required_scopes: list[str] = Field(default_factory=list)
    """OAuth scopes every JWT must carry (its ``scope`` or ``scp`` claim), named in the 401
    challenge's ``scope`` and in ``scopes_supported``; a tool's own ``scopes`` come on top."""
    resource_url: str | None = None
    """This server's public URL (its resource identifier), announced in the protected-resource
    metadata document and its challenges. In JWT mode it, or a URL ``jwt_audience``, is required:
    the metadata never follows the request's Host header."""

    allowed_origins: list[str] = Field(default_factory=list)
    """Origins accepted besides loopback ones. Requests without an Origin header are accepted."""

    server_name: str = "mcp-celery-tasks"
    """Reported in every result's ``_meta`` serverInfo."""

    default_queue: str = "mcp.default"
    """Celery queue of tools that name none."""
    maintenance_queue: str = "mcp.maintenance"
    """Celery queue of the beat jobs (GC, sweeper); give it its own small worker."""

    retention_ms: int = 3_600_000
    """How long a finished task stays readable (its TTL after it ends)."""
    max_retention_ms: int = 7 * 24 * 3_600_000
    """Upper bound of any tool's retention (a null TTL is capped here)."""
    poll_interval_ms: int = 1000
    """``pollIntervalMs`` suggested to clients, unless the tool sets its own."""

    cancel_grace_seconds: float = 5.0
    """A cancelled job still running this long after the cancel has its process killed (prefork
    workers; the pool replaces the process). The task stays ``cancelled``."""
    tool_time_limit_seconds: float = 6 * 3600.0
    """Hard wall-clock limit of one run of a tool (``@tool(time_limit=…)`` overrides); time
    waiting for input does not count. Past it the task ends with ``isError`` and the process is
    killed. 0: none."""
    tool_soft_time_limit_seconds: float | None = None
    """Soft limit: ``SoftTimeLimitExceeded`` is raised inside the tool (``soft_time_limit``)."""
    tool_memory_limit_mb: int = 8192
    """Most resident memory a job's process may use (``@tool(memory_limit_mb=…)``); above it the
    task ends with ``isError`` and the process is killed. 0: none."""
    tool_isolation: typing.Literal["none", "process"] = "none"
    """``process``: every tool on this worker runs its body in a fresh process that holds no
    database or broker credentials (as ``@tool(isolation="process")`` does for one tool)."""
    watchdog_interval_seconds: float = 1.0
    """How often a prefork worker's main process renews leases and checks limits and cancels."""
    worker_max_tasks_per_child: int | None = None
    """Celery's ``worker_max_tasks_per_child``: a pool process is replaced after this many jobs."""
    worker_max_memory_per_child_mb: int | None = None
    """Celery's ``worker_max_memory_per_child`` (checked after each job): a pool process above
    it is replaced once its job ends."""
    worker_gpus: str | None = None
    """A GPU worker: ``auto`` (the devices NVML or ``nvidia-smi`` lists, or ``CUDA_VISIBLE_DEVICES``)
    or device ids such as ``0,1,2,3`` (``worker --gpus``). Each prefork pool child is pinned to one
    device (its ``CUDA_VISIBLE_DEVICES``), and the concurrency is devices x slots per device."""
    worker_slots_per_gpu: int = 1
    """Pool children that share one device on a GPU worker (``worker --slots-per-gpu``)."""
    worker_gpu_max_tasks_per_child: int = Field(default=1, ge=0)
    """A GPU worker replaces its pool child after this many jobs (unless
    ``worker_max_tasks_per_child`` says otherwise), so device memory a job left behind (caching
    allocators, leaked tensors) goes back to the device: 1 recycles after every job. 0: never."""
    tool_gpu_memory_limit_mb: int | None = None
    """Most device memory a job's process may hold on its GPU (``@tool(gpu_memory_limit_mb=…)``),
    measured through NVML when ``pynvml`` is installed; above it the task ends with ``isError``
    and the process is killed. None or 0: none."""

    lease_seconds: float = 30.0
    """A worker holds a task for this long without renewing it before another may take over."""
    lease_self_fence: FenceMode = "auto"
    """``off | on | auto`` (``true``/``false``: on/off). A prefork worker that could not renew a
    job's lease for a lease less one watchdog interval (Postgres is out of its reach) kills the
    job's process before the lease can lapse (``on``), so a worker taking the job over never runs
    beside it; or only while it still hears the maintenance worker's "Postgres answers" beacon,
    i.e. it alone is cut off (``auto``; give the maintenance worker the same value); or never
    (``off``). In an outage of Postgres itself nobody can take a job over: there ``on`` stops
    every job for nothing (an attempt each), ``auto`` (the default) and ``off`` let them run on."""
    max_attempts: int = 3
    """Runs of one job before the task fails. A run counts when the tool failed or its process
    died without giving the job back (a crash, an OOM kill); a run the worker gave back (a
    shutdown or restart, a broker or database outage) does not (see ``max_redeliveries``)."""
    max_redeliveries: int = 50
    """Times a job may be given back by its worker (deploys, restarts, outages) before the task
    fails: a separate cap from ``max_attempts``, so rolling restarts never fail a task waiting for
    a human, yet a job is not passed around forever."""
    retry_max_delay_seconds: float = Field(default=3600.0, gt=0, le=86_400)
    """The longest wait before a retry (``@tool(retry_on=…, backoff=…)``: longer delays of a
    policy are cut to it; ``ctx.retry_later`` asking for more is a tool error). The job waits in
    the backlog meanwhile, holding no worker slot and no broker message."""
    outage_budget_seconds: float = 120.0
    """A running job rides out a database or broker outage this long (its reports, input waits
    and writes are retried with backoff; tool code never sees the error). Past it the job ends
    ``failed`` with error kind ``infrastructure``."""

    max_body_bytes: int = 1_048_576
    """Largest request body accepted (HTTP 413 above)."""
    max_arguments_bytes: int = 262_144
    """Largest ``arguments`` object of a tools/call (as JSON); larger calls get -32602."""
    max_outstanding_inputs: int = 16
    """Most input requests one task may have outstanding at once."""
    max_subscriptions_per_principal: int = 32
    """Most open ``subscriptions/listen`` streams per principal and API process."""
    max_sync_waits_per_principal: int = 32
    """Synchronous ``tools/call`` requests one principal may have waiting for their tool at once
    per API process; one more is refused (HTTP 429, ``Retry-After``) before its task is created.
    0: no limit."""
    max_open_streams_per_principal: int = 32
    """SSE responses one principal may hold open at once per API process:
    ``subscriptions/listen`` streams and synchronous calls relayed on a stream (progress, logs,
    2025-11-25 input requests); one more is refused like a wait. 0: no limit."""

    max_active_tasks_per_principal: int = 1000
    """Most tasks one principal may have working or waiting for input at once (queued ones
    included); a create above it gets -32001 naming the limit. 0: no limit. Per-principal
    overrides: ``mcp-celery-tasks tasks limits``."""
    creates_per_second_per_principal: float = 20.0
    """Sustained tasks one principal may create per second across every API replica (a token
    bucket in Postgres, taken by the create itself, behind one per process; -32001 with
    ``retryAfterMs`` above it). 0: no limit."""
    create_burst_per_principal: int = 100
    """How many creates a principal may make at once before the per-second rate applies."""
    max_waiting_inputs_per_principal: int = 4
    """Jobs of one principal that may wait for input in one queue before its other jobs of that
    queue stop being dispatched (until one is answered, times out or is cancelled): unanswered
    questions cannot hold every worker slot. Jobs already handed to the broker may still ask, so
    a principal holds at most this plus ``dispatch_ahead`` waiting jobs per queue. 0: no limit.
    Per-principal overrides: ``mcp-celery-tasks tasks limits``."""
    max_concurrent_requests_per_principal: int = 128
    """Requests one principal may have in progress at once across every API replica (each counts
    its own plus what the others reported a second ago; HTTP 429 above; waiting for a synchronous
    result is not counted). 0: no limit."""
    max_inflight_body_bytes: int = 64 * 1_048_576
    """Bytes of large request bodies (over 64 KiB) one API process reads and parses at once;
    more wait their turn (HTTP 503 after 10 s). Small requests never wait."""
    max_inflight_body_bytes_per_principal: int = 16 * 1_048_576
    """The share of ``max_inflight_body_bytes`` one principal may hold at once (unauthenticated
    callers: one client address), so one slow sender cannot take the whole budget."""
    body_read_timeout_seconds: float = 30.0
    """A request body must arrive whole within this long after its head (HTTP 408 otherwise):
    a trickling body holds its share of the budget no longer than this."""
    max_header_count: int = 100
    """Most header lines one request head may carry (HTTP 431 above), checked before anything
    else runs."""
    max_header_bytes: int = 65_536
    """Largest request head (request line and headers) in bytes (HTTP 431 above)."""
    max_json_containers: int = 20_000
    """Most JSON objects and arrays one request body may hold: bounds the memory and time of
    parsing it (a 1 MB body of ``[{},{},…]`` would be 200,000 Python dicts)."""
    request_head_timeout_seconds: float = 10.0
    """A connection must send a complete request head within this long (slow-loris)."""
    max_connections: int = 4096
    """Open HTTP connections per API process; more are closed at once (HTTP 503 is not
    possible before a request). Keep it below the process's file-descriptor limit."""
    max_connections_per_client: int = 512
    """Open connections per client IP address per API process (loopback included). A peer in
    ``trusted_proxies`` is not capped itself: its requests in progress are, per forwarded
    client address."""
    trusted_proxies: list[str] = Field(default_factory=list)
    """Reverse proxies (addresses or CIDRs, e.g. ``["10.0.0.0/8"]``) whose ``forwarded_header``
    names the real client; from any other peer the header is ignored. Empty: trust none."""
    forwarded_header: typing.Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    """Which header a trusted proxy writes the client address to (``X-Forwarded-For`` as nginx
    sets it, or RFC 7239 ``Forwarded``); only this one is read, so a client cannot pass the
    other one through the proxy to choose its address."""
    session_idle_seconds: float = 3600.0
    """A 2025-11-25 session unused this long expires (its client initializes again)."""
    session_max_age_seconds: float = 7 * 86_400.0
    """A 2025-11-25 session expires this long after initialize, used or not."""
    max_sessions_per_principal: int = 100
    """Live 2025-11-25 sessions one principal may hold; initialize above it gets -32001."""
    max_client_info_bytes: int = 16_384
    """Largest ``capabilities`` plus ``clientInfo`` an initialize may declare (as JSON)."""
    max_result_bytes: int = 4_194_304
    """Largest tool result kept in the task row once large blocks became artifacts
    (``inline_result_bytes``); a result still above it ends with ``isError``."""
    inline_result_bytes: int = Field(default=262_144, ge=1024)
    """A result larger than this (as JSON) has its large text, blob and embedded-resource blocks
    stored as artifacts, each replaced by a ``resource_link`` and a short preview."""
    max_artifact_bytes: int = Field(default=1 << 30, ge=1)
    """Largest artifact; an upload that grows past it stops with ``isError`` and is removed."""
    artifact_quota_bytes: int = Field(default=10 << 30, ge=0)
    """Artifact bytes one principal may keep stored (counted as uploads go); 0: no quota."""
    artifact_dir: str | None = None
    """Keep artifact bytes as files under this directory, shared by the workers, the API and the
    maintenance worker (named by artifact id only). Unset: in Postgres, 1 MiB chunks."""
    max_status_message_chars: int = 1024
    """``statusMessage`` is cut to this length."""
    max_step_result_bytes: int = 1_048_576
    """Largest result of one durable step (``ctx.step``, as JSON); above it the step fails with a
    ``StepResultError`` and nothing is recorded."""
    max_checkpoint_bytes: int = 268_435_456
    """Largest checkpoint (``ctx.checkpoint.save``); above it the save fails with
    ``CheckpointTooLarge`` and the previous checkpoint stays."""
    checkpoint_dir: str | None = None
    """Keep checkpoints as files under this directory (``<dir>/<job_id>/``), which every worker
    and the maintenance worker must share; their size and digest stay in Postgres. Unset:
    checkpoints are stored in Postgres, in 1 MiB chunks."""

    max_sync_wait_seconds: float = 300.0
    """A synchronous tools/call waits this long for its job before the task is cancelled."""
    sse_keepalive_seconds: float = 15.0
    """Comment sent on a waiting SSE response so proxies keep it open."""

    publish_deadline_seconds: float = 5.0
    """A job not published within this long is left to the sweeper (the outbox)."""
    breaker_failures: int = 5
    """Consecutive broker failures that open the publisher's circuit breaker."""
    breaker_reset_seconds: float = 10.0
    """How long the breaker stays open before trying again."""

    db_pool_min: int = 2
    """Connections each API process keeps open."""
    db_pool_max: int = 10
    """Most connections one API process opens (see the connection budget)."""
    db_connect_timeout_seconds: float = 5.0
    """Bound on connecting to Postgres (and on an API request's wait for its turn at the pool
    while every connection is busy)."""
    db_unavailable_after_seconds: float = Field(default=0.5, gt=0)
    """An API request that has its turn at the pool but gets no connection within this long
    (Postgres is down, restarting or out of reach: a healthy pool hands one out at once or
    opens one in milliseconds) is answered HTTP 503 ``Retry-After`` with a JSON-RPC error that
    says so (``data.retryAfterMs``), instead of hanging the whole connect bound."""
    db_statement_timeout_ms: int = 10_000
    """Postgres ``statement_timeout`` for every connection of ours (sent at connect; through a
    transaction pooler set it on the role instead: ``ALTER ROLE … SET statement_timeout``)."""
    db_tcp_user_timeout_ms: int = Field(default=3_000, ge=0)
    """libpq ``tcp_user_timeout``: a connection whose sent data stays unacknowledged this long
    is dropped (0: the kernel's default, about 15 minutes of retransmissions). A network path
    that dies silently (a cut link, a partition: no RST ever comes) then fails the statement
    within this bound instead of hanging the worker or API request for minutes."""
    db_keepalives_idle_seconds: int = Field(default=5, ge=1)
    """libpq ``keepalives_idle``: an idle connection (also one waiting for a long statement's
    answer) is probed after this long, so a dead path shows even when nothing is being sent."""
    db_keepalives_interval_seconds: int = Field(default=2, ge=1)
    """libpq ``keepalives_interval``: between unanswered keepalive probes."""
    db_keepalives_count: int = Field(default=3, ge=1)
    """libpq ``keepalives_count``: unanswered probes before the connection is dropped (idle +
    interval * count, 11 s, bounds how long a silent cut goes unnoticed; with a
    ``tcp_user_timeout`` the kernel drops it at the first probe past that bound: about 7 s)."""
    db_transaction_pooler: bool = False
    """``database_url`` goes through a pooler in transaction mode (PgBouncer
    ``pool_mode=transaction``): statements are never prepared and no startup ``options`` are
    sent. Needs ``direct_database_url`` for what must keep a session."""
    direct_database_url: str | None = None
    """A Postgres DSN that bypasses the pooler, for what needs a session of its own: the API's
    ``LISTEN`` connection (task events) and migrations. Default: ``database_url``."""

    report_min_interval_seconds: float = 0.25
    """A tool's ``ctx.report`` writes at most this often; the last message always lands."""
    cancel_check_interval_seconds: float = 0.2
    """``ctx.cancelled`` reads the row at most this often."""

    input_timeout_seconds: float = 1500.0
    """How long a tool waits *resident* (holding its worker slot) for an answer to an input
    request (per-tool ``input_timeout`` overrides). Must stay below the broker's redelivery limit
    (see below), unless the tool suspends sooner (``suspend_after_seconds``)."""
    suspend_after_seconds: float | None = 30.0
    """A job waiting this long for input gives its worker slot back (suspends): the Celery message
    is acknowledged, the lease released, and the tool runs again from the top once the answers
    are in (recorded answers and ``ctx.step`` results replay at once). It suspends at once when
    other jobs of its queue wait for a slot. 0: always at once; unset (``None``, in the
    environment an empty value): stay resident. Per-tool ``@tool(suspend_after=…)`` overrides."""
    suspended_input_timeout_seconds: float = 7 * 86400.0
    """How long a suspended task waits for its answers before the sweeper ends it with a tool
    error (no broker limit applies: nothing is held while it waits)."""
    max_suspended_per_principal: int = 1000
    """Suspended tasks one principal may have stored at once (they hold no slot, only rows). A job
    that would suspend past it stays resident, where ``max_waiting_inputs_per_principal``
    applies. 0: no limit."""
    strict_input_capabilities: bool = True
    """Refuse input requests of a kind the originating tools/call did not declare (the MRTR
    rule). Off: the tasks extension alone counts as consent, as in the C# SDK."""
    rabbitmq_consumer_timeout_seconds: float = 1800.0
    """RabbitMQ's ``consumer_timeout`` (30 min unless raised in rabbitmq.conf)."""

    sync_input_timeout_seconds: float = 120.0
    """A synchronous call whose tool asks for input waits this long for the client's retry
    (MRTR) before the question times out, so no worker stays blocked for a client that left."""
    secret_keys: list[str] = Field(default_factory=list)
    """Keys (URL-safe base64, 32 bytes) that seal MRTR ``requestState``, newest first. Every API
    replica needs the same list; without one each process makes its own."""
    request_state_ttl_seconds: float = 600.0
    """How long an MRTR ``requestState`` stays valid."""

    max_subscription_task_ids: int = 100
    """Most taskIds one ``subscriptions/listen`` may watch."""
    push_recheck_seconds: float = 0.25
    """The event hub re-reads every subscribed task this often, in one query per API process
    (statusMessage changes send no NOTIFY)."""

    metrics_enabled: bool = True
    """The API serves ``/metrics`` and times every request; off, ``/metrics`` is not found and
    requests are only logged (measured cost: a few µs per request)."""
    metrics_token: str | None = None
    """Bearer token that reads ``/metrics`` from anywhere. Unset, ``/metrics`` answers only
    clients on a loopback address (behind a trusted proxy: the forwarded client), 403 to others."""
    console_enabled: bool = False
    """Serve the admins' web console at ``/console`` of the API (``docs/console/``). Not needed by
    ``mcp-celery-tasks console`` (the console alone, on its own port) nor ``mount(console=…)``."""
    console_admin_tokens: dict[str, str] = Field(default_factory=dict)
    """Console admins, ``{"name": "<sha256 hex of the token>"}`` (only hashes: ``python -c
    "import hashlib;print(hashlib.sha256(b'TOKEN').hexdigest())"``); the actor is ``admin:<name>``.
    A tool caller's token never opens the console."""
    console_database_url: str | None = None
    """A Postgres DSN of an ``mcp_tasks_admin`` login (``migrate --roles``), used by the console
    alone for its admin writes: principal and tool limits and its audit rows. Unset, they go
    through ``database_url``, which under the least-privilege roles may not write limits (the
    limits page then refuses and names the CLI). A secret: workers never get it."""
    worker_metrics_port: int | None = None
    """Port where a worker serves its (prefork-merged) Prometheus metrics; off when unset."""

    trace_file: str | None = None
    """Append OpenTelemetry spans as JSON lines to this file (needs opentelemetry-sdk)."""
    otlp_endpoint: str | None = None
    """Export OpenTelemetry spans over OTLP/HTTP to this endpoint."""

    gc_interval_seconds: float = 60.0
    """How often beat collects expired tasks."""
    gc_alarm_intervals: int = 3
    """Log an error when the collector has not run for this many intervals."""
    console_audit_retention_seconds: float = Field(default=90 * 86_400.0, ge=0)
    """The collector deletes console audit rows (``mcp_console_actions``) older than this, in
    batches with the expired tasks; 0 keeps them forever. Console sign-outs are collected once
    the sessions they refuse have expired, whatever this says."""
    sweep_interval_seconds: float = 15.0
    """How often beat runs the sweeper (outbox and lost leases)."""
    dispatch_ahead: int = 4
    """Fair dispatch: jobs of one queue handed to the broker ahead of the workers (published, not
    yet started), at least. The rest of the queue's backlog waits in Postgres and is released
    round-robin by principal as workers start jobs, so another principal's job waits about one
    job's run time per worker slot plus the jobs ahead of it in the broker. Set it near the
    number of worker slots that consume the queue: lower is fairer, higher keeps fast workers
    busier."""
    dispatch_ahead_seconds: float = 0.1
    """A queue whose workers run many short jobs gets more than ``dispatch_ahead`` in the broker:
    about this many seconds of its work, from the rate its jobs were published at in the last
    second (at most 64). A flood of tiny jobs keeps every worker busy; a queue of long jobs
    keeps ``dispatch_ahead``. Another principal's job then waits at most about this long plus
    one job per slot. A queue that mixes tiny and long jobs can, right after a flood of tiny
    ones, hand out that larger window of long ones: give long tools a queue of their own
    (``@tool(queue=...)``), or set 0 there. 0: always ``dispatch_ahead``."""
    undispatched_after_seconds: float = 30.0
    """The sweeper also runs the fair publisher's pass for every queue, and re-publishes jobs the
    API marked published this long ago without a worker starting them and without the broker
    holding them (a crash between marking and publishing)."""
    undispatched_fail_after_seconds: float = 900.0
    """A job still in the backlog after the broker was unreachable for this long (as the
    publishers and the sweeper saw it) fails its task with a clear error. Waiting in the fair
    backlog alone never fails a task: the active-tasks quota bounds the backlog."""
    finish_retry_seconds: float = 120.0
    """A worker keeps trying to record a finished job's outcome this long (a database failover)
    before the job is retried from scratch."""
    republish_unstarted_after_seconds: float = 1800.0
    """Only when the broker cannot say how many messages a queue holds: a job published this
    long ago that no worker has started is published again (once per this period)."""
    republish_idle_queue_after_seconds: float = 20.0
    """Lost broker messages: when a queue holds fewer messages than its published jobs no worker
    has started (at most ``dispatch_ahead`` plus redeliveries, thanks to fair dispatch), the
    missing ones are published again once they are this old, oldest first, each at most once
    per this period (a broker that lost its data, or a worker that lost its connection before
    starting the job: on Redis such a message is gone, or with ``redis_ack_emulation`` kept
    aside until its visibility timeout). A duplicate is a no-op at the claim."""
    lease_grace_seconds: float = 5.0
    """The sweeper re-publishes an active task whose lease ran out this long ago."""

    redis_ack_emulation: bool = False
    """kombu's acknowledgement emulation on Redis: each delivered job is also written to an
    ``unacked`` hash and sorted set and removed at the ack, and comes back after
    ``redis_visibility_timeout_seconds`` if never acked. Off by default: a job lives in Postgres,
    and the sweeper already brings back the jobs of a worker that died (its leases lapse, or its
    queue holds fewer messages than the jobs nobody started), so that bookkeeping cost a worker
    a third of its main-process CPU per short job and bought only a late duplicate (measured:
    1.63 -> 1.27 ms of worker CPU per noop job, ``tests/bench/worker_drain.py``). A graceful
    stop still hands back the jobs it holds; a job whose child was killed is still requeued."""
    redis_tcp_user_timeout_ms: int = Field(default=3_000, ge=0)
    """Every TCP connection to Redis is bounded like those to Postgres (issue 28): keepalives
    after 5 s idle (then 3 probes 2 s apart) and ``TCP_USER_TIMEOUT`` this long, so a path that
    dies silently (a cut link: no reset) drops the connection within seconds and kombu connects
    again. Without them a consumer's BRPOP on a dead connection was measured to wait minutes
    after the path healed (kombu's own check runs only with its event loop). 0: off."""
    redis_visibility_timeout_seconds: int = 43_200
    """With ``redis_ack_emulation`` on: Redis redelivers an unacknowledged job after this; keep
    it above the longest job, input waits included."""
    worker_task_events: bool = False
    """Workers send Celery task events from the start (``celery worker -E``). Flower turns them
    on by itself while it runs; always on, they took half of a worker's main-process CPU per
    short job (py-spy)."""
    worker_soft_shutdown_seconds: float = 20.0
    """On a cold shutdown running jobs get this long before they are requeued; keep it below
    the stop grace period of your process manager."""
    worker_heartbeat_seconds: float = Field(default=10.0, gt=0)
    """How often a worker's main process refreshes its row in the worker registry
    (``mcp_workers``: node, queues, slots, devices, version)."""
    worker_heartbeat_timeout_seconds: float = Field(default=60.0, gt=0)
    """A worker whose heartbeat is this old counts as dead: it leaves ``tasks workers`` and the
    slots of ``mcp_queue_demand``. Keep it a few heartbeats long."""
    demand_interval_seconds: float = Field(default=15.0, ge=0)
    """How often each API process reads ``mcp_queue_demand`` into the ``mcp_queue_*`` gauges (one
    query per interval, not per scrape); 0: no demand gauges."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, FileSecretsSource(settings_cls), dotenv_settings)

    @field_validator("database_url", "direct_database_url", "console_database_url")
    @classmethod
    def _libpq_form(cls, value: str | None) -> str | None:
        # Accept the SQLAlchemy spelling too; psycopg wants plain libpq URLs.
        for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
            if value is not None and value.startswith(prefix):
                return "postgresql://" + value[len(prefix) :]
        return value

    @field_validator("lease_self_fence", mode="before")
    @classmethod
    def _fence_mode(cls, value: object) -> object:
        # The boolean spellings it had before ``auto`` (true/false, 1/0, yes/no) mean on/off.
        spelled = str(value).strip().lower()
        return _BOOLEAN_FENCE.get(spelled, spelled)

    @field_validator("suspend_after_seconds", mode="before")
    @classmethod
    def _never_suspend(cls, value: object) -> object:
        # In the environment, "stay resident" is spelled as an empty value (or none / never).
        if isinstance(value, str):
            if value.strip().lower() in ("", "none", "never"):
                return None
            try:
                value = float(value)
            except ValueError:
                raise ValueError("suspend_after_seconds must be seconds (or empty: never suspend)") from None
        if isinstance(value, int | float) and not isinstance(value, bool) and not value >= 0:
            raise ValueError("suspend_after_seconds must be >= 0 (or empty: never suspend)")
        return value

    @model_validator(mode="after")
    def _session_for_listen(self) -> Settings:
        # LISTEN through a transaction pooler "works" and then loses every notification (the
        # server connection goes back to the pool after the LISTEN's own transaction).
        if self.db_transaction_pooler and not self.direct_database_url:
            raise ValueError(
                "MCP_TASKS_DB_TRANSACTION_POOLER needs MCP_TASKS_DIRECT_DATABASE_URL: a DSN that "
                "bypasses the pooler, for LISTEN and migrations"
            )
        return self

    @property
    def session_database_url(self) -> str:
        """Where a connection that needs its own session goes (LISTEN, migrations)."""
        return self.direct_database_url or self.database_url

    @property
    def sqlalchemy_url(self) -> str:
        """``session_database_url`` for SQLAlchemy (migrations), multi-host DSNs included."""
        return _sqlalchemy_form(self.session_database_url)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens) or self.jwt_issuer is not None


def _sqlalchemy_form(url: str) -> str:
    """The libpq URL in SQLAlchemy's spelling. A multi-host URL (``host1:5432,host2:5432``, a
    primary and its standby, picked by ``target_session_attrs``) is valid libpq but not a URL
    SQLAlchemy parses (its port must be one number): its hosts move to ``?host=h:p&host=h:p``,
    the form SQLAlchemy's psycopg dialect turns back into libpq's."""
    rest = url.removeprefix("postgresql://")
    netloc, _, tail = rest.partition("/")
    user, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return "postgresql+psycopg://" + rest
    path, _, query = tail.partition("?")
    params = "&".join(f"host={quote(host, safe='[]')}" for host in hosts.split(",") if host)
    query = f"{params}&{query}" if query else params
    return f"postgresql+psycopg://{user}{at}/{path}?{query}"


def markdown_table() -> str:
    """The configuration table of the README, generated from the fields above."""
    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        shown = json.dumps(default) if isinstance(default, list | dict | bool) else str(default)
        meaning = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `MCP_TASKS_{name.upper()}` | `{shown}` | {meaning} |")
    return "\n".join(lines)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
