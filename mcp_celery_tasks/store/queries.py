"""Every SQL statement the store runs, named, in one place.

Each change is one guarded statement (``UPDATE … WHERE status IN (…) [AND worker = …]``); a
status transition notifies ``mcp_task_events`` from the same statement, so the notification
is sent exactly when the transition commits. Nothing else uses NOTIFY.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Final, LiteralString

from mcp_celery_tasks.lifecycle import (
    ACTIVE,
    CANCELLED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    TERMINAL,
    WORKING,
    guard,
    sql_list,
)
from mcp_celery_tasks.store import limit_queries
from mcp_celery_tasks.store.records import ClaimedTask, InputRecord, TaskRecord

__all__ = ["CLAIMED_COLUMNS", "INPUT_COLUMNS", "NOTIFY_CHANNEL", "TASK_COLUMNS"]


def _columns(record: type, *computed: str) -> str:
    """The record's fields as a column list, in order (rows map onto records by name, psycopg's
    ``class_row``, or by position, ``args_row``); ``computed`` fields are spelled out by each
    query, after the list."""
    return ", ".join(f.name for f in fields(record) if f.name not in computed)


NOTIFY_CHANNEL: Final = "mcp_task_events"
"""Every status transition notifies this channel with the task id (``db`` re-exports it; that
module is the schema for Alembic and loads SQLAlchemy, which no API or worker needs)."""

TASK_COLUMNS: Final = _columns(TaskRecord, "db_now")
CLAIMED_COLUMNS: Final = _columns(ClaimedTask, "age_s", "resumed_for_s")
INPUT_COLUMNS: Final = _columns(InputRecord)

_EXPIRES: Final = "now() + retention_ms * interval '1 millisecond'"
ACTIVE_SQL: Final = sql_list(ACTIVE)
TERMINAL_SQL: Final = sql_list(TERMINAL)
TO_CANCELLED: Final = guard(CANCELLED)
TO_FAILED: Final = guard(FAILED)

# The row, unless the owner already has ``max_active`` tasks working or waiting for input (the
# active-tasks quota; NULL: no limit). Concurrent creates may overshoot it by a few: it bounds
# a noisy caller, it is not an invariant. ``db_now`` is the transaction's time, which is the row's
# ``created_at``: a new task has run for 0 ms, however late in its transaction the insert came.
_INSERT_TASK: Final = f"""
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, preflight, status, status_message,
    ttl_ms, retention_ms, poll_interval_ms, queue, max_attempts, protocol_version,
    client_capabilities, client_info, session_id, log_level, idempotency_key, request_digest, synchronous,
    concurrency_group, concurrency_limit)
SELECT %(task_id)s, %(job_id)s, %(owner)s, %(tool_name)s, %(arguments)s, %(preflight)s, '{WORKING}',
    %(status_message)s, %(ttl_ms)s, %(retention_ms)s, %(poll_interval_ms)s, %(queue)s,
    %(max_attempts)s, %(protocol_version)s, %(client_capabilities)s, %(client_info)s, %(session_id)s,
    %(log_level)s, %(idempotency_key)s, %(request_digest)s, %(synchronous)s,
    %(concurrency_group)s, %(concurrency_limit)s
