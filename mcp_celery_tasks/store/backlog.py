"""The SQL of fair dispatch: the backlog in Postgres, released round-robin by principal.

A job is in one of three places. The **backlog**: active, never published (``dispatched_at IS
NULL``). **Queued**: published and waiting for a worker (active, ``dispatched_at`` set, no lease):
at most ``dispatch_ahead`` per queue, plus redeliveries. **Running**: claimed (a lease), working or
blocked on input. The publisher releases jobs from the backlog while fewer than ``dispatch_ahead``
are queued, picking each time the principal with the fewest jobs in flight (queued plus running)
and, within a principal, the oldest job (``RELEASE``). Principals with ``max_waiting_inputs`` jobs
blocked on input in the queue are skipped until one is answered.

Every statement reads through the partial indexes ``ix_mcp_tasks_backlog`` (queue, owner,
created_at) and ``ix_mcp_tasks_inflight`` (queue, owner): a pass costs the number of principals
with a backlog plus the jobs in flight, never the size of the backlog.

**Concurrency limits** (``tools.concurrency``) are applied in the same pass: a job whose group is
full is skipped, so it waits in the backlog holding no slot and no broker message.

**Retries** waiting for their time (``retry_at`` set, ``store.retry_queries``) are backlog rows
left out of the backlog index: every backlog predicate here says ``retry_at IS NULL`` (the
index's predicate), and the release pass first clears ``retry_at`` of the due ones.
"""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.lifecycle import ACTIVE, sql_list

__all__ = [
    "ASYNC_COMMIT",
    "BACKLOG_QUEUES",
    "LOCK_QUEUE",
    "LOCK_WAITING",
    "NO_JIT",
    "QUEUED_COUNTS",
    "QUEUE_POSITION",
    "RELEASE",
    "RELEASE_LIMITED",
    "UNDISPATCH",
    "WAITING_QUOTA",
]

_ACTIVE: Final = sql_list(ACTIVE)

# The release's own transaction commits without waiting for the WAL flush (``SET LOCAL``: this
# transaction only; the pooled connection stays synchronous). A release lost in a Postgres crash
# leaves its jobs looking unpublished, so a later pass publishes them again: a duplicate message,
# which the claim turns away (a live lease or a terminal row). A claim's synchronous commit flushes
# the WAL up to itself, earlier releases included, so a job that started is never seen unreleased.
# Saves one flush per job on the create path (docs/PERFORMANCE.md, "Third round").
ASYNC_COMMIT: Final[LiteralString] = "SET LOCAL synchronous_commit = off"

# Nor is the release worth compiling: its estimate grows with the backlog (a concurrency group's
# room is a subquery per row looked at) and crosses ``jit_above_cost`` long before it costs a
# millisecond, and JIT then spends seconds compiling a statement that runs in a few (measured:
# 2.2 s of JIT for a 50 ms release past 10,000 jobs of a full group; tests/bench/concurrency_bench.py).
NO_JIT: Final[LiteralString] = "SET LOCAL jit = off"

# One release pass per queue at a time, across every API process and the sweeper.
LOCK_QUEUE: Final[LiteralString] = "SELECT pg_advisory_xact_lock(hashtext('mcp-dispatch:' || %(queue)s))"

# The queues with a backlog: a skip scan of the backlog index (one probe per queue).
BACKLOG_QUEUES: Final[LiteralString] = f"""
WITH RECURSIVE q AS (
    (SELECT queue FROM mcp_tasks WHERE dispatched_at IS NULL AND retry_at IS NULL AND status IN {_ACTIVE}
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM mcp_tasks t
            WHERE t.dispatched_at IS NULL AND t.retry_at IS NULL AND t.status IN {_ACTIVE}
              AND t.queue > q.queue
            ORDER BY t.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL LIMIT 1000
"""

# Whether the queue's backlog holds jobs of a limited tool (``ix_mcp_tasks_limited_backlog``: one
# probe of an index that is empty while no tool has a limit).
_LIMITED_WAITING: Final = f"""EXISTS (
    SELECT 1 FROM mcp_tasks WHERE queue = %(queue)s AND concurrency_limit IS NOT NULL
      AND dispatched_at IS NULL AND retry_at IS NULL AND status IN {_ACTIVE})"""

