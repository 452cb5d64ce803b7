"""The task service: create, view, wait for, answer and cancel tasks, once for every protocol era.

The 2026-07-28 and 2025-11-25 modules (``modern``, ``legacy``) and ``push`` are adapters over it:
each maps a task to its own wire shape, and nothing else. No HTTP and no Celery here: jobs reach
the broker through a ``Publisher`` (the API's publisher thread), and changes arrive through the
``TaskEvents`` hub (LISTEN/NOTIFY plus a light re-read), so a waiter never polls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NotRequired, Protocol, TypedDict

from mcp_celery_tasks.errors import (
    InfrastructureError,
    InvalidParams,
    MissingCapability,
    QuotaExceeded,
    ServiceUnavailable,
)
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.lifecycle import INPUT_REQUIRED, WORKING
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import (
    ApiStore,
    CancelOutcome,
    InputRecord,
    LogRecord,
    NewTask,
    SessionRecord,
    TaskRecord,
)
from mcp_celery_tasks.tasks import idempotency
from mcp_celery_tasks.tasks.events import TaskEvents
from mcp_celery_tasks.tasks.quotas import Limits, Quotas
from mcp_celery_tasks.telemetry import metrics, tracing
from mcp_celery_tasks.tools.concurrency import waiting_message
from mcp_celery_tasks.tools.inputs import validate_response
from mcp_celery_tasks.tools.registry import ToolSpec, get_tool
from mcp_celery_tasks.wire import PLACE_IN_LINE, RequestMeta, declares_tasks

__all__ = [
    "UNKNOWN_TASK",
    "InputRequest",
    "Publisher",
    "RequestContext",
    "TaskService",
    "TaskView",
    "new_task_id",
]

UNKNOWN_TASK = "Failed to retrieve task: Task not found"
ORPHAN_CANCEL_S = 300.0
"""How long the API keeps trying to cancel a task a failed synchronous call may have created."""

logger = logging.getLogger("mcp_celery_tasks.api")
"""The one answer for unknown and foreign tasks alike, so a task's existence never leaks."""


class Publisher(Protocol):
    """The broker operations of the API (one thread, never on the event loop)."""

    def publish_job(self, job_id: str, queue_name: str, headers: dict[str, str] | None = None) -> None: ...
    def wake(self, inbox: str, job_id: str) -> None: ...
    def revoke(self, job_id: str) -> None: ...
    def check_broker(self) -> concurrent.futures.Future[bool]: ...


@dataclass(frozen=True)
class RequestContext:
    """Who asks, with which per-request envelope (2026-07-28 ``_meta``, or what a 2025-11-25
    session declared at initialize), and the JSON-RPC id of the request."""

    principal: str
    meta: RequestMeta | None
    request_id: Any = None
    session_id: str | None = None
    accepts_sse: bool = True
    """The client accepts an SSE response (2025-11-25 calls relay input requests on it)."""
    scopes: frozenset[str] | None = None
    """The OAuth scopes of the caller's JWT; None: not scope-limited (``api.auth.Identity``)."""

    @property
    def declares_tasks(self) -> bool:
        return self.meta is not None and declares_tasks(self.meta.client_capabilities)

    def require_tasks(self) -> None:
        """SEP-2663: tasks/* (and taskIds on a subscription) from a non-declaring request -> -32021."""
        if not self.declares_tasks:
            raise MissingCapability()