WHERE (SELECT ok FROM active_ok)"""
# Counted once per statement (the shared bucket below takes no token when this refuses).
_ACTIVE_OK: Final = f"""active_ok AS (
    SELECT (%(max_active)s::int IS NULL OR (
        SELECT count(*) FROM (
            SELECT 1 FROM mcp_tasks WHERE owner = %(owner)s AND status IN {ACTIVE_SQL} LIMIT %(max_active)s
        ) AS active
    ) < %(max_active)s) AS ok
)"""
_LIVE_KEY: Final = """owner = %(owner)s AND idempotency_key = %(idempotency_key)s
  AND (expires_at IS NULL OR expires_at > statement_timestamp())"""
_KEY_CONFLICT: Final = "ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"


CREATE_TASK: Final[LiteralString] = f"""WITH {_ACTIVE_OK}, {limit_queries.TAKE_TOKEN.format(only="")}
{_INSERT_TASK} {limit_queries.TOKEN_TAKEN}
{_KEY_CONFLICT}
RETURNING {TASK_COLUMNS}, now() AS db_now
"""


# A keyed create in one round trip: the owner's live task under the key, else the new row. No
# row at all: the quota refused it, a concurrent call's insert won the index (read it), or an
# expired row still holds the key (``RELEASE_KEY``, then again).
CREATE_KEYED_TASK: Final[LiteralString] = f"""
WITH found AS (
    SELECT {TASK_COLUMNS}, statement_timestamp() AS db_now FROM mcp_tasks WHERE {_LIVE_KEY}
), {_ACTIVE_OK}, {limit_queries.TAKE_TOKEN.format(only=" AND NOT EXISTS (SELECT 1 FROM found)")}, created AS (
    {_INSERT_TASK} AND NOT EXISTS (SELECT 1 FROM found) {limit_queries.TOKEN_TAKEN}
    {_KEY_CONFLICT}
    RETURNING {TASK_COLUMNS}, now() AS db_now
)
SELECT * FROM created UNION ALL SELECT * FROM found
"""

# Idempotent calls: the owner's live task created under a key (an expired row, not yet
# collected, no longer holds its key: ``RELEASE_KEY`` frees it for a new task).
TASK_BY_KEY: Final[LiteralString] = f"""
SELECT {TASK_COLUMNS}, statement_timestamp() AS db_now FROM mcp_tasks WHERE {_LIVE_KEY}
"""

RELEASE_KEY: Final[LiteralString] = """
UPDATE mcp_tasks SET idempotency_key = NULL
WHERE owner = %(owner)s AND idempotency_key = %(idempotency_key)s AND expires_at <= statement_timestamp()
RETURNING task_id
"""

GET_TASK: Final[LiteralString] = f"""
SELECT {TASK_COLUMNS}, statement_timestamp() AS db_now
FROM mcp_tasks WHERE task_id = %(task_id)s AND owner = %(owner)s
"""

GET_TASKS: Final[LiteralString] = f"""
SELECT {TASK_COLUMNS}, statement_timestamp() AS db_now
FROM mcp_tasks WHERE task_id = ANY(%(task_ids)s)
"""

# What the event hub compares to notice a change that sent no NOTIFY (statusMessage, progress,
# logs): a few narrow columns, not the row with its arguments and result.
TASK_STATES: Final[LiteralString] = """
SELECT task_id, status, status_message, last_updated_at, log_seq, finished_at
FROM mcp_tasks WHERE task_id = ANY(%(task_ids)s)
"""

OUTSTANDING_INPUTS: Final[LiteralString] = f"""
SELECT {INPUT_COLUMNS}
FROM mcp_task_inputs
WHERE task_id = %(task_id)s AND response IS NULL AND NOT superseded
ORDER BY requested_at, key
"""

# The one cancel (tasks/cancel, the synchronous caller leaving, an admin): the spec lets the
# status become cancelled at once; the worker's late result is then dropped by its guarded
# update. ``ref`` is a task id, or a job id when ``by_job``; ``owner`` NULL means any owner (an
# admin). Returns what the caller needs to wake the worker: the previous status and the inbox.
CANCEL: Final[LiteralString] = f"""
WITH prev AS (
    SELECT task_id, status FROM mcp_tasks
    WHERE (task_id = %(ref)s OR (%(by_job)s AND job_id = %(ref)s))
      AND (%(owner)s::text IS NULL OR owner = %(owner)s::text) AND {TO_CANCELLED}
    FOR UPDATE
), upd AS (
    UPDATE mcp_tasks t
    SET status = '{CANCELLED}', cancel_requested_at = now(), last_updated_at = now(),
        expires_at = {_EXPIRES}, status_message = %(message)s,
        -- A suspended task, or a retry waiting for its time, has no process to stop: it stopped
        -- the moment it was cancelled.
        finished_at = CASE WHEN (t.suspended_at IS NOT NULL OR t.retry_at IS NOT NULL) AND t.worker IS NULL
                           THEN now()
                           ELSE t.finished_at END
    FROM prev
    WHERE t.task_id = prev.task_id AND t.{TO_CANCELLED}
    RETURNING t.task_id, t.job_id, t.inbox, t.tool_name, prev.status AS previous_status
), gone AS (
    -- Outstanding input requests vanish with the task (SPEC-CHECKLIST Q-25).
    UPDATE mcp_task_inputs i SET superseded = true FROM upd
    WHERE i.task_id = upd.task_id AND i.response IS NULL AND NOT i.superseded
    RETURNING i.key
)
SELECT upd.*, (SELECT count(*) FROM gone) AS inputs_dropped, pg_notify('{NOTIFY_CHANNEL}', upd.task_id)
FROM upd
"""

TASK_EXISTS: Final[LiteralString] = """
SELECT 1 FROM mcp_tasks WHERE task_id = %(task_id)s AND owner = %(owner)s
"""

MARK_DISPATCHED: Final[LiteralString] = """
UPDATE mcp_tasks SET dispatched_at = now()
WHERE job_id = ANY(%(job_ids)s) AND dispatched_at IS NULL
"""

# ---- worker side -------------------------------------------------------------------------

# When a lease counts as lapsed: ``grace_s`` after it ran out, and never earlier than
# ``grace_s`` after this server started. A lease that ran out while Postgres was down (restarted,
# or in recovery) lapsed while nobody could renew it: a live worker renews within a second of
# the database coming back, so its job is not taken from it. ``pg_postmaster_start_time()``
# is when this server process started: it covers restarts and crashes, not a failover to a
# standby that was already running (there the sweeper's own gap memory is what holds back).
_LEASE_LAPSED: Final = (
    "GREATEST(lease_until, pg_postmaster_start_time()) < now() - %(grace_s)s * interval '1 second'"
)

CLAIM: Final[LiteralString] = f"""
UPDATE mcp_tasks
SET worker = %(worker)s, lease_until = now() + %(lease_s)s * interval '1 second',
    attempts = attempts + 1, started_at = COALESCE(started_at, now()), device = %(device)s