_OWNERS_INFLIGHT: Final = f"""
WITH RECURSIVE owners AS (
    (SELECT owner FROM mcp_tasks
     WHERE queue = %(queue)s AND dispatched_at IS NULL AND retry_at IS NULL AND status IN {_ACTIVE}
     ORDER BY owner LIMIT 1)
    UNION ALL
    SELECT (SELECT t.owner FROM mcp_tasks t
            WHERE t.queue = %(queue)s AND t.dispatched_at IS NULL AND t.retry_at IS NULL
              AND t.status IN {_ACTIVE} AND t.owner > o.owner
            ORDER BY t.owner LIMIT 1)
    FROM owners o WHERE o.owner IS NOT NULL
), inflight AS (
    SELECT owner, count(*) AS n,
           count(*) FILTER (WHERE status = 'input_required') AS waiting,
           count(*) FILTER (WHERE lease_until IS NULL) AS queued
    FROM mcp_tasks
    WHERE queue = %(queue)s AND dispatched_at IS NOT NULL AND suspended_at IS NULL
      AND status IN {_ACTIVE}
    GROUP BY owner
), free AS (
    SELECT GREATEST(0, %(ahead)s - COALESCE((SELECT sum(queued) FROM inflight), 0))::int AS n
), eligible AS (
    SELECT o.owner, COALESCE(i.n, 0) AS n
    FROM (SELECT owner FROM owners WHERE owner IS NOT NULL LIMIT 10000) o
    LEFT JOIN inflight i ON i.owner = o.owner
    LEFT JOIN mcp_principal_limits l ON l.principal = o.owner
    WHERE COALESCE(l.max_waiting_inputs, %(max_waiting)s) <= 0
       OR COALESCE(i.waiting, 0) < COALESCE(l.max_waiting_inputs, %(max_waiting)s)
)"""

_BACKLOG_ROW: Final = f"""t.queue = %(queue)s AND t.owner = e.owner
              AND t.dispatched_at IS NULL AND t.retry_at IS NULL AND t.status IN {_ACTIVE}"""

_MARK_AND_RETURN: Final = f"""upd AS (
    UPDATE mcp_tasks t SET dispatched_at = now()
    FROM picked
    WHERE t.task_id = picked.task_id AND t.dispatched_at IS NULL AND t.status IN {_ACTIVE}
    RETURNING t.job_id, t.queue, t.task_id, picked.turn, picked.created_at
)
-- In turn order: the broker hands them out first in, first out. Each row also says how much
-- room the queue had, how many candidates their groups held back, and whether jobs of limited
-- tools wait in the backlog; nothing released still gives one row (NULL job) with these."""

# Release up to ``ahead`` minus the queued jobs of ``queue``, round-robin by principal: a job's
# turn is its owner's jobs in flight plus its rank in the owner's backlog; lowest turn first,
# then the oldest. Marked published here, in the same statement; the caller publishes them (and
# puts back those it could not publish). A principal's override of ``max_waiting_inputs``
# (``mcp_principal_limits``) replaces ``max_waiting``; 0 means no limit.
#
# This statement leaves jobs of limited tools alone and says whether any wait (``limited``): the
# store then runs ``RELEASE_LIMITED`` for the queue, and keeps doing so while they do. A queue
# without them pays for concurrency limits one probe of an empty index and one NULL test per job
# looked at (tests/bench/concurrency_bench.py).
RELEASE: Final[LiteralString] = f"""{_OWNERS_INFLIGHT}, candidates AS (
    SELECT c.task_id, c.created_at, e.n + c.rank AS turn
    FROM eligible e CROSS JOIN free CROSS JOIN LATERAL (
        SELECT b.task_id, b.created_at, row_number() OVER (ORDER BY b.created_at, b.task_id) AS rank
        FROM (
            SELECT t.task_id, t.created_at FROM mcp_tasks t
            WHERE {_BACKLOG_ROW} AND t.concurrency_limit IS NULL
            ORDER BY t.created_at, t.task_id
            LIMIT free.n
        ) b
    ) c
    WHERE free.n > 0
), picked AS (
    SELECT task_id, turn, created_at FROM candidates
    ORDER BY turn, created_at, task_id LIMIT (SELECT n FROM free)
), {_MARK_AND_RETURN}
SELECT u.job_id, u.queue, f.n AS room, 0 AS held, {_LIMITED_WAITING} AS limited
FROM free f LEFT JOIN upd u ON true
ORDER BY u.turn, u.created_at, u.task_id
"""

