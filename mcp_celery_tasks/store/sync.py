"""The workers' (and maintenance jobs') door to Postgres: one autocommit connection per process.

A prefork child holds exactly one connection (the connection budget is one per child). Every
write is a single guarded statement, so the lease thread and the job thread can share it:
psycopg serializes statements on a connection.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import LiteralString, TypeVar

import psycopg
from psycopg.rows import RowFactory, class_row, dict_row
from psycopg.types.json import Jsonb

from mcp_celery_tasks.errors import InfrastructureError, TaskError, TooManyWaiting
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.lifecycle import ACTIVE
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import (
    _rows,
    admin_queries,
    backlog,
    queries,
    session_queries,
    step_queries,
)
from mcp_celery_tasks.store._conninfo import connect_kwargs
from mcp_celery_tasks.store.artifact_calls import ArtifactWrites
from mcp_celery_tasks.store.dispatch_calls import DispatchCalls
from mcp_celery_tasks.store.fleet import RegistryCalls
from mcp_celery_tasks.store.limit_calls import LimitCalls
from mcp_celery_tasks.store.records import CancelOutcome, ClaimedTask, InputItem, InputRecord
from mcp_celery_tasks.store.revocation_calls import RevocationWrites
from mcp_celery_tasks.store.row_types import (
    CancelRow,
    CheckpointFlip,
    CheckpointGone,
    ChunkRow,
    Holder,
    InputState,
    JobId,
    JobQueue,
    JobState,
    QueueRow,
    Seconds,
    StepEntry,
    StepResultRow,
    StepWriteRow,
    SuspendNow,
    WaitingQuota,
    typed_rows,
)
from mcp_celery_tasks.store.step_queries import CheckpointRecord, StepWrite
from mcp_celery_tasks.transient import is_infrastructure

__all__ = ["WorkerStore"]

R = TypeVar("R")

SUSPEND_DEMAND_GRACE_S = 1.0
"""How long queued work must have waited before a job waiting for input gives it its slot
(``queries.SUSPEND_NOW``)."""


class _NotOurs(Exception):
    """Raised inside a transaction to roll it back: the task is not this worker's any more."""