WHERE job_id = %(job_id)s AND status IN {ACTIVE_SQL} AND cancel_requested_at IS NULL
  -- A suspended job runs again only once its answers are in (they clear suspended_at).
  AND suspended_at IS NULL
  -- A retry runs no sooner than its time (a stale message of the last attempt must not start it).
  AND retry_at IS NULL
  -- Free (never claimed, or given back: worker NULL), lapsed, or ours already.
  AND (lease_until IS NULL OR worker IS NULL OR {_LEASE_LAPSED} OR worker = %(worker)s)
  AND attempts < max_attempts AND redeliveries < %(max_redeliveries)s
RETURNING {CLAIMED_COLUMNS}, EXTRACT(EPOCH FROM (now() - created_at))::float AS age_s,
    EXTRACT(EPOCH FROM (now() - resumed_at))::float AS resumed_for_s
"""

JOB_STATE: Final[LiteralString] = """
SELECT task_id, status, attempts, max_attempts, redeliveries, worker,
       CASE WHEN worker IS NULL OR lease_until IS NULL THEN 0 ELSE GREATEST(0, EXTRACT(EPOCH FROM (
           GREATEST(lease_until, pg_postmaster_start_time()) + %(grace_s)s * interval '1 second' - now()
       )))::float END AS lease_left_s
