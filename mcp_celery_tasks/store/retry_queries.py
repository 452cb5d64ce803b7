"""The SQL of retries with backoff (``@tool(retry_on=…)``, ``ctx.retry_later``).

A retry **waits in the backlog**: the worker that saw a retryable error puts its job back among
the backlog's rows (``dispatched_at IS NULL``) with ``retry_at``, its "not before" time, and frees
its lease and its slot; the Celery message is done. No worker and no broker message holds the
wait. Rows with ``retry_at`` set are outside the backlog index (``store.backlog``), so the release
pass neither sees nor pays for them; every release pass that scans all queues first clears
``retry_at`` of the due ones (``RELEASE_DUE``, through ``ix_mcp_tasks_retry_wait``), and they
are then released like any job, in their owner's turn, oldest first.

The attempt stays counted (the claim counted it): a retry is an attempt, unlike a give-back.
"""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.lifecycle import ACTIVE, WORKING, sql_list

__all__ = ["RELEASE_DUE", "RETRY_NOW", "SCHEDULE_RETRY"]

_ACTIVE: Final = sql_list(ACTIVE)

# Fenced by the worker that holds the job, and only while attempts are left and nobody
# cancelled: a cancel that came first wins (the caller then records nothing). The last error
# is kept for admins (``error_kind``, ``error_message``); a later success clears them.
SCHEDULE_RETRY: Final[LiteralString] = f"""
UPDATE mcp_tasks
SET worker = NULL, lease_until = NULL, inbox = NULL, dispatched_at = NULL,
    retry_at = now() + %(delay_s)s * interval '1 second',
    status_message = %(message)s, last_updated_at = now(),
    error_kind = %(kind)s, error_message = %(detail)s
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status = '{WORKING}'
  AND cancel_requested_at IS NULL AND attempts < max_attempts
RETURNING task_id
"""

# Due retries join the backlog (``retry_at`` cleared: the backlog index now holds them); their
# status message stops counting down. Bounded, and skips rows another pass holds. The last row
# says in how many seconds the next retry falls due (NULL: none waits), so a publisher can wake
# then instead of at its next scan; the statement's snapshot does not see the rows it promoted.
RELEASE_DUE: Final[LiteralString] = f"""
WITH due AS (
    UPDATE mcp_tasks
    SET retry_at = NULL,
        status_message = regexp_replace(status_message, '^retrying in [^(]*[(]', 'retrying now (')
    WHERE task_id IN (
        SELECT task_id FROM mcp_tasks
        WHERE retry_at IS NOT NULL AND dispatched_at IS NULL AND status IN {_ACTIVE}
          AND retry_at <= now()
        ORDER BY retry_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AND retry_at IS NOT NULL AND dispatched_at IS NULL AND status IN {_ACTIVE}
    RETURNING queue
)
SELECT queue, NULL::float AS next_s FROM due
UNION ALL
SELECT NULL, (
    SELECT EXTRACT(EPOCH FROM (retry_at - now()))::float FROM mcp_tasks
    WHERE retry_at IS NOT NULL AND dispatched_at IS NULL AND status IN {_ACTIVE} AND retry_at > now()
    ORDER BY retry_at LIMIT 1
)
"""

# An operator's "retry now" (the Django admin): a retry still waiting for its time falls due at
# once, and the next release pass (each API process scans at least once a second) puts it in the
# backlog. Fenced like RELEASE_DUE: only rows still waiting, never a cancelled one, never a
# terminal task (its state is final); a retry already due, released or running is left alone.
RETRY_NOW: Final[LiteralString] = f"""
UPDATE mcp_tasks
SET retry_at = now(), last_updated_at = now()
WHERE task_id = ANY(%(task_ids)s)
  AND retry_at IS NOT NULL AND retry_at > now() AND dispatched_at IS NULL
  AND status IN {_ACTIVE} AND cancel_requested_at IS NULL
RETURNING task_id
"""