# The room left in the group of backlog row ``t``: the limit in force (an admin's override of its
# group, else of every group of its tool, else the declared one) less the group's jobs in flight.
_GROUP_ROOM: Final = """(COALESCE(
        (SELECT l.concurrency FROM mcp_tool_limits l
         WHERE l.tool_name = t.tool_name AND l.concurrency_group = t.concurrency_group),
        (SELECT l.concurrency FROM mcp_tool_limits l
         WHERE l.tool_name = t.tool_name AND l.concurrency_group = '*'),
        t.concurrency_limit)
    - COALESCE((SELECT u.n FROM busy u
                WHERE u.tool_name = t.tool_name AND u.concurrency_group = t.concurrency_group), 0))"""

# ``RELEASE`` with concurrency limits (``tools.concurrency``): a job of a limited tool is a
# candidate only while its group (tool, ``concurrency_group``) has fewer jobs in flight than its
# limit, so jobs waiting for a full group are skipped before the per-owner LIMIT and never hide an
# eligible job behind them (a pass still walks past them: 10,000 of them cost ~20 ms). Within one
# pass a group takes at most its room, lowest turn first (principals take turns inside a group
# too); ``held`` counts the candidates left for that reason: the caller runs the pass again, since
# they may have kept other groups' jobs out of it.
RELEASE_LIMITED: Final[LiteralString] = f"""{_OWNERS_INFLIGHT}, busy AS MATERIALIZED (
    -- Concurrency groups with jobs in flight (``ix_mcp_tasks_concurrency``).
    SELECT tool_name, concurrency_group, count(*)::int AS n
    FROM mcp_tasks
    WHERE concurrency_limit IS NOT NULL AND dispatched_at IS NOT NULL AND suspended_at IS NULL
      AND status IN {_ACTIVE}
    GROUP BY tool_name, concurrency_group
), candidates AS (
    SELECT c.task_id, c.created_at, e.n + c.rank AS turn, c.tool_name, c.concurrency_group, c.group_room
    FROM eligible e CROSS JOIN free CROSS JOIN LATERAL (
        SELECT b.*, row_number() OVER (ORDER BY b.created_at, b.task_id) AS rank
        FROM (
            SELECT t.task_id, t.created_at, t.tool_name, t.concurrency_group,
                   CASE WHEN t.concurrency_limit IS NOT NULL THEN {_GROUP_ROOM} END AS group_room
            FROM mcp_tasks t
            WHERE {_BACKLOG_ROW}
              -- Evaluated left to right: a job of a tool without a limit costs one NULL test.
              AND (t.concurrency_limit IS NULL OR {_GROUP_ROOM} > 0)
            ORDER BY t.created_at, t.task_id
            LIMIT free.n
        ) b
    ) c
    WHERE free.n > 0
), ranked AS (
    SELECT c.task_id, c.turn, c.created_at, c.group_room, row_number() OVER (
        PARTITION BY c.tool_name, c.concurrency_group ORDER BY c.turn, c.created_at, c.task_id
    ) AS group_rank
    FROM candidates c WHERE c.group_room IS NOT NULL
), picked AS (
    SELECT task_id, turn, created_at FROM (
        SELECT task_id, turn, created_at FROM candidates WHERE group_room IS NULL
        UNION ALL
        SELECT task_id, turn, created_at FROM ranked WHERE group_rank <= group_room
    ) p
    ORDER BY turn, created_at, task_id LIMIT (SELECT n FROM free)
), {_MARK_AND_RETURN}
SELECT u.job_id, u.queue, f.n AS room,
       (SELECT count(*) FROM ranked WHERE group_rank > group_room)::int AS held,
       {_LIMITED_WAITING} AS limited
FROM free f LEFT JOIN upd u ON true
ORDER BY u.turn, u.created_at, u.task_id
"""

# Jobs the publisher could not publish go back to the backlog (same place in line: created_at).
UNDISPATCH: Final[LiteralString] = """
UPDATE mcp_tasks SET dispatched_at = NULL
WHERE job_id = ANY(%(job_ids)s) AND lease_until IS NULL AND started_at IS NULL
"""

# Per queue: published jobs no worker holds (they should be in the broker), and how many of
# them were published more than ``older_than_s`` ago.
QUEUED_COUNTS: Final[LiteralString] = f"""
SELECT queue, count(*) AS queued,
       count(*) FILTER (WHERE dispatched_at < now() - %(older_than_s)s * interval '1 second') AS old
FROM mcp_tasks
WHERE dispatched_at IS NOT NULL AND suspended_at IS NULL AND status IN {_ACTIVE} AND lease_until IS NULL
GROUP BY queue
"""