FROM mcp_tasks WHERE job_id = %(job_id)s
"""

# The claim refused because every attempt was used: fail the task with a clear error.
FAIL_EXHAUSTED: Final[LiteralString] = f"""
WITH upd AS (
    UPDATE mcp_tasks
    SET status = '{FAILED}', error = %(error)s, status_message = %(message)s,
        error_kind = %(kind)s, error_message = %(message)s,
        last_updated_at = now(), finished_at = now(), expires_at = {_EXPIRES}, lease_until = NULL
    WHERE job_id = %(job_id)s AND {TO_FAILED}
      AND (attempts >= max_attempts OR redeliveries >= %(max_redeliveries)s)
      AND (lease_until IS NULL OR worker IS NULL OR lease_until < now())
    RETURNING task_id
)
SELECT task_id, pg_notify('{NOTIFY_CHANNEL}', task_id) FROM upd
"""

RENEW_LEASE: Final[LiteralString] = f"""
UPDATE mcp_tasks SET lease_until = now() + %(lease_s)s * interval '1 second'
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {ACTIVE_SQL}
RETURNING status
"""

CHECKPOINT: Final[LiteralString] = """
SELECT status, worker FROM mcp_tasks WHERE task_id = %(task_id)s
"""

# A report without numbers keeps the last ones: progress only ever moves forward.
REPORT: Final[LiteralString] = f"""
UPDATE mcp_tasks SET status_message = %(message)s, last_updated_at = now(),
    progress = COALESCE(%(progress)s, progress), progress_total = COALESCE(%(total)s, progress_total)
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {ACTIVE_SQL}
RETURNING status
"""

# One log message for the synchronous caller, numbered within its task; at most ``max_logs``
# per task (the rest stay in the worker log only).
LOG: Final[LiteralString] = f"""
WITH counted AS (
    UPDATE mcp_tasks SET log_seq = log_seq + 1
    WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {ACTIVE_SQL}
      AND log_seq < %(max_logs)s
    RETURNING log_seq
)
INSERT INTO mcp_task_logs (task_id, seq, level, logger, data)
SELECT %(task_id)s, log_seq, %(level)s, %(logger)s, %(data)s FROM counted
RETURNING seq
"""

LOGS_AFTER: Final[LiteralString] = """
SELECT seq, level, logger, data FROM mcp_task_logs
WHERE task_id = %(task_id)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s
"""

FINISH: Final[LiteralString] = f"""
WITH upd AS (
    UPDATE mcp_tasks
    SET status = %(status)s, result = %(result)s, error = %(error)s,
        error_kind = %(error_kind)s, error_message = %(error_message)s,
        -- A finished task says how it ended, never its last progress text ("computing x").
        status_message = %(message)s,
        last_updated_at = now(), finished_at = now(), expires_at = {_EXPIRES}, lease_until = NULL
    WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {ACTIVE_SQL}
    RETURNING task_id
)
SELECT task_id, pg_notify('{NOTIFY_CHANNEL}', task_id) FROM upd
"""

# ---- the watchdog (a prefork worker's main process) --------------------------------------------

UNATTENDED_STOP: Final = "nobody was running the job any more"
"""The ``stop_reason`` of a cancelled job the sweeper ended (``END_UNATTENDED_STOPS``)."""

# Every job the pool children run: renew the leases the listed children hold (once a third of
# the lease is used up), and read each row as the watchdog sees it. ``holder`` is the worker
# identity the child claimed the job as (``host:pid:nonce``, told at the claim: ``claims``), or
# its prefix ``host:pid:`` when the child has not said.
WATCH_JOBS: Final[LiteralString] = f"""
WITH j AS (
    SELECT * FROM jsonb_to_recordset(%(jobs)s) AS x(job_id text, holder text, renew boolean)
), renewed AS (
    UPDATE mcp_tasks t SET lease_until = now() + %(lease_s)s * interval '1 second'
    FROM j
    WHERE t.job_id = j.job_id AND j.renew AND starts_with(t.worker, j.holder)
      -- A cancelled job keeps its lease while its process lives, until it stops (by itself or
      -- killed after its cancel grace): the sweeper must not end it as nobody's meanwhile.
      AND (t.status IN {ACTIVE_SQL} OR (t.status = '{CANCELLED}' AND t.finished_at IS NULL))
      AND (t.lease_until IS NULL OR t.lease_until < now() + %(lease_s)s * interval '1 second' * 2 / 3)
    RETURNING t.job_id
)
SELECT t.job_id, j.holder, t.task_id, t.tool_name, t.status,
       -- Stopped by the child (or a watchdog), not ended by the sweeper, which can be wrong:
       -- a lease that lapsed while the database was out of reach says nothing of the process.
       t.finished_at IS NOT NULL AND t.stop_reason IS DISTINCT FROM '{UNATTENDED_STOP}' AS finished,
       starts_with(COALESCE(t.worker, ''), j.holder) AS ours, t.worker IS NULL AS released,
       EXTRACT(EPOCH FROM (now() - t.cancel_requested_at))::float AS cancelled_for_s
