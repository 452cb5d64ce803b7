"""The API's door to Postgres: an async psycopg pool, one statement per operation."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import AsyncRowFactory, args_row, class_row, dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import (
    _rows,
    admin_queries,
    backlog,
    fleet_queries,
    queries,
    session_queries,
)
from mcp_celery_tasks.store._conninfo import connect_kwargs
from mcp_celery_tasks.store.artifact_calls import ArtifactReads
from mcp_celery_tasks.store.console_calls import ConsoleReads
from mcp_celery_tasks.store.fleet import DemandRow
from mcp_celery_tasks.store.quota_calls import QuotaReads
from mcp_celery_tasks.store.records import (
    AnswerOutcome,
    CancelOutcome,
    InputRecord,
    LogRecord,
    NewTask,
    SessionRecord,
    TaskRecord,
)
from mcp_celery_tasks.store.revocation_calls import RevocationReads
from mcp_celery_tasks.store.row_types import (
    OPEN_ROWS,
    AnswerRow,
    CancelRow,
    Headroom,
    PrincipalLimits,
    QueuePosition,
    typed_rows,
)

__all__ = ["ApiStore"]

R = TypeVar("R")
# By position: the hot reads select exactly the records' fields in order (queries.TASK_COLUMNS,
# then db_now; INPUT_COLUMNS), so no statement reads its column names (test_store_columns).
_TASK = args_row(TaskRecord)
_INPUT = args_row(InputRecord)


class ApiStore(ArtifactReads, ConsoleReads, QuotaReads, RevocationReads):
    """Async store operations used by the HTTP front end."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool = self._new_pool()
        self._slots = asyncio.Semaphore(settings.db_pool_max)
        """Statements queue here for a connection: a cheap wait where the pool's own waiting
        costs a task and a timer per waiter (64 concurrent gets on 10 connections spent a tenth of
        their CPU there)."""
        self._last_recover = 0.0
        self._recover_hold_s = 1.0
        self._served_at = 0.0  # when a statement last succeeded
        self._closing: set[asyncio.Task[None]] = set()
        self._checking: set[asyncio.Task[None]] = set()
        self._recovering: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        await self._pool.open(wait=False)

    def _new_pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Mapping[str, object]]]:
        settings = self._settings
        return AsyncConnectionPool(
            settings.database_url,
            min_size=settings.db_pool_min,
            max_size=settings.db_pool_max,
            kwargs={"row_factory": dict_row, **connect_kwargs(settings, "mcp-celery-tasks-api")},
            timeout=settings.db_connect_timeout_seconds,
            open=False,
            name="mcp-tasks-api",
            connection_class=psycopg.AsyncConnection[Mapping[str, object]],
        )

    async def _recover(self) -> None:
        """psycopg_pool reconnects with an exponential backoff (1, 2, 4, 8 … s), so after a long
        outage it can stay empty for as long again. When a direct connection works, swap in a
        fresh pool (at most once a second), unless the old one served a statement meanwhile,
        and leave it three times as long as that connection took to open its own: after a
        failover whose first host is silent every connect waits its timeout there first, and a
        pool replaced each second never got one (503 for ever)."""
        now = time.monotonic()
        if now - self._last_recover < self._recover_hold_s:
            return
        self._last_recover = now
        try:
            probe = await psycopg.AsyncConnection.connect(
                self._settings.database_url, connect_timeout=1, prepare_threshold=None
            )
        except psycopg.Error:
            self._recover_hold_s = 1.0
            return  # still down
        self._recover_hold_s = max(1.0, 3 * (time.monotonic() - now))
        await probe.close()
        if self._served_at > now:
            return  # the pool connected again by itself while the probe did
        old, self._pool = self._pool, self._new_pool()
        await self._pool.open(wait=False)
        task = asyncio.create_task(old.close(timeout=1))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _check_idle(self) -> None:
        """Test every idle pooled connection in the background (one check at a time): dead ones
        are dropped, and the requests meanwhile get fresh connections."""
        _in_background(self._checking, self._pool.check)

    def _recover_soon(self) -> None:
        """``_recover`` in the background (one at a time): its probe may wait a connect timeout
        on a silent host (2 s at least, psycopg's floor), which no request should wait for."""
        _in_background(self._recovering, self._recover)

    async def close(self) -> None:
        for task in self._recovering:
            task.cancel()  # it would open a pool after this one closed
        await self._pool.close()

    @asynccontextmanager
    async def _conn(
        self, wait_s: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Mapping[str, object]]]:
        """A pooled connection, waited for at most ``wait_s`` (default: the connect bound)."""
        try:
            async with self._pool.connection(wait_s) as conn:
                yield conn
        except psycopg.errors.QueryCanceled as exc:
            raise InfrastructureError("the task database did not answer in time") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise InfrastructureError("the task database is unavailable") from exc

    async def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        return await self._rows(sql, params, OPEN_ROWS)

    async def _rows(
        self, sql: LiteralString, params: Mapping[str, object], rows: AsyncRowFactory[R]
    ) -> list[R]:
        """Run one statement, its rows made by ``rows``. A connection that broke under us
        (Postgres restarted since the pool opened it) is replaced and the statement tried once
        more: every statement here is guarded, so running it twice changes nothing the first
        run did not."""
        sent = False  # a statement went out on a connection that then broke: it may have committed
        for attempt in (1, 2):
            try:
                async with self._connection() as conn:
                    cursor = conn.cursor(row_factory=rows)
                    await cursor.execute(sql, params)
                    found = await cursor.fetchall()
                self._served_at = time.monotonic()
                return found
            except InfrastructureError as exc:
                cause = exc.__cause__
                # A statement cancelled by its timeout was rolled back; a broken connection may
                # have committed it first.
                broke = isinstance(cause, psycopg.OperationalError) and not isinstance(
                    cause, psycopg.errors.QueryCanceled
                )
                exc.maybe_applied = sent
                if isinstance(cause, PoolTimeout):
                    # The pool could not connect within the bound: Postgres is down or the pool
                    # is in its reconnect backoff. Answer now; rebuild the pool if Postgres is back.
                    self._recover_soon()
                    raise
                if attempt == 2 or not isinstance(cause, psycopg.OperationalError) or _timed_out(cause):
                    # A connection that timed out (``tcp_user_timeout``: the path to Postgres went
                    # silent, no reset) says the pool's other idle connections are as dead: a
                    # retry on one would wait the whole bound again. Answer now and have them
                    # checked in the background, so the next requests connect afresh and are
                    # told within ``db_unavailable_after_seconds`` while the path stays cut.
                    if broke and _timed_out(cause):
                        self._check_idle()
                    exc.maybe_applied = sent or broke
                    raise
                sent = sent or broke
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Mapping[str, object]]]:
        """A pooled connection for one statement: first a turn at the pool (waited for up to the
        connect bound while every connection is busy), then a connection, waited for only
        ``db_unavailable_after_seconds``: with a turn, a connection that does not come at once
        means Postgres is out of reach, and the client is better told so now."""
        left = await self._take_slot()
        try:
            async with self._conn(min(left, self._settings.db_unavailable_after_seconds)) as conn:
                yield conn
        finally:
            self._slots.release()

    async def _take_slot(self) -> float:
        """Wait for a statement slot; returns what is left of the connect bound for the pool."""
        bound = self._settings.db_connect_timeout_seconds
        if not self._slots.locked():
            await self._slots.acquire()  # a free slot: no wait
            return bound
        started = time.monotonic()
        try:
            async with asyncio.timeout(bound):
                await self._slots.acquire()
        except TimeoutError:
            # Every slot stayed busy for the whole bound: answered as the pool's timeout is.
            raise InfrastructureError("the task database is unavailable") from PoolTimeout(
                f"no database connection within {bound:g} s"
            )
        return max(0.001, bound - (time.monotonic() - started))

    async def create_task(
        self, task: NewTask, max_active: int | None = None, rate: float = 0.0, burst: int = 1
    ) -> TaskRecord | None:
        """Insert and commit a task row (autocommit): a tasks/get resolves once this returns.
        None when the owner already has ``max_active`` active tasks, or when its creates-per-second
        bucket shared by every API replica (``rate`` a second, up to ``burst``; 0: none) holds no
        token (``bucket_wait`` tells which).

        With an idempotency key, the owner's live task under that key when there is one (its
        ``task_id`` is then not ``task.task_id``): the insert yields to the row that won the
        unique index, so any number of concurrent calls make one task. A row that expired
        (not yet collected) gives its key up and the insert is tried again."""
        params = {
            **_rows.new_task_params(task),
            "max_active": max_active,
            "rate": rate,
            "burst": max(1, burst),
        }
        sql = queries.CREATE_TASK if task.idempotency_key is None else queries.CREATE_KEYED_TASK
        for _ in range(3):
            try:
                rows = await self._rows(sql, params, _TASK)
            except psycopg.errors.UniqueViolation:
                # The retry of an insert whose first attempt committed before the connection broke.
                existing = await self.get_task(task.task_id, task.owner)
                if existing is None:
                    raise
                return existing
            if rows or task.idempotency_key is None:
                return rows[0] if rows else None
            if (existing := await self.task_by_key(task.owner, task.idempotency_key)) is not None:
                return existing
            await self._rows(queries.RELEASE_KEY, params, tuple_row)
        return None  # refused by a quota (or the key's row vanished three times over)

    async def task_by_key(self, owner: str, key: str) -> TaskRecord | None:
        """The owner's live task created under idempotency ``key``, or None."""
        params = {"owner": owner, "idempotency_key": key}
        rows = await self._rows(queries.TASK_BY_KEY, params, _TASK)
        return rows[0] if rows else None

    async def principal_limits(self) -> list[PrincipalLimits]:
        """Every per-principal quota override (admins set few)."""
        return await self._rows(admin_queries.PRINCIPAL_LIMITS, {}, typed_rows(PrincipalLimits))

    async def get_task(self, task_id: str, owner: str) -> TaskRecord | None:
        rows = await self._rows(queries.GET_TASK, {"task_id": task_id, "owner": owner}, _TASK)
        return rows[0] if rows else None

    async def queue_position(self, task_id: str, cap: int = 500) -> tuple[int, bool] | None:
        """(jobs ahead, whether the count was capped) of a task still in the fair backlog; None
        once its job is published. An estimate (``store.backlog.QUEUE_POSITION``)."""
        params = {"task_id": task_id, "cap": cap}
        rows = await self._rows(backlog.QUEUE_POSITION, params, typed_rows(QueuePosition))
        return (int(rows[0]["ahead"]), bool(rows[0]["capped"])) if rows else None

    async def get_tasks(self, task_ids: Sequence[str]) -> list[TaskRecord]:
        """Rows for the event hub (ownership is checked by whoever registered the watch)."""
        return await self._rows(queries.GET_TASKS, {"task_ids": list(task_ids)}, _TASK)

    async def task_states(self, task_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        """``(task_id, status, status_message, last_updated_at, log_seq, finished_at)`` of those
        of ``task_ids`` that exist: what the event hub compares between its re-reads
        (``finished_at``: a cancelled job's worker stopped, which the console shows)."""
        return await self._rows(queries.TASK_STATES, {"task_ids": list(task_ids)}, tuple_row)

    async def outstanding_inputs(self, task_id: str) -> list[InputRecord]:
        return await self._rows(queries.OUTSTANDING_INPUTS, {"task_id": task_id}, _INPUT)

    async def record_answers(self, task_id: str, answers: Mapping[str, JSONObject]) -> AnswerOutcome:
        """Record answers to outstanding keys (others are ignored) in one statement."""
        items = [{"key": key, "response": response} for key, response in answers.items()]
        params = {"task_id": task_id, "answers": Jsonb(items)}
        # One pipeline: BEGIN, the lock and the answers go out together, and the COMMIT after
        # the row comes back (two round trips instead of four; the input round trip waits on it).
        async with self._connection() as conn, conn.pipeline(), conn.transaction():
            # Lock the task first: two updates answering different keys at once must each see
            # the other's answers when they count what remains (READ COMMITTED takes a new
            # snapshot per statement), or neither would return the task to working.
            await conn.execute(queries.LOCK_TASK, params)
            cursor = conn.cursor(row_factory=typed_rows(AnswerRow))
            await cursor.execute(queries.RECORD_ANSWERS, params)
            row = await cursor.fetchone()
        assert row is not None
        return AnswerOutcome(
            answered=row["answered"],
            inbox=row["inbox"],
            status=row["status"],
            resumed=row["resumed"],
            job_id=row["job_id"],
            queue=row["queue"],
        )

    def _session_window(self) -> dict[str, float]:
        settings = self._settings
        return {"idle_s": settings.session_idle_seconds, "max_age_s": settings.session_max_age_seconds}

    async def create_session(
        self,
        session_id: str,
        owner: str,
        protocol_version: str,
        capabilities: JSONObject,
        client_info: JSONObject | None,
    ) -> bool:
        """Open a 2025-11-25 session; False when its owner already has the most live ones."""
        params = {
            "session_id": session_id,
            "owner": owner,
            "protocol_version": protocol_version,
            "client_capabilities": Jsonb(capabilities),
            "client_info": Jsonb(client_info) if client_info is not None else None,
            "max_sessions": self._settings.max_sessions_per_principal,
            **self._session_window(),
        }
        return bool(await self._fetch(session_queries.CREATE_SESSION, params))

    async def spend_request_state(self, digest: str, expires: float) -> bool:
        """Record a sealed ``requestState`` as spent (until ``expires``, epoch seconds); False when
        some round, on this replica or another, already spent it (a replay)."""
        params = {"digest": digest, "spent_by": uuid.uuid4().hex, "expires": expires}
        return bool(await self._fetch(session_queries.SPEND_REQUEST_STATE, params))

    async def get_session(self, session_id: str, owner: str) -> SessionRecord | None:
        """The owner's live session (an expired or foreign one reads as unknown)."""
        params = {"session_id": session_id, "owner": owner, **self._session_window()}
        rows = await self._rows(session_queries.GET_SESSION, params, typed_rows(SessionRecord))
        return rows[0] if rows else None

    async def set_session_log_level(self, session_id: str, owner: str, level: str) -> bool:
        """``logging/setLevel`` of a 2025-11-25 session (its later synchronous calls get logs)."""
        params = {"session_id": session_id, "owner": owner, "level": level, **self._session_window()}
        return bool(await self._fetch(session_queries.SET_SESSION_LOG_LEVEL, params))

    async def logs_after(self, task_id: str, after: int, limit: int = 100) -> list[LogRecord]:
        """A task's log messages numbered above ``after``, in order (the caller owns the task)."""
        params = {"task_id": task_id, "after": after, "limit": limit}
        return await self._rows(queries.LOGS_AFTER, params, class_row(LogRecord))

    async def delete_session(self, session_id: str, owner: str) -> bool:
        rows = await self._fetch(session_queries.DELETE_SESSION, {"session_id": session_id, "owner": owner})
        return bool(rows)

    async def list_tasks(
        self, owner: str, session_id: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[TaskRecord]:
        """The tasks a 2025-11-25 session created, newest first, after a keyset cursor."""
        params = {
            "owner": owner,
            "session_id": session_id,
            "limit": limit,
            "after_created": after[0] if after else None,
            "after_id": after[1] if after else None,
        }
        return await self._rows(session_queries.LIST_TASKS, params, _TASK)

    async def connection_headroom(self) -> tuple[int, int]:
        """(connections in use, max_connections) of the server, for the start-up budget check."""
        rows = await self._rows(
            "SELECT (SELECT count(*) FROM pg_stat_activity)::int AS used, "
            "current_setting('max_connections')::int AS max",
            {},
            typed_rows(Headroom),
        )
        return int(rows[0]["used"]), int(rows[0]["max"])

    async def queue_demand(self) -> list[DemandRow]:
        """``mcp_queue_demand``, every queue (the demand gauges' one query per interval). A view not
        migrated yet is as unusable as a database that is down (InfrastructureError)."""
        try:
            return await self._rows(fleet_queries.DEMAND, {}, typed_rows(DemandRow))
        except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege) as exc:
            raise InfrastructureError(
                "mcp_queue_demand cannot be read (run mcp-celery-tasks migrate)"
            ) from exc

    async def schema_revision(self) -> str | None:
        """The applied migration (raises InfrastructureError when Postgres is unreachable)."""
        rows = await self._fetch("SELECT version_num FROM alembic_version", {})
        return str(rows[0]["version_num"]) if rows else None

    async def request_cancel(self, task_id: str, owner: str, message: str | None = None) -> CancelOutcome:
        """Cancel an owner's active task at once (the one cancel statement, ``queries.CANCEL``)."""
        params = {"ref": task_id, "by_job": False, "owner": owner, "message": message}
        rows = await self._rows(queries.CANCEL, params, typed_rows(CancelRow))
        if rows:
            return _rows.cancel_outcome(rows[0])
        return CancelOutcome(found=await self.task_exists(task_id, owner))

    async def task_exists(self, task_id: str, owner: str) -> bool:
        return bool(await self._fetch(queries.TASK_EXISTS, {"task_id": task_id, "owner": owner}))

    async def notifications(self) -> AsyncIterator[str | None]:
        """Task ids from ``NOTIFY mcp_task_events`` on one dedicated autocommit connection.

        Yields ``None`` once right after (re)connecting, so the caller re-reads what it
        watches: anything may have changed while no one listened.
        """
        try:
            # Straight to Postgres: a transaction pooler would lose every notification.
            conn = await psycopg.AsyncConnection.connect(
                self._settings.session_database_url,
                **connect_kwargs(self._settings, "mcp-celery-tasks-events", pooled=False),
            )
        except psycopg.Error as exc:
            raise InfrastructureError("cannot listen for task events") from exc
        try:
            await conn.execute("LISTEN " + queries.NOTIFY_CHANNEL)
            yield None
            async for notify in conn.notifies():
                yield notify.payload
        except psycopg.Error as exc:
            raise InfrastructureError("lost the task event connection") from exc
        finally:
            await conn.close()


def _in_background(running: set[asyncio.Task[None]], work: Callable[[], Awaitable[None]]) -> None:
    """Start ``work`` as a task unless the one in ``running`` is still going."""
    if any(not task.done() for task in running):
        return

    async def run() -> None:
        await work()

    task = asyncio.create_task(run())
    running.add(task)
    task.add_done_callback(running.discard)


def _timed_out(cause: BaseException | None) -> bool:
    """libpq gave up on a silent connection (``tcp_user_timeout`` or keepalives): "could not
    receive data from server: Connection timed out"."""
    return isinstance(cause, psycopg.OperationalError) and "timed out" in str(cause).lower()