class WorkerStore(RegistryCalls, DispatchCalls, LimitCalls, ArtifactWrites, RevocationWrites):
    """Synchronous store operations for workers, beat jobs and the publisher thread (and the
    worker registry's: ``fleet``)."""

    def __init__(self, settings: Settings, application_name: str = "mcp-celery-tasks-worker") -> None:
        self._settings = settings
        self._application_name = application_name
        self._grace_s = settings.lease_grace_seconds
        self._conn: psycopg.Connection[Mapping[str, object]] | None = None
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def forget_after_fork(self) -> None:
        """Drop a connection inherited from the parent process without ending its session.

        The child must not close it (libpq would tell the server goodbye on the parent's
        behalf), and psycopg never finishes a connection made in another process; but the
        child's copy of the socket must go: once the parent replaces the connection (a
        failover, a restart), a copy kept open by every child holds the dead server's socket
        in CLOSE_WAIT for the child's whole life."""
        inherited, self._conn = self._conn, None
        if inherited is not None and not inherited.closed:
            with suppress(psycopg.Error, OSError):
                os.close(inherited.pgconn.socket)
        self._lock = threading.RLock()

    def _connect(self) -> psycopg.Connection[Mapping[str, object]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._settings.database_url,
                row_factory=dict_row,
                **connect_kwargs(self._settings, self._application_name),
            )
        return self._conn

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Mapping[str, object]]]:
        with self._lock:
            try:
                yield self._connect()
            except psycopg.Error as exc:
                if not is_infrastructure(exc):
                    raise
                if self._conn is not None:
                    # Also a connection that still works but reached a standby (a failover):
                    # the next call connects again, to whatever is primary now.
                    if not self._conn.closed and not self._conn.broken:
                        with suppress(psycopg.Error):
                            self._conn.close()
                    self._conn = None
                raise InfrastructureError("the task database is unavailable") from exc

    def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        with self._connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _rows(self, sql: LiteralString, params: Mapping[str, object], rows: RowFactory[R]) -> list[R]:
        with self._connection() as conn, conn.cursor(row_factory=rows) as cursor:
            return cursor.execute(sql, params).fetchall()

    def _execute(self, sql: LiteralString, params: Mapping[str, object]) -> int:
        with self._connection() as conn:
            return conn.execute(sql, params).rowcount

    # ---- claim and lease -------------------------------------------------------------------

    def claim(
        self, job_id: str, worker: str, lease_s: float, device: str | None = None
    ) -> ClaimedTask | None:
        params = {"job_id": job_id, "worker": worker, "lease_s": lease_s, "grace_s": self._grace_s,
                  "max_redeliveries": self._settings.max_redeliveries, "device": device}  # fmt: skip
        rows = self._rows(queries.CLAIM, params, class_row(ClaimedTask))
        return rows[0] if rows else None

    def job_state(self, job_id: str) -> JobState | None:
        params = {"job_id": job_id, "grace_s": self._grace_s}
        rows = self._rows(queries.JOB_STATE, params, typed_rows(JobState))
        return rows[0] if rows else None

    def fail_exhausted(
        self, job_id: str, error: TaskError, message: str, kind: str = "attempts_exhausted"
    ) -> bool:
        """Fail a task whose job used up its attempts or its redeliveries (``kind`` says which)."""
        params = {"job_id": job_id, "error": Jsonb(error), "message": message, "kind": kind,
                  "max_redeliveries": self._settings.max_redeliveries}  # fmt: skip
        return bool(self._fetch(queries.FAIL_EXHAUSTED, params))

    def renew_lease(self, task_id: str, worker: str, lease_s: float) -> bool:
        params = {"task_id": task_id, "worker": worker, "lease_s": lease_s}
        return bool(self._fetch(queries.RENEW_LEASE, params))

    def give_back(self, task_id: str, worker: str) -> bool:
        """Hand the job back uncounted (a redelivery, not an attempt); False if not ours."""
        return bool(self._fetch(queries.GIVE_BACK, {"task_id": task_id, "worker": worker}))

    # ---- while running ---------------------------------------------------------------------

    def still_mine(self, task_id: str, worker: str) -> bool:
        """Checkpoint: the task is active and this worker still holds it."""
        rows = self._rows(queries.CHECKPOINT, {"task_id": task_id}, typed_rows(Holder))
        if not rows:
            return False
        row = rows[0]
        return row["status"] in ACTIVE and row["worker"] == worker

    def report(
        self,
        task_id: str,
        worker: str,
        message: str,
        progress: float | None = None,
        total: float | None = None,
    ) -> bool:
        params = {
            "task_id": task_id,
            "worker": worker,
            "message": _rows.nul_free(message),  # tool text: no NUL (``_rows.nul_free_jsonb``)
            "progress": progress,
            "total": total,
        }
        return bool(self._fetch(queries.REPORT, params))

    def log(
        self, task_id: str, worker: str, level: str, logger: str | None, data: JSONValue, max_logs: int
    ) -> bool:
        """Record one log message for the task's synchronous caller; False if not recorded (the
        task is no longer ours, or already has ``max_logs``)."""
        params = {
            "task_id": task_id,
            "worker": worker,
            "level": level,
            "logger": _rows.nul_free(logger),
            "data": _rows.nul_free_jsonb(data),
            "max_logs": max_logs,
        }
        return bool(self._fetch(queries.LOG, params))

    # ---- input requests --------------------------------------------------------------------

    def all_inputs(self, task_id: str) -> dict[str, InputRecord]:
        """Every input request a task ever made, by key (a task makes few)."""
        rows = self._rows(queries.ALL_INPUTS, {"task_id": task_id}, class_row(InputRecord))
        return {row.key: row for row in rows}

    def open_inputs(
        self,
        task_id: str,
        worker: str,
        inbox: str,
        items: Sequence[InputItem],
        supersede: Sequence[str] = (),
        may_suspend: bool = False,
    ) -> bool:
        """Insert input rows, set the inbox and ``input_required`` at once; False if not ours.

        Raises ``TooManyWaiting`` (a tool error) when the task's principal already has its most
        jobs of this queue waiting for input (``max_waiting_inputs_per_principal``): fair
        dispatch stops releasing such a principal's jobs, this catches the ones it had already
        released, so unanswered questions cannot hold every slot of a queue. A job that may
        suspend (``may_suspend``) is not refused while its principal has room for another
        suspended task: it gives its slot back instead (``suspend_now`` says so)."""
        params = {
            "task_id": task_id,
            "worker": worker,
            "inbox": inbox,
            "items": _rows.nul_free_jsonb(list(items)),
            "supersede": list(supersede),
            "max_waiting": self._settings.max_waiting_inputs_per_principal,
            "max_suspended": self._settings.max_suspended_per_principal,
        }
        with self._connection() as conn, conn.transaction():
            conn.execute(backlog.LOCK_WAITING, params)
            with conn.cursor(row_factory=typed_rows(WaitingQuota)) as cursor:
                quota = cursor.execute(backlog.WAITING_QUOTA, params).fetchall()
            room_to_suspend = bool(quota) and (
                quota[0]["max_suspended"] <= 0 or quota[0]["suspended"] < quota[0]["max_suspended"]
            )
            full = bool(quota) and 0 < quota[0]["max_waiting"] <= quota[0]["waiting"]
            if full and not (may_suspend and room_to_suspend):
                limit, queue = quota[0]["max_waiting"], quota[0]["queue"]
                raise TooManyWaiting(
                    f"Too many of your tasks are waiting for input in queue {queue!r} (at most "
                    f"{limit}): answer or cancel one of them, then call again"
                )
            return bool(conn.execute(queries.OPEN_INPUTS, params).fetchall())

    def suspend_now(self, task_id: str) -> bool:
        """Should a job waiting for input give its slot back at once: other jobs of its queue wait
        for a slot, or its principal already holds its most resident waits in the queue."""
        params = {
            "task_id": task_id,
            "max_waiting": self._settings.max_waiting_inputs_per_principal,
            "grace_s": SUSPEND_DEMAND_GRACE_S,
        }
        rows = self._rows(queries.SUSPEND_NOW, params, typed_rows(SuspendNow))
        return bool(rows and rows[0]["now"])

    def suspend(self, task_id: str, worker: str) -> bool:
        """Give the slot back while questions are outstanding (lease released, attempt uncounted,
        ``suspended_at`` set); False if not ours, already answered, or the principal has its most
        suspended tasks (the job then stays resident)."""
        params = {
            "task_id": task_id,
            "worker": worker,
            "max_suspended": self._settings.max_suspended_per_principal,
        }
        return bool(self._fetch(queries.SUSPEND, params))

    def expire_suspended(
        self, older_than_s: float, result: Mapping[str, object], message: str, limit: int
    ) -> int:
        """End suspended tasks nobody answered within ``older_than_s`` (a tool error)."""
        params = {"older_than_s": older_than_s, "result": Jsonb(result), "message": message, "limit": limit}
        return len(self._fetch(queries.EXPIRE_SUSPENDED, params))

    def input_state(
        self, task_id: str, worker: str, keys: Sequence[str]
    ) -> tuple[bool, dict[str, JSONObject]]:
        """(still active and ours, the answers recorded so far for ``keys``)."""
        params = {"task_id": task_id, "keys": list(keys)}
        rows = self._rows(queries.INPUT_STATE, params, typed_rows(InputState))
        if not rows:
            return False, {}
        row = rows[0]
        mine = row["status"] in ACTIVE and row["worker"] == worker
        return mine, dict(row["answers"])

    def expire_inputs(self, task_id: str, worker: str, keys: Sequence[str]) -> None:
        self._fetch(queries.EXPIRE_INPUTS, {"task_id": task_id, "worker": worker, "keys": list(keys)})

    # ---- outcome ---------------------------------------------------------------------------

    def finish(
        self,
        task_id: str,
        worker: str,
        status: str,
        *,
        result: Mapping[str, object] | None = None,
        error: TaskError | None = None,
        message: str | None = None,
        error_kind: str | None = None,
        error_message: str | None = None,
    ) -> bool:
        """Record the outcome; False if the row is no longer ours (cancelled or lease lost).
        ``error_kind``/``error_message`` say, for admins, why a task failed or ended in a tool
        error (never shown to clients)."""
        params = {
            "task_id": task_id,
            "worker": worker,
            "status": status,
            "result": _rows.nul_free_jsonb(result),  # what the tool returned may hold a NUL
            "error": _rows.nul_free_jsonb(error),
            "message": _rows.nul_free(message),
            "error_kind": error_kind,
            "error_message": _rows.nul_free(error_message),
        }
        return bool(self._fetch(queries.FINISH, params))

    def mark_stopped(self, task_id: str, worker: str) -> None:
        self._execute(queries.MARK_STOPPED, {"task_id": task_id, "worker": worker})

    # ---- the watchdog ------------------------------------------------------------------------

    def watch_jobs(
        self, jobs: Sequence[Mapping[str, object]], lease_s: float
    ) -> dict[str, dict[str, object]]:
        """Renew the leases of the children that hold them; every job's row by ``job_id holder``
        (read by column name: ``queries.WATCH_JOBS`` says which)."""
        params = {"jobs": Jsonb(list(jobs)), "lease_s": lease_s}
        rows = self._rows(queries.WATCH_JOBS, params, typed_rows(dict[str, object]))
        return {f"{row['job_id']} {row['holder']}": row for row in rows}

    def force_finish(
        self, task_id: str, holder: str, *, result: Mapping[str, object], kind: str, message: str, reason: str
    ) -> bool:
        params = {"task_id": task_id, "holder": holder, "result": _rows.nul_free_jsonb(result),
                  "kind": kind, "message": _rows.nul_free(message), "reason": reason}  # fmt: skip
        return bool(self._fetch(queries.FORCE_FINISH, params))

    def force_stopped(self, task_id: str, holder: str, reason: str) -> bool:
        params = {"task_id": task_id, "holder": holder, "reason": reason}
        return bool(self._fetch(queries.FORCE_STOPPED, params))

    # ---- admin ---------------------------------------------------------------------------

    def admin_list(self, *, limit: int = 50, **filters: object) -> list[Mapping[str, object]]:
        params: dict[str, object] = {"status": None, "tool": None, "owner": None, "older_than_s": None,
                                     "newer_than_s": None}  # fmt: skip
        params.update(filters)
        return self._fetch(admin_queries.ADMIN_LIST, {**params, "limit": limit})

    def admin_summary(self) -> tuple[list[Mapping[str, object]], list[Mapping[str, object]]]:
        """Active tasks per queue and tool, and the latest failures (for ``top``)."""
        return self._fetch(admin_queries.ADMIN_SUMMARY, {}), self._fetch(
            admin_queries.ADMIN_RECENT_FAILURES, {"limit": 8}
        )

    def admin_match(self, ref: str, limit: int = 10) -> list[Mapping[str, object]]:
        """Tasks whose task id or job id is ``ref``, or starts with it (6+ characters); exact
        matches first."""
        return self._fetch(admin_queries.ADMIN_MATCH, {"ref": ref, "limit": limit})

    def admin_principals(self, limit: int = 20) -> list[Mapping[str, object]]:
        """Per queue and principal: backlog, queued in the broker, running, waiting for input."""
        return self._fetch(admin_queries.ADMIN_PRINCIPALS, {"limit": limit})

    def admin_show(self, ref: str) -> tuple[Mapping[str, object], list[Mapping[str, object]]] | None:
        """A task by task id or job id, with every input request it made."""
        rows = self._fetch(admin_queries.ADMIN_SHOW, {"ref": ref})
        if not rows:
            return None
        return rows[0], self._fetch(admin_queries.ADMIN_INPUTS, {"task_id": rows[0]["task_id"]})

    def admin_cancel(self, ref: str, message: str) -> CancelOutcome:
        """Cancel any principal's task by task id or job id (the one cancel statement)."""
        params = {"ref": ref, "by_job": True, "owner": None, "message": message}
        rows = self._rows(queries.CANCEL, params, typed_rows(CancelRow))
        return _rows.cancel_outcome(rows[0]) if rows else CancelOutcome(found=False)

    def admin_purge(self, *, older_than_s: float, **filters: object) -> int:
        params: dict[str, object] = {"status": None, "tool": None, "owner": None}
        params.update(filters)
        return self._execute(admin_queries.ADMIN_PURGE, {**params, "older_than_s": older_than_s})

    # ---- publisher and maintenance ---------------------------------------------------------

    def mark_dispatched(self, job_ids: Sequence[str]) -> int:
        return self._execute(queries.MARK_DISPATCHED, {"job_ids": list(job_ids)})

    def delete_expired(self, limit: int) -> int | None:
        """Delete up to ``limit`` expired rows; None if another collector holds the lock."""
        with self._connection() as conn, conn.transaction():
            got = conn.execute(queries.TRY_GC_LOCK, {"key": queries.GC_LOCK_KEY}).fetchone()
            if not got or not next(iter(got.values())):
                return None
            return conn.execute(queries.DELETE_EXPIRED, {"limit": limit}).rowcount

    def delete_expired_sessions(self, limit: int) -> int:
        params = {
            "limit": limit,
            "idle_s": self._settings.session_idle_seconds,
            "max_age_s": self._settings.session_max_age_seconds,
        }
        return self._execute(session_queries.DELETE_EXPIRED_SESSIONS, params)

    def delete_spent_request_states(self, limit: int) -> int:
        """Forget up to ``limit`` spent request states that have expired (``open`` refuses
        them by their expiry from then on)."""
        return self._execute(session_queries.DELETE_SPENT_REQUEST_STATES, {"limit": limit})

    def delete_idle_buckets(self, limit: int) -> int:
        """Forget up to ``limit`` creates-per-second buckets idle for an hour (full anyway)."""
        return self._execute(session_queries.DELETE_IDLE_BUCKETS, {"limit": limit})

    def fail_undispatched(self, older_than_s: float, error: TaskError, message: str) -> int:
        params = {"older_than_s": older_than_s, "error": Jsonb(error), "message": message}
        return len(self._fetch(queries.FAIL_UNDISPATCHED, params))

    def record_run(self, job: str, count: int) -> None:
        self._execute(queries.RECORD_RUN, {"job": job, "count": count})

    def seconds_since_run(self, job: str) -> float | None:
        rows = self._rows(queries.SECONDS_SINCE_RUN, {"job": job}, typed_rows(Seconds))
        return float(rows[0]["seconds"]) if rows else None

    def undispatched(self, older_than_s: float, limit: int) -> list[tuple[str, str]]:
        params = {"older_than_s": older_than_s, "limit": limit}
        rows = self._rows(queries.UNDISPATCHED, params, typed_rows(JobQueue))
        return [(row["job_id"], row["queue"]) for row in rows]

    def unstarted_queues(self, older_than_s: float) -> list[str]:
        params = {"older_than_s": older_than_s}
        return [row["queue"] for row in self._rows(queries.UNSTARTED_QUEUES, params, typed_rows(QueueRow))]

    def unstarted(self, older_than_s: float, limit: int, queue: str | None = None) -> list[tuple[str, str]]:
        """Jobs published ``older_than_s`` ago that no worker started, re-stamped as published now."""
        params = {"older_than_s": older_than_s, "limit": limit, "queue": queue}
        return [
            (row["job_id"], row["queue"])
            for row in self._rows(queries.UNSTARTED, params, typed_rows(JobQueue))
        ]

    def end_unattended_stops(self) -> int:
        """Cancelled tasks that nobody runs any more stop showing as ``stopping``."""
        return len(self._fetch(queries.END_UNATTENDED_STOPS, {"grace_s": self._grace_s}))

    def lost_leases(self, grace_s: float, limit: int) -> list[tuple[str, str]]:
        """Active jobs whose lease lapsed ``grace_s`` ago (their worker died), handed back to the
        queue: lease cleared, re-stamped as published now, so each is re-published once (a lost
        message then is the lost-message recovery's business, not every sweep's)."""
        params = {"grace_s": grace_s, "limit": limit}
        rows = self._rows(queries.LOST_LEASES, params, typed_rows(JobQueue))
        return [(row["job_id"], row["queue"]) for row in rows]

    # ---- fair dispatch ------------------------------------------------------------------------

    # ---- durable steps and checkpoints (``ctx.step``, ``ctx.checkpoint``; ``step_queries``) ----

    def step_index(self, task_id: str) -> list[tuple[int, str]]:
        """The task's recorded steps as ``(seq, name)``, in order (the results stay behind)."""
        rows = self._rows(step_queries.STEP_INDEX, {"task_id": task_id}, typed_rows(StepEntry))
        return [(int(row["seq"]), str(row["name"])) for row in rows]

    def step_result(self, task_id: str, seq: int) -> JSONValue:
        """The recorded result of step ``seq`` (decoded JSON); ``LookupError`` if none."""
        rows = self._rows(
            step_queries.STEP_RESULT, {"task_id": task_id, "seq": seq}, typed_rows(StepResultRow)
        )
        if not rows:
            raise LookupError(f"no step {seq} is recorded")
        return rows[0]["result"]

    def record_step(self, task_id: str, worker: str, seq: int, name: str, result: str) -> StepWrite:
        """Record step ``seq`` (``result``: its JSON text), fenced (``step_queries.StepWrite``)."""
        params = {"task_id": task_id, "worker": worker, "seq": seq, "name": name, "result": result,
                  "size": len(result.encode())}  # fmt: skip
        row = self._rows(step_queries.RECORD_STEP, params, typed_rows(StepWriteRow))[0]
        if not row["mine"]:
            return False
        return True if row["recorded"] else None

    def save_checkpoint(
        self, task_id: str, worker: str, name: str, generation: str, chunks: Iterable[bytes]
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        """Store a checkpoint's bytes in Postgres and make it the task's checkpoint ``name``.

        One transaction: the chunks of the new generation, the fenced flip of the checkpoint row,
        the previous generation's chunks deleted. An error raised by ``chunks`` (a size cap, an
        unreadable file) rolls it all back, as does a task that is not ours (then None): the
        previous checkpoint stays intact either way. Returns (the saved record, the previous one).
        """
        digest = hashlib.sha256()
        size = count = 0
        try:
            with self._connection() as conn, conn.transaction():
                for chunk in chunks:
                    params = {"task_id": task_id, "name": name, "generation": generation, "seq": count,
                              "data": chunk}  # fmt: skip
                    conn.execute(step_queries.INSERT_CHUNK, params)
                    digest.update(chunk)
                    size, count = size + len(chunk), count + 1
                record = CheckpointRecord(name, generation, "postgres", size, digest.hexdigest(), count, None)
                flipped = self._flip_checkpoint(conn, task_id, worker, record)
                if flipped is None:
                    raise _NotOurs  # rolls the chunks back
                params = {"task_id": task_id, "name": name, "generation": generation}
                conn.execute(step_queries.DELETE_OTHER_CHUNKS, params)
                return flipped
        except _NotOurs:
            return None

    def record_checkpoint(
        self, task_id: str, worker: str, record: CheckpointRecord
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        """Make ``record`` (its bytes kept elsewhere: a file) the task's checkpoint of its name,
        fenced; deletes the chunks of a previous one kept in Postgres. None: not ours."""
        with self._connection() as conn, conn.transaction():
            flipped = self._flip_checkpoint(conn, task_id, worker, record)
            if flipped is not None:
                params = {"task_id": task_id, "name": record.name, "generation": record.generation}
                conn.execute(step_queries.DELETE_OTHER_CHUNKS, params)
            return flipped

    def checkpoint(self, task_id: str, name: str) -> CheckpointRecord | None:
        rows = self._rows(
            step_queries.CHECKPOINT, {"task_id": task_id, "name": name}, class_row(CheckpointRecord)
        )
        return rows[0] if rows else None

    def checkpoint_chunks(self, task_id: str, record: CheckpointRecord) -> Iterator[bytes]:
        """The bytes of a checkpoint kept in Postgres, one chunk (one query) at a time."""
        for seq in range(record.chunks):
            params = {"task_id": task_id, "name": record.name, "generation": record.generation, "seq": seq}
            rows = self._rows(step_queries.CHUNK, params, typed_rows(ChunkRow))
            if not rows:
                raise LookupError(f"checkpoint {record.name!r} lost chunk {seq} (it was replaced meanwhile)")
            yield bytes(rows[0]["data"])

    def delete_checkpoint(self, task_id: str, worker: str, name: str) -> CheckpointRecord | bool | None:
        """Delete checkpoint ``name`` and its chunks, fenced: the deleted record (its file, if any,
        is the caller's to remove), None if there was none, False if the task is not ours."""
        params = {"task_id": task_id, "worker": worker, "name": name}
        row = self._rows(step_queries.DELETE_CHECKPOINT, params, typed_rows(CheckpointGone))[0]
        if not row["mine"]:
            return False
        if row["generation"] is None or row["storage"] is None:
            return None
        return CheckpointRecord(name, row["generation"], row["storage"], 0, "", 0, row["path"])

    def admin_durables(self, task_id: str) -> tuple[list[Mapping[str, object]], list[Mapping[str, object]]]:
        """A task's recorded steps and its checkpoints (sizes and times, never the data), for admins."""
        params = {"task_id": task_id}
        return self._fetch(step_queries.ADMIN_STEPS, params), self._fetch(
            step_queries.ADMIN_CHECKPOINTS, params
        )

    def known_jobs(self, job_ids: Sequence[str]) -> set[str]:
        """Which of ``job_ids`` still have a task row (the checkpoint directory's orphan sweep)."""
        params = {"job_ids": list(job_ids)}
        return {row["job_id"] for row in self._rows(step_queries.KNOWN_JOBS, params, typed_rows(JobId))}

    @staticmethod
    def _flip_checkpoint(
        conn: psycopg.Connection[Mapping[str, object]], task_id: str, worker: str, record: CheckpointRecord
    ) -> tuple[CheckpointRecord, CheckpointRecord | None] | None:
        params = {"task_id": task_id, "worker": worker, "name": record.name, "generation": record.generation,
                  "storage": record.storage, "size": record.size, "sha256": record.sha256,
                  "chunks": record.chunks, "path": record.path}  # fmt: skip
        with conn.cursor(row_factory=typed_rows(CheckpointFlip)) as cursor:
            rows = cursor.execute(step_queries.RECORD_CHECKPOINT, params).fetchall()
        if not rows:
            return None
        row = rows[0]
        saved = replace(record, saved_at=row["saved_at"])
        if row["generation"] is None or row["storage"] is None or row["generation"] == record.generation:
            return saved, None
        return saved, CheckpointRecord(record.name, row["generation"], row["storage"], 0, "", 0, row["path"])