FROM mcp_tasks t JOIN j ON t.job_id = j.job_id
"""

# A limit stopped the job: the task ends completed with a tool error naming it (fenced by the
# child that ran it).
FORCE_FINISH: Final[LiteralString] = f"""
WITH upd AS (
    UPDATE mcp_tasks
    SET status = '{COMPLETED}', result = %(result)s, error = NULL, status_message = NULL,
        error_kind = %(kind)s, error_message = %(message)s, stop_reason = %(reason)s,
        last_updated_at = now(), finished_at = now(), expires_at = {_EXPIRES}, lease_until = NULL
    WHERE task_id = %(task_id)s AND starts_with(worker, %(holder)s) AND status IN {ACTIVE_SQL}
    RETURNING task_id
)
SELECT task_id, pg_notify('{NOTIFY_CHANNEL}', task_id) FROM upd
"""

# A cancelled job that did not stop by itself: its process is being killed.
FORCE_STOPPED: Final[LiteralString] = f"""
UPDATE mcp_tasks SET finished_at = now(), lease_until = NULL, stop_reason = %(reason)s
WHERE task_id = %(task_id)s AND starts_with(worker, %(holder)s)
  AND (finished_at IS NULL OR stop_reason = '{UNATTENDED_STOP}') AND status IN {TERMINAL_SQL}
RETURNING task_id
"""

# The task was cancelled under a running job: record that the worker really stopped.
MARK_STOPPED: Final[LiteralString] = f"""
UPDATE mcp_tasks SET finished_at = now(), lease_until = NULL
WHERE task_id = %(task_id)s AND worker = %(worker)s AND finished_at IS NULL
  AND status IN {TERMINAL_SQL}
"""

# The worker gives the job back (it is being stopped, or an outage hit the job): the run is not
# an attempt, it is a redelivery; the lease is free at once (worker NULL) and, should the broker
# lose the message meanwhile, already lapsed for the sweeper.
GIVE_BACK: Final[LiteralString] = f"""
UPDATE mcp_tasks
SET worker = NULL, lease_until = now(), attempts = GREATEST(attempts - 1, 0),
    redeliveries = redeliveries + 1
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {ACTIVE_SQL}
RETURNING task_id
"""

# The job gives its slot back while it waits for input (suspend): the lease is released, the
# attempt uncounted (a suspend is neither an attempt nor a redelivery), the inbox forgotten (no
# process waits on it). Only while a question is still outstanding: an answer that landed first
# (the task is working again) keeps the job resident, and it reads the answer.
SUSPEND: Final[LiteralString] = f"""
UPDATE mcp_tasks
SET worker = NULL, lease_until = NULL, inbox = NULL, suspended_at = now(),
    suspensions = suspensions + 1, attempts = GREATEST(attempts - 1, 0)
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status = '{INPUT_REQUIRED}'
  AND cancel_requested_at IS NULL
  AND EXISTS (SELECT 1 FROM mcp_task_inputs i
              WHERE i.task_id = %(task_id)s AND i.response IS NULL AND NOT i.superseded)
  -- Counted up to the cap only (a principal with 10,000 suspended tasks costs no more).
  AND (%(max_suspended)s <= 0 OR (
      SELECT count(*) FROM (
          SELECT 1 FROM mcp_tasks s
          WHERE s.owner = mcp_tasks.owner AND s.suspended_at IS NOT NULL AND s.status IN {ACTIVE_SQL}
          LIMIT %(max_suspended)s
      ) capped
  ) < %(max_suspended)s)