# A task's place in line, for its statusMessage while it waits in the backlog. Round-robin
# estimate: ``mine`` earlier jobs of its owner are ahead, and from every other principal with a
# backlog as many as that plus one (or its whole backlog if shorter), plus the queued jobs.
# Bounded: at most ``cap`` rows are counted per principal and 50 principals are looked at.
QUEUE_POSITION: Final[LiteralString] = f"""
WITH RECURSIVE me AS (
    SELECT task_id, queue, owner, created_at FROM mcp_tasks
    WHERE task_id = %(task_id)s AND dispatched_at IS NULL AND retry_at IS NULL AND status IN {_ACTIVE}
), mine AS (
    SELECT count(*)::int AS n FROM (
        SELECT 1 FROM mcp_tasks t, me
        WHERE t.queue = me.queue AND t.owner = me.owner AND t.dispatched_at IS NULL AND t.retry_at IS NULL
          AND t.status IN {_ACTIVE} AND (t.created_at, t.task_id) < (me.created_at, me.task_id)
        LIMIT %(cap)s
    ) x
), owners AS (
    (SELECT t.owner FROM mcp_tasks t, me
     WHERE t.queue = me.queue AND t.dispatched_at IS NULL AND t.retry_at IS NULL AND t.status IN {_ACTIVE}
     ORDER BY t.owner LIMIT 1)
    UNION ALL
    SELECT (SELECT t.owner FROM mcp_tasks t, me
            WHERE t.queue = me.queue AND t.dispatched_at IS NULL AND t.retry_at IS NULL
              AND t.status IN {_ACTIVE} AND t.owner > o.owner
            ORDER BY t.owner LIMIT 1)
    FROM owners o WHERE o.owner IS NOT NULL
), others AS (
    SELECT COALESCE(sum(c.n), 0)::int AS n
    FROM (SELECT owner FROM owners WHERE owner IS NOT NULL LIMIT 50) o
    CROSS JOIN me CROSS JOIN mine
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM mcp_tasks t
            WHERE t.queue = me.queue AND t.owner = o.owner AND t.dispatched_at IS NULL AND t.retry_at IS NULL
              AND t.status IN {_ACTIVE}
            LIMIT mine.n + 1
        ) y
    ) c
    WHERE o.owner <> me.owner
), queued AS (
    SELECT count(*)::int AS n FROM mcp_tasks t, me
    WHERE t.queue = me.queue AND t.dispatched_at IS NOT NULL AND t.suspended_at IS NULL
      AND t.status IN {_ACTIVE} AND t.lease_until IS NULL
)
SELECT mine.n + others.n + queued.n AS ahead, mine.n >= %(cap)s AS capped
FROM me, mine, others, queued
"""

# Asks of one principal in one queue, one at a time (with the check and the ask in one
# transaction): two jobs asking at once must not both see the other not yet waiting.
LOCK_WAITING: Final[LiteralString] = """
SELECT pg_advisory_xact_lock(hashtext('mcp-waiting:' || owner || ':' || queue))
FROM mcp_tasks WHERE task_id = %(task_id)s
"""

# Before a job asks: its principal's other jobs of its queue waiting for input holding a slot,
# and the limit (the principal's override, else ``max_waiting``; 0: none); its suspended tasks
# (every queue: they hold rows, not slots) and their cap.
WAITING_QUOTA: Final[LiteralString] = """
SELECT COALESCE(l.max_waiting_inputs, %(max_waiting)s) AS max_waiting,
       (SELECT count(*) FROM mcp_tasks w
        WHERE w.queue = t.queue AND w.owner = t.owner AND w.status = 'input_required'
          AND w.suspended_at IS NULL AND w.task_id <> t.task_id) AS waiting,
       %(max_suspended)s AS max_suspended,
       (SELECT count(*) FROM (
            SELECT 1 FROM mcp_tasks s
            WHERE s.owner = t.owner AND s.suspended_at IS NOT NULL
              AND s.status IN ('working', 'input_required')
            LIMIT GREATEST(%(max_suspended)s, 0)
        ) capped) AS suspended,
       t.queue
FROM mcp_tasks t LEFT JOIN mcp_principal_limits l ON l.principal = t.owner
WHERE t.task_id = %(task_id)s
"""
