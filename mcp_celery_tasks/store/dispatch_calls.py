"""Fair dispatch as store calls (``backlog`` and ``retry_queries`` hold the SQL): the release
pass, retries waiting for their time, putting jobs back, a backlog job's place in line.

``DispatchCalls`` is mixed into ``WorkerStore`` (the sweeper, the admin commands, the API's fair
publisher thread) over the host store's one connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Final, LiteralString, TypeVar

import psycopg
from psycopg.rows import RowFactory

from mcp_celery_tasks.store import backlog, queries, retry_queries
from mcp_celery_tasks.store.row_types import QueueCount, QueuePosition, QueueRow, ReleaseRow, typed_rows

__all__ = ["DispatchCalls"]

R = TypeVar("R")

_RELEASE_REPEATS: Final = 8
"""Release passes run again at most this often when concurrency groups held candidates back
(each repeat fills at least one more group, or stops)."""


class DispatchCalls:
    """The dispatch store calls; ``WorkerStore`` provides the connection."""

    _limited: set[str] | None = None
    """Queues whose backlog held jobs of a limited tool at their last release."""

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Mapping[str, object]]]:
        raise NotImplementedError  # WorkerStore's

    def _fetch(self, sql: LiteralString, params: Mapping[str, object]) -> list[Mapping[str, object]]:
        raise NotImplementedError  # WorkerStore's

    def _rows(self, sql: LiteralString, params: Mapping[str, object], rows: RowFactory[R]) -> list[R]:
        raise NotImplementedError  # WorkerStore's

    def _execute(self, sql: LiteralString, params: Mapping[str, object]) -> int:
        raise NotImplementedError  # WorkerStore's

    def queue_position(self, task_id: str, cap: int = 500) -> tuple[int, bool] | None:
        """A backlog task's place in line (``ApiStore.queue_position``), for admins."""
        params = {"task_id": task_id, "cap": cap}
        rows = self._rows(backlog.QUEUE_POSITION, params, typed_rows(QueuePosition))
        return (int(rows[0]["ahead"]), bool(rows[0]["capped"])) if rows else None

    def backlog_queues(self) -> list[str]:
        """Queues with jobs waiting in the backlog (never published)."""
        return [row["queue"] for row in self._rows(backlog.BACKLOG_QUEUES, {}, typed_rows(QueueRow))]

    def release_jobs(self, queue: str, ahead: int, max_waiting: int) -> list[tuple[str, str]]:
        """Mark the next jobs of ``queue`` published, round-robin by principal, so that at most
        ``ahead`` wait in the broker (``store.backlog.RELEASE``); the caller publishes them."""
        return self.release(queue, ahead, max_waiting)[0]

    def release(self, queue: str, ahead: int, max_waiting: int) -> tuple[list[tuple[str, str]], int]:
        """``release_jobs``, and the room the queue had in the broker before this release: fewer
        released than that means nothing eligible is left in its backlog.

        A queue whose backlog holds jobs of a tool with a concurrency limit is released with
        ``backlog.RELEASE_LIMITED`` (remembered per queue while such jobs wait; the plain pass
        says when they appear). When groups held candidates back while room was left, the pass
        runs again: those candidates may have kept other groups' jobs out of it."""
        limited_queues = self._limited_queues()
        sql = backlog.RELEASE_LIMITED if queue in limited_queues else backlog.RELEASE
        released, room, held, limited = self._release_once(sql, queue, ahead, max_waiting)
        for _ in range(_RELEASE_REPEATS):
            if not (limited or held) or len(released) >= room:
                break
            # The jobs just released count as queued: the room shrinks by itself.
            more, _, held, limited = self._release_once(backlog.RELEASE_LIMITED, queue, ahead, max_waiting)
            released += more
            if not more:
                break
        if limited:
            limited_queues.add(queue)
        else:
            limited_queues.discard(queue)
        return released, room

    def _limited_queues(self) -> set[str]:
        if self._limited is None:
            self._limited = set()
        return self._limited

    def _release_once(
        self, sql: LiteralString, queue: str, ahead: int, max_waiting: int
    ) -> tuple[list[tuple[str, str]], int, int, bool]:
        params = {"queue": queue, "ahead": ahead, "max_waiting": max_waiting}
        # One round trip: BEGIN, the asynchronous commit, no JIT, the queue's lock, the release and
        # COMMIT are pipelined.
        with self._connection() as conn, conn.pipeline():
            with conn.transaction():
                conn.execute(backlog.ASYNC_COMMIT)
                conn.execute(backlog.NO_JIT)
                conn.execute(backlog.LOCK_QUEUE, params)
                cursor = conn.cursor(row_factory=typed_rows(ReleaseRow)).execute(sql, params)
            rows = cursor.fetchall()
        first = rows[0] if rows else None
        room = int(first["room"]) if first else 0
        held = int(first["held"]) if first else 0
        limited = bool(first["limited"]) if first else False
        # A release of none is one row of nulls (and the room).
        jobs = [(row["job_id"], row["queue"]) for row in rows]
        released = [(job, job_queue) for job, job_queue in jobs if job is not None and job_queue is not None]
        return released, room, held, limited

    def schedule_retry(
        self, task_id: str, worker: str, delay_s: float, message: str, kind: str, detail: str
    ) -> bool:
        """Put the job back in the backlog to run again after ``delay_s`` (``retry_queries``);
        False if not ours any more, cancelled, or out of attempts."""
        params = {"task_id": task_id, "worker": worker, "delay_s": delay_s, "message": message,
                  "kind": kind, "detail": detail}  # fmt: skip
        return bool(self._fetch(retry_queries.SCHEDULE_RETRY, params))

    def release_due_retries(self, limit: int = 1000) -> tuple[set[str], float | None]:
        """Due retries join the backlog; returns their queues, and in how many seconds the next
        waiting retry falls due (None: no retry waits)."""
        rows = self._fetch(retry_queries.RELEASE_DUE, {"limit": limit})
        queues = {str(row["queue"]) for row in rows if row["queue"] is not None}
        after = [float(str(row["next_s"])) for row in rows if row["next_s"] is not None]
        return queues, min(after, default=None)

    def retry_now(self, task_ids: Sequence[str]) -> list[str]:
        """Make retries still waiting for their time due now (an operator's "retry now"); the
        ids of those it changed (``retry_queries.RETRY_NOW``: never a terminal or cancelled task)."""
        rows = self._fetch(retry_queries.RETRY_NOW, {"task_ids": list(task_ids)})
        return [str(row["task_id"]) for row in rows]

    def undispatch(self, job_ids: Sequence[str]) -> int:
        """Put released jobs that could not be published back into the backlog."""
        return self._execute(backlog.UNDISPATCH, {"job_ids": list(job_ids)})

    def queued_counts(self, older_than_s: float) -> dict[str, tuple[int, int]]:
        """Per queue: (published jobs no worker holds, those of them older than ``older_than_s``)."""
        rows = self._rows(backlog.QUEUED_COUNTS, {"older_than_s": older_than_s}, typed_rows(QueueCount))
        return {row["queue"]: (int(row["queued"]), int(row["old"])) for row in rows}

    def broker_down(self, down: bool) -> None:
        """Record that the broker could not be reached (kept from the first failure on), or that
        it could again; the sweeper fails backlog jobs only after a long outage."""
        self._execute(queries.BROKER_DOWN if down else queries.BROKER_UP, {"job": queries.BROKER_DOWN_JOB})