RETURNING task_id
"""

# Other jobs of the task's queue wait for a worker slot (in the backlog or in the broker), or its
# principal already holds ``max_waiting`` resident waits there: a job waiting for input then
# suspends at once (capacity-based eviction, as Hatchet's). Index probes only. Work counts once it
# has waited ``grace_s``: a job created or published a moment ago is usually taken by a free slot
# within milliseconds, and evicting for it would re-run a wait nobody needed to give up.
SUSPEND_NOW: Final[LiteralString] = f"""
SELECT EXISTS (
    SELECT 1 FROM mcp_tasks b
    WHERE b.queue = t.queue AND b.dispatched_at IS NULL AND b.retry_at IS NULL AND b.status IN {ACTIVE_SQL}
      AND b.created_at < now() - %(grace_s)s * interval '1 second'
) OR EXISTS (
    SELECT 1 FROM mcp_tasks q
    WHERE q.queue = t.queue AND q.dispatched_at IS NOT NULL AND q.suspended_at IS NULL
      AND q.status IN {ACTIVE_SQL} AND q.lease_until IS NULL AND q.task_id <> t.task_id
      AND q.dispatched_at < now() - %(grace_s)s * interval '1 second'
) OR (
    SELECT count(*) FROM mcp_tasks w
    WHERE w.queue = t.queue AND w.owner = t.owner AND w.status = '{INPUT_REQUIRED}'
      AND w.suspended_at IS NULL AND w.task_id <> t.task_id
) >= NULLIF(COALESCE(l.max_waiting_inputs, %(max_waiting)s), 0) AS now
FROM mcp_tasks t LEFT JOIN mcp_principal_limits l ON l.principal = t.owner
WHERE t.task_id = %(task_id)s
"""

# Suspended tasks nobody answered within ``suspended_input_timeout_seconds``: they end as a
# tool error, as a resident wait that timed out would (``InputTimedOut``).
EXPIRE_SUSPENDED: Final[LiteralString] = f"""
WITH upd AS (
    UPDATE mcp_tasks
    SET status = '{COMPLETED}', result = %(result)s, error = NULL, status_message = NULL,
        error_kind = 'input_timeout', error_message = %(message)s,
        last_updated_at = now(), finished_at = now(), expires_at = {_EXPIRES}
    WHERE task_id IN (
        SELECT task_id FROM mcp_tasks
        WHERE suspended_at IS NOT NULL AND status IN {ACTIVE_SQL}
          AND suspended_at < now() - %(older_than_s)s * interval '1 second'
        ORDER BY suspended_at LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AND suspended_at IS NOT NULL AND status IN {ACTIVE_SQL}
    RETURNING task_id
), gone AS (
    UPDATE mcp_task_inputs i SET superseded = true FROM upd
    WHERE i.task_id = upd.task_id AND i.response IS NULL AND NOT i.superseded
    RETURNING i.key
)
SELECT task_id, pg_notify('{NOTIFY_CHANNEL}', task_id) FROM upd
"""

# ``stopping`` that nobody will end: a cancelled task whose job was never claimed, was given
# back, or whose worker's lease lapsed (the process died) gets its finished_at from the sweeper.
END_UNATTENDED_STOPS: Final[LiteralString] = f"""
UPDATE mcp_tasks
SET finished_at = now(), lease_until = NULL,
    stop_reason = COALESCE(stop_reason, '{UNATTENDED_STOP}')
WHERE status = '{CANCELLED}' AND finished_at IS NULL
  AND (worker IS NULL OR lease_until IS NULL OR {_LEASE_LAPSED})
RETURNING task_id
"""

# ---- maintenance -------------------------------------------------------------------------

GC_LOCK_KEY: Final = 0x6D6370_7463  # "mcptc"

TRY_GC_LOCK: Final[LiteralString] = "SELECT pg_try_advisory_xact_lock(%(key)s)"

DELETE_EXPIRED: Final[LiteralString] = """
DELETE FROM mcp_tasks WHERE task_id IN (
    SELECT task_id FROM mcp_tasks
    WHERE expires_at < now() AND (lease_until IS NULL OR lease_until < now())
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
"""

UNDISPATCHED: Final[LiteralString] = f"""
SELECT job_id, queue FROM mcp_tasks
WHERE dispatched_at IS NULL AND retry_at IS NULL AND status IN {ACTIVE_SQL}
  AND created_at < now() - %(older_than_s)s * interval '1 second'
ORDER BY created_at
LIMIT %(limit)s
"""

# Published long ago and held by no worker (never started, or handed back after a lost lease):
# re-stamped so the next sweep waits as long again.
_UNSTARTED_SINCE: Final[LiteralString] = f"""
    status IN {ACTIVE_SQL} AND lease_until IS NULL AND suspended_at IS NULL
      AND dispatched_at < now() - %(older_than_s)s * interval '1 second'"""

# The queues that hold such jobs (the sweeper asks the broker how many messages wait in each).
UNSTARTED_QUEUES: Final[LiteralString] = f"""
SELECT DISTINCT queue FROM mcp_tasks WHERE {_UNSTARTED_SINCE}
"""

# Re-stamped, so the next sweep waits a whole period; ``queue`` NULL means every queue.
UNSTARTED: Final[LiteralString] = f"""
UPDATE mcp_tasks SET dispatched_at = now()
WHERE task_id IN (
    SELECT task_id FROM mcp_tasks
    WHERE {_UNSTARTED_SINCE}
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    ORDER BY dispatched_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING job_id, queue
"""

# A lapsed lease (its worker died) is handed back once: the lease cleared and the job stamped
# as published now, so it counts as queued and the next sweep does not publish it again.
LOST_LEASES: Final[LiteralString] = f"""
UPDATE mcp_tasks SET lease_until = NULL, dispatched_at = now()
WHERE task_id IN (
    SELECT task_id FROM mcp_tasks
    WHERE status IN {ACTIVE_SQL} AND lease_until IS NOT NULL AND {_LEASE_LAPSED}
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AND lease_until IS NOT NULL AND {_LEASE_LAPSED}
RETURNING job_id, queue
"""

# ---- input requests ------------------------------------------------------------------------

ALL_INPUTS: Final[LiteralString] = f"""
SELECT {INPUT_COLUMNS}
FROM mcp_task_inputs WHERE task_id = %(task_id)s
"""

# Ask: the input rows, the inbox and input_required in one statement (one transaction), fenced
# by the worker. Rows that already exist (a re-run asking again) are left as they are.
OPEN_INPUTS: Final[LiteralString] = f"""
WITH t AS (
    UPDATE mcp_tasks
    SET status = '{INPUT_REQUIRED}', inbox = %(inbox)s, last_updated_at = now()
    -- working -> input_required, or a re-run asking again while the task already waits
    WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {ACTIVE_SQL}
    RETURNING task_id
), sup AS (
    UPDATE mcp_task_inputs SET superseded = true
    WHERE task_id = (SELECT task_id FROM t) AND key = ANY(%(supersede)s) AND response IS NULL
    RETURNING key
), ins AS (
    INSERT INTO mcp_task_inputs (task_id, key, method, params, params_hash)
    SELECT t.task_id, x.key, x.method, x.params, x.params_hash
    FROM t, jsonb_to_recordset(%(items)s) AS x(key text, method text, params jsonb, params_hash text)
    ON CONFLICT (task_id, key) DO NOTHING
    RETURNING key
)
SELECT t.task_id, (SELECT count(*) FROM ins) AS inserted, (SELECT count(*) FROM sup) AS superseded,
       pg_notify('{NOTIFY_CHANNEL}', t.task_id)
FROM t
"""

# While blocked: is the task still ours, and which of our keys have answers?
INPUT_STATE: Final[LiteralString] = """
SELECT t.status, t.worker,
       COALESCE((SELECT jsonb_object_agg(i.key, i.response) FROM mcp_task_inputs i
                 WHERE i.task_id = t.task_id AND i.key = ANY(%(keys)s) AND i.response IS NOT NULL),
                '{}'::jsonb) AS answers
FROM mcp_tasks t WHERE t.task_id = %(task_id)s
"""

# The wait ran out: the keys are superseded (never answered later) and the task works again.
EXPIRE_INPUTS: Final[LiteralString] = f"""
WITH sup AS (
    UPDATE mcp_task_inputs SET superseded = true
    WHERE task_id = %(task_id)s AND key = ANY(%(keys)s) AND response IS NULL
    RETURNING key
), t AS (
    UPDATE mcp_tasks SET status = '{WORKING}', last_updated_at = now()
    WHERE task_id = %(task_id)s AND worker = %(worker)s AND status = '{INPUT_REQUIRED}'
      AND NOT EXISTS (SELECT 1 FROM mcp_task_inputs i WHERE i.task_id = %(task_id)s
                      AND i.response IS NULL AND NOT i.superseded AND NOT (i.key = ANY(%(keys)s)))
    RETURNING task_id
)
SELECT (SELECT count(*) FROM sup) AS superseded, (SELECT count(*) FROM t) AS resumed,
       (SELECT pg_notify('{NOTIFY_CHANNEL}', task_id) FROM t) AS notified
"""

LOCK_TASK: Final[LiteralString] = "SELECT 1 FROM mcp_tasks WHERE task_id = %(task_id)s FOR UPDATE"

# tasks/update: record answers to outstanding keys; when none remain, back to working in the same
# statement, so the next tasks/get never shows an answered key (SEP-2663 S-27, S-29).
RECORD_ANSWERS: Final[LiteralString] = f"""
WITH ans AS (
    UPDATE mcp_task_inputs i SET response = x.response, answered_at = now()
    FROM jsonb_to_recordset(%(answers)s) AS x(key text, response jsonb)
    WHERE i.task_id = %(task_id)s AND i.key = x.key AND i.response IS NULL AND NOT i.superseded
    RETURNING i.key
), remaining AS (
    SELECT count(*) AS n FROM mcp_task_inputs i
    WHERE i.task_id = %(task_id)s AND i.response IS NULL AND NOT i.superseded
      AND i.key NOT IN (SELECT key FROM ans)
), t AS (
    UPDATE mcp_tasks
    SET status = CASE WHEN (SELECT n FROM remaining) = 0 THEN '{WORKING}' ELSE status END,
        last_updated_at = now(),
        -- A suspended job whose last question is answered goes back to the fair backlog (in this
        -- transaction): released like a new job, it runs again and replays the answers.
        dispatched_at = CASE WHEN (SELECT n FROM remaining) = 0 AND suspended_at IS NOT NULL
                             THEN NULL ELSE dispatched_at END,
        resumed_at = CASE WHEN (SELECT n FROM remaining) = 0 AND suspended_at IS NOT NULL
                          THEN now() ELSE resumed_at END,
        suspended_at = CASE WHEN (SELECT n FROM remaining) = 0 THEN NULL ELSE suspended_at END
    FROM (SELECT suspended_at AS was FROM mcp_tasks WHERE task_id = %(task_id)s) AS old
    WHERE task_id = %(task_id)s AND status = '{INPUT_REQUIRED}' AND EXISTS (SELECT 1 FROM ans)
    RETURNING task_id, inbox, status, job_id, queue,
              old.was IS NOT NULL AND status = '{WORKING}' AS resumed
)
SELECT (SELECT count(*) FROM ans) AS answered, t.inbox, t.status, t.job_id, t.queue,
       COALESCE(t.resumed, false) AS resumed,
       CASE WHEN t.status = '{WORKING}' THEN pg_notify('{NOTIFY_CHANNEL}', t.task_id) END AS notified
FROM (SELECT 1) AS one LEFT JOIN t ON true
"""

# ---- outbox and maintenance bookkeeping ---------------------------------------------------


FAIL_UNDISPATCHED: Final[LiteralString] = f"""
WITH upd AS (
    UPDATE mcp_tasks
    SET status = '{FAILED}', error = %(error)s, status_message = %(message)s, last_updated_at = now(),
        error_kind = 'not_queued', error_message = %(message)s,
        finished_at = now(), expires_at = {_EXPIRES}
    -- A retry waiting for its time is not a job the broker refused.
    WHERE dispatched_at IS NULL AND retry_at IS NULL AND {TO_FAILED}
      AND created_at < now() - %(older_than_s)s * interval '1 second'
    RETURNING task_id
)
SELECT task_id, pg_notify('{NOTIFY_CHANNEL}', task_id) FROM upd
"""

RECORD_RUN: Final[LiteralString] = """
INSERT INTO mcp_maintenance (job, last_run_at, last_count) VALUES (%(job)s, now(), %(count)s)
ON CONFLICT (job) DO UPDATE SET last_run_at = now(), last_count = EXCLUDED.last_count
"""

BROKER_DOWN_JOB: Final = "broker-down"
"""The maintenance row that says since when publishing has failed (absent: the broker is fine)."""

BROKER_DOWN: Final[LiteralString] = """
INSERT INTO mcp_maintenance (job, last_run_at, last_count) VALUES (%(job)s, now(), 0)
ON CONFLICT (job) DO NOTHING
"""

BROKER_UP: Final[LiteralString] = "DELETE FROM mcp_maintenance WHERE job = %(job)s"

SECONDS_SINCE_RUN: Final[LiteralString] = """
SELECT EXTRACT(EPOCH FROM (now() - last_run_at))::float AS seconds FROM mcp_maintenance WHERE job = %(job)s
"""