class InputRequest(TypedDict):
    """One entry of ``inputRequests``: the request to the client (``roots/list`` may have no
    params)."""

    method: str
    params: NotRequired[Mapping[str, object]]


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task as every protocol shows it: the row, plus its outstanding input requests (only
    loaded while it is ``input_required``)."""

    record: TaskRecord
    inputs: tuple[InputRecord, ...] = ()

    @property
    def input_requests(self) -> dict[str, InputRequest]:
        """``inputRequests``: key -> ``{method, params}`` (``roots/list`` may have no params)."""
        return {item.key: _input_entry(item) for item in self.inputs}


def _input_entry(item: InputRecord) -> InputRequest:
    if item.params is None:
        return {"method": item.method}
    return {"method": item.method, "params": item.params}


def new_task_id() -> str:
    """192 bits from ``secrets``, URL-safe (never of the ``=?base64?`` form: no ``=`` or ``?``)."""
    return secrets.token_urlsafe(24)


class TaskService:
    """Every operation on tasks the API performs, whatever the protocol era."""

    def __init__(
        self,
        settings: Settings,
        store: ApiStore,
        events: TaskEvents,
        publisher: Publisher,
        default_queue: str,
        quotas: Quotas | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._events = events
        self._publisher = publisher
        self._default_queue = default_queue
        self._background: set[asyncio.Task[None]] = set()
        self.quotas = quotas if quotas is not None else Quotas(settings, store)

    # ---- create and read -------------------------------------------------------------------

    async def create(
        self,
        ctx: RequestContext,
        spec: ToolSpec,
        arguments: Mapping[str, object],
        *,
        as_task: bool,
        preflight: Mapping[str, object] | None = None,
        retention_ms: int | None = None,
        log_level: str | None = None,
        idempotency_key: str | None = None,
        status_message: str | None = None,
    ) -> TaskRecord:
        """Commit the task row, then hand its job to the publisher. The principal's quotas
        (creations per second, active tasks) may refuse it first (``QuotaExceeded``).

        With an ``idempotency_key``, the principal's live task made under that key is returned
        as it is (its creation token given back, nothing published), and -32602 if it was asked
        for another tool or other arguments (``tasks.idempotency``). One statement reads and
        inserts, so a keyed create costs the same round trips as any other. ``status_message``:
        the new task's first statusMessage (the console's retries say whose retry they are)."""
        settings = self._settings
        digest = None if idempotency_key is None else idempotency.request_digest(spec.name, arguments)
        limits = await self.quotas.limits(ctx.principal)
        try:
            self.quotas.take_create(ctx.principal, limits)
        except QuotaExceeded:
            # A retry is no new creation: out of tokens, it still finds its task.
            found = (
                None
                if idempotency_key is None
                else await self._store.task_by_key(ctx.principal, idempotency_key)
            )
            if found is None or digest is None:
                raise
            return self._replayed(found, spec, digest, as_task)
        if retention_ms is None:
            retention_ms = (
                int(spec.retention_seconds * 1000) if spec.retention_seconds else settings.retention_ms
            )
        task_id = new_task_id()
        new = self._new_task(ctx, spec, arguments, task_id, retention_ms, as_task, preflight, log_level)
        new = dataclasses.replace(
            new, idempotency_key=idempotency_key, request_digest=digest, status_message=status_message
        )
        try:
            record = await self._store.create_task(
                new,
                max_active=limits.max_active_tasks or None,
                rate=max(0.0, limits.creates_per_second),
                burst=limits.create_burst,
            )
        except InfrastructureError as exc:
            if not exc.maybe_applied:
                raise
            raise self._maybe_created(task_id, ctx.principal, as_task, idempotency_key) from exc
        if record is None:
            raise await self._refused(ctx.principal, limits)
        if digest is not None and record.task_id != task_id:  # the key's task, made before
            self.quotas.give_back(ctx.principal, limits)
            return self._replayed(record, spec, digest, as_task)
        # The row is committed (autocommit): a tasks/get for this id resolves from here on
        # (SEP-2663 S-12). Publishing happens off the loop; the sweeper covers a crash here.
        self._publisher.publish_job(record.job_id, record.queue, tracing.inject())
        self._events.announce_created()
        metrics.tasks_created.labels(spec.name, "task" if as_task else "sync").inc()
        return record

    async def _refused(self, principal: str, limits: Limits) -> QuotaExceeded:
        """Which quota refused a create that made no row: the creates-per-second bucket every API
        replica shares (this process's own bucket is only a first line), or the active tasks."""
        rate = limits.creates_per_second
        wait = await self._store.bucket_wait(principal, rate, limits.create_burst) if rate > 0 else None
        if wait is not None and (wait > 0 or not limits.max_active_tasks):
            return self.quotas.rate_exceeded(limits, max(wait, 0.01), across_replicas=True)
        return self.quotas.active_exceeded(limits)

    @staticmethod
    def _replayed(record: TaskRecord, spec: ToolSpec, digest: str, as_task: bool) -> TaskRecord:
        idempotency.check_replay(record, spec.name, digest)
        metrics.tasks_replayed.labels(spec.name, "task" if as_task else "sync").inc()
        return record

    def _maybe_created(
        self, task_id: str, principal: str, as_task: bool, idempotency_key: str | None
    ) -> ServiceUnavailable:
        """The row may have been written before the connection broke. A task's client is told
        its id, so it can look before it calls again (no task lost, none run twice). A
        synchronous caller cannot look (and would never get the result): the task, if it exists,
        is cancelled once the database answers again, and the caller simply calls again. With
        an idempotency key, the call again finds the task instead: nothing is cancelled."""
        if idempotency_key is not None and not as_task:
            return ServiceUnavailable(
                "Temporarily unavailable: the task database went away during the call; call "
                "again with the same idempotency key (a task it may have started is kept for it)"
            )
        if as_task:
            return ServiceUnavailable(
                "Temporarily unavailable: the task database went away while the task was being "
                "created, so it may exist: once the service answers again, tasks/get "
                "error.data.taskId, and call again only if that task is unknown",
                task_id=task_id,
            )
        cancelling = asyncio.create_task(self._cancel_when_reachable(task_id, principal))
        self._background.add(cancelling)
        cancelling.add_done_callback(self._background.discard)
        return ServiceUnavailable(
            "Temporarily unavailable: the task database went away during the call (a task it "
            "may have started is cancelled once the database is back); call again"
        )

    async def _cancel_when_reachable(self, task_id: str, principal: str) -> None:
        deadline = time.monotonic() + ORPHAN_CANCEL_S
        while time.monotonic() < deadline:
            try:
                await self.cancel(task_id, principal, "the synchronous call failed while it was created")
            except InfrastructureError:
                await asyncio.sleep(1.0)
            else:
                return
        logger.warning("task %s may run for a synchronous call that failed (database unreachable)", task_id)

    def _new_task(
        self,
        ctx: RequestContext,
        spec: ToolSpec,
        arguments: Mapping[str, object],
        task_id: str,
        retention_ms: int,
        as_task: bool,
        preflight: Mapping[str, object] | None,
        log_level: str | None,
    ) -> NewTask:
        settings = self._settings
        assert ctx.meta is not None
        group, limit = spec.concurrency_group(arguments, ctx.principal)
        return NewTask(
            task_id=task_id,
            job_id=str(uuid.uuid4()),
            owner=ctx.principal,
            tool_name=spec.name,
            arguments=arguments,
            queue=spec.queue or self._default_queue,
            ttl_ms=retention_ms,
            retention_ms=min(retention_ms, settings.max_retention_ms),
            poll_interval_ms=spec.poll_interval_ms or settings.poll_interval_ms,
            max_attempts=spec.max_attempts or settings.max_attempts,
            protocol_version=ctx.meta.protocol_version,
            client_capabilities=ctx.meta.client_capabilities,
            client_info=ctx.meta.client_info,
            preflight=preflight,
            # A 2025-11-25 session lists the tasks it asked for; a plain (synchronous) call runs
            # as a row too, but the client never saw a task, so it stays out of tasks/list.
            session_id=ctx.session_id if as_task else None,
            log_level=None if as_task else log_level,  # never logs on a task (S-53)
            synchronous=not as_task,
            concurrency_group=group,
            concurrency_limit=limit,
        )

    async def get(self, task_id: str, principal: str) -> TaskRecord:
        """The principal's task; -32602 for unknown and foreign tasks alike."""
        record = await self._store.get_task(task_id, principal)
        if record is None:
            raise InvalidParams(UNKNOWN_TASK)
        if record.status == WORKING and record.dispatched_at is None:
            return await self._placed(record)
        return record

    async def _placed(self, record: TaskRecord) -> TaskRecord:
        """A task still in the fair backlog says its place in line: ``queued: 12 ahead`` (an
        estimate, ``store.backlog.QUEUE_POSITION``; SEP-2663 lets statusMessage describe any
        status). Read only for such tasks, so tasks/get stays one read for all others."""
        spec = get_tool(record.tool_name)
        if spec is not None and spec.concurrency is not None:
            waits = await self._store.group_wait(record.task_id)
            if waits is not None and waits[3] >= waits[2]:  # its group is full: it waits for that
                tool, group, limit, running = waits
                return dataclasses.replace(
                    record, status_message=waiting_message(tool, group, running, limit)
                )
        position = await self._store.queue_position(record.task_id)
        if position is None:
            return record  # published meanwhile
        ahead, capped = position
        return dataclasses.replace(
            record, status_message=f"{PLACE_IN_LINE}{ahead}{'+' if capped else ''} ahead"
        )

    async def find(self, task_id: str, principal: str) -> TaskRecord | None:
        """The principal's task as stored, or None (no error, no place in line)."""
        return await self._store.get_task(task_id, principal)

    async def session_tasks(
        self, principal: str, session_id: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[TaskRecord]:
        """The tasks a 2025-11-25 session created, newest first, after a keyset cursor."""
        return await self._store.list_tasks(principal, session_id, limit, after)

    async def logs_after(self, task_id: str, after: int) -> list[LogRecord]:
        """A task's log messages numbered above ``after``, in order (the caller owns the task)."""
        return await self._store.logs_after(task_id, after)

    async def view(self, record: TaskRecord) -> TaskView:
        if record.status != INPUT_REQUIRED:
            return TaskView(record)
        return TaskView(record, tuple(await self._store.outstanding_inputs(record.task_id)))

    async def owned(self, task_ids: Collection[str], principal: str) -> list[TaskRecord]:
        """The principal's tasks among ``task_ids`` (others are left out), oldest change first."""
        records = [r for r in await self._store.get_tasks(list(task_ids)) if r.owner == principal]
        return sorted(records, key=lambda r: r.last_updated_at)

    # ---- answer and cancel ------------------------------------------------------------------

    async def answer(self, record: TaskRecord, responses: Mapping[str, object]) -> None:
        """Record answers to outstanding keys and wake the waiting worker, or, when the job was
        suspended and this was its last question, wake the fair publisher: the job is back in
        the backlog (same transaction) and runs again, replaying the answers. Keys that are not
        outstanding are ignored (S-31); one invalid answer records none (-32602)."""
        if record.status != INPUT_REQUIRED:
            return
        outstanding = {item.key: item for item in await self._store.outstanding_inputs(record.task_id)}
        answers = {
            key: validate_response(key, item.method, item.params, response)
            for key, response in responses.items()
            if (item := outstanding.get(key)) is not None
        }
        if answers:
            outcome = await self._store.record_answers(record.task_id, answers)
            if outcome.resumed and outcome.job_id and outcome.queue:
                metrics.tasks_resumed.labels(record.tool_name).inc()
                self._publisher.publish_job(outcome.job_id, outcome.queue, tracing.inject())
            elif outcome.answered and outcome.inbox and outcome.job_id:
                self._publisher.wake(outcome.inbox, outcome.job_id)

    async def spend_request_state(self, digest: str, expires: float) -> bool:
        """Record an MRTR ``requestState`` as spent for every replica; False for a replay."""
        return await self._store.spend_request_state(digest, expires)

    async def cancel(self, task_id: str, principal: str, message: str | None = None) -> CancelOutcome:
        """The status turns cancelled at once (the spec allows it; the worker's late result is
        dropped by its guarded write); a worker blocked on input is woken, and the job revoked
        (without terminate: a queued job then never starts; a running one notices the row)."""
        outcome = await self._store.request_cancel(task_id, principal, message or "cancelled by the client")
        if outcome.cancelled_now and outcome.job_id:
            metrics.cancels_requested.labels(outcome.tool or "unknown").inc()
            if outcome.wake_inbox:
                self._publisher.wake(outcome.wake_inbox, outcome.job_id)
            self._publisher.revoke(outcome.job_id)
        return outcome

    # ---- 2025-11-25 sessions ----------------------------------------------------------------------

    async def open_session(
        self,
        session_id: str,
        principal: str,
        protocol_version: str,
        capabilities: JSONObject,
        client_info: JSONObject | None,
    ) -> bool:
        """Open a session; False when the principal already has the most live ones."""
        return await self._store.create_session(
            session_id, principal, protocol_version, capabilities, client_info
        )

    async def session(self, session_id: str, principal: str) -> SessionRecord | None:
        """The principal's live session (an expired or foreign one reads as unknown)."""
        return await self._store.get_session(session_id, principal)

    async def set_log_level(self, session_id: str, principal: str, level: str) -> bool:
        """``logging/setLevel``: False for an unknown session."""
        return await self._store.set_session_log_level(session_id, principal, level)

    async def end_session(self, session_id: str, principal: str) -> bool:
        """HTTP DELETE of a session: False for an unknown one."""
        return await self._store.delete_session(session_id, principal)

    # ---- waiting ------------------------------------------------------------------------------

    async def wait(
        self, task_id: str, principal: str, wait_s: float, until: Callable[[TaskRecord], bool]
    ) -> TaskRecord | None:
        """The row once ``until(row)`` holds, or the last one read when ``wait_s`` runs out."""
        return await self._events.wait_for(task_id, principal, wait_s, until=until)

    @contextlib.contextmanager
    def watching(self, task_id: str, changed: asyncio.Event) -> Iterator[None]:
        """Set ``changed`` whenever ``task_id`` may have changed, including changes that send no
        NOTIFY (one batched re-read per poll for the whole process)."""
        with self._events.watch_with(task_id, changed), self._events.polled(task_id):
            yield

    def sync_deadline(self) -> float:
        """When a synchronous call that starts now stops waiting (loop time)."""
        return asyncio.get_running_loop().time() + self._settings.max_sync_wait_seconds

    async def wait_for_outcome(
        self,
        task_id: str,
        principal: str,
        *,
        relay_inputs: bool,
        known: Collection[str] = (),
        news: Callable[[TaskRecord], bool] | None = None,
        deadline: float | None = None,
    ) -> TaskView | None:
        """The one wait of a synchronous call: until the task ends or, when the caller can relay
        input requests (``relay_inputs``), until it asks for one not in ``known``, or until
        ``news(row)`` (progress or logs to relay: the row is then re-read every ``poll_s``).
        Returns the view (still active at the ``deadline``, by default ``max_sync_wait_seconds``
        from now, or with news), None if the task is gone."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = self.sync_deadline()
        seen: object = None

        def settled(row: TaskRecord) -> bool:
            asks = relay_inputs and row.status == INPUT_REQUIRED and row.last_updated_at != seen
            return not row.active or asks or (news is not None and news(row))

        while True:
            left = deadline - loop.time()
            with self._events.polled(task_id) if news is not None else contextlib.nullcontext():
                record = await self._events.wait_for(task_id, principal, max(0.0, left), until=settled)
            if record is None:
                return None
            view = await self.view(record)
            if not record.active or left <= 0 or (news is not None and news(record)):
                return view
            if record.status == INPUT_REQUIRED:
                if any(item.key not in known for item in view.inputs):
                    return view
                seen = record.last_updated_at  # nothing new to relay: wait for the next change

    @contextlib.asynccontextmanager
    async def cancelled_if_abandoned(self, task_id: str, principal: str) -> AsyncIterator[None]:
        """A synchronous caller that goes away (its stream closed) takes its task with it: no
        job runs on for nobody."""
        try:
            yield
        except asyncio.CancelledError:
            await asyncio.shield(self.cancel(task_id, principal, "the caller went away"))
            raise
