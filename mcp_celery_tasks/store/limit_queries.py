"""The SQL of admins' limits: principal overrides, tool concurrency overrides, and their audit.

Every change is one statement that reads the old row, writes the new one and appends a row per
changed field to ``mcp_limit_changes`` (who, when, old -> new), so no change goes unrecorded and
none is recorded that did not happen. ``actor`` is what the admin command says of its user; the
database role that ran the statement is recorded beside it (the role is authenticated, the name
is not). The old row is read from the statement's snapshot (a ``FOR UPDATE`` there would skip
the row the upsert just changed): two admins changing one limit at the same instant may both
record the same old value.
"""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.lifecycle import ACTIVE, sql_list

__all__: list[str] = []

_ACTIVE: Final = sql_list(ACTIVE)
_ACTOR: Final = "%(actor)s || ' (db role ' || session_user || ')'"

_PRINCIPAL_FIELDS: Final = """(VALUES
        ('max_active_tasks', o.max_active_tasks::text, n.max_active_tasks::text),
        ('creates_per_second', o.creates_per_second::text, n.creates_per_second::text),
        ('create_burst', o.create_burst::text, n.create_burst::text),
        ('max_concurrent_requests', o.max_concurrent_requests::text, n.max_concurrent_requests::text),
        ('max_waiting_inputs', o.max_waiting_inputs::text, n.max_waiting_inputs::text),
        ('note', o.note, n.note)
    ) AS f(field, old_value, new_value)"""

SET_PRINCIPAL_LIMITS: Final[LiteralString] = f"""
WITH o AS (
    SELECT * FROM mcp_principal_limits WHERE principal = %(principal)s
), n AS (
    INSERT INTO mcp_principal_limits (principal, max_active_tasks, creates_per_second, create_burst,
        max_concurrent_requests, max_waiting_inputs, note, updated_at)
    VALUES (%(principal)s, %(max_active_tasks)s, %(creates_per_second)s, %(create_burst)s,
        %(max_concurrent_requests)s, %(max_waiting_inputs)s, %(note)s, now())
    ON CONFLICT (principal) DO UPDATE SET
        max_active_tasks = COALESCE(EXCLUDED.max_active_tasks, mcp_principal_limits.max_active_tasks),
        creates_per_second = COALESCE(EXCLUDED.creates_per_second, mcp_principal_limits.creates_per_second),
        create_burst = COALESCE(EXCLUDED.create_burst, mcp_principal_limits.create_burst),
        max_concurrent_requests = COALESCE(EXCLUDED.max_concurrent_requests,
                                           mcp_principal_limits.max_concurrent_requests),
        max_waiting_inputs = COALESCE(EXCLUDED.max_waiting_inputs, mcp_principal_limits.max_waiting_inputs),
        note = COALESCE(EXCLUDED.note, mcp_principal_limits.note),
        updated_at = now()
    RETURNING *
), audit AS (
    INSERT INTO mcp_limit_changes (actor, target, field, old_value, new_value)
    SELECT {_ACTOR}, 'principal ' || n.principal, f.field, f.old_value, f.new_value
    FROM n LEFT JOIN o ON true CROSS JOIN LATERAL {_PRINCIPAL_FIELDS}
    WHERE f.old_value IS DISTINCT FROM f.new_value
)
SELECT principal FROM n
"""

CLEAR_PRINCIPAL_LIMITS: Final[LiteralString] = f"""
WITH o AS (
    DELETE FROM mcp_principal_limits WHERE principal = %(principal)s RETURNING *
), audit AS (
    INSERT INTO mcp_limit_changes (actor, target, field, old_value, new_value)
    SELECT {_ACTOR}, 'principal ' || o.principal, f.field, f.old_value, NULL
    FROM o CROSS JOIN LATERAL (VALUES
        ('max_active_tasks', o.max_active_tasks::text),
        ('creates_per_second', o.creates_per_second::text),
        ('create_burst', o.create_burst::text),
        ('max_concurrent_requests', o.max_concurrent_requests::text),
        ('max_waiting_inputs', o.max_waiting_inputs::text),
        ('note', o.note)
    ) AS f(field, old_value)
    WHERE f.old_value IS NOT NULL
)
SELECT principal FROM o
"""

# ---- tool concurrency (``tools.concurrency``; applied by ``backlog.RELEASE``) ----------------

TOOL_LIMITS: Final[LiteralString] = """
SELECT tool_name, concurrency_group, concurrency, note, updated_at, updated_by
FROM mcp_tool_limits ORDER BY tool_name, concurrency_group
"""

SET_TOOL_LIMIT: Final[LiteralString] = f"""
WITH o AS (
    SELECT * FROM mcp_tool_limits
    WHERE tool_name = %(tool)s AND concurrency_group = %(group)s
), n AS (
    INSERT INTO mcp_tool_limits (tool_name, concurrency_group, concurrency, note, updated_at, updated_by)
    VALUES (%(tool)s, %(group)s, %(concurrency)s, %(note)s, now(), {_ACTOR})
    ON CONFLICT (tool_name, concurrency_group) DO UPDATE SET
        concurrency = EXCLUDED.concurrency,
        note = COALESCE(EXCLUDED.note, mcp_tool_limits.note),
        updated_at = now(), updated_by = EXCLUDED.updated_by
    RETURNING *
), audit AS (
    INSERT INTO mcp_limit_changes (actor, target, field, old_value, new_value)
    SELECT {_ACTOR},
           'tool ' || n.tool_name || CASE n.concurrency_group WHEN '*' THEN '' WHEN '' THEN ''
                                      ELSE ' for ' || n.concurrency_group END,
           f.field, f.old_value, f.new_value
    FROM n LEFT JOIN o ON true CROSS JOIN LATERAL (VALUES
        ('concurrency', o.concurrency::text, n.concurrency::text),
        ('note', o.note, n.note)
    ) AS f(field, old_value, new_value)
    WHERE f.old_value IS DISTINCT FROM f.new_value
)
SELECT tool_name FROM n
"""

CLEAR_TOOL_LIMIT: Final[LiteralString] = f"""
WITH o AS (
    DELETE FROM mcp_tool_limits WHERE tool_name = %(tool)s AND concurrency_group = %(group)s RETURNING *
), audit AS (
    INSERT INTO mcp_limit_changes (actor, target, field, old_value, new_value)
    SELECT {_ACTOR},
           'tool ' || o.tool_name || CASE o.concurrency_group WHEN '*' THEN '' WHEN '' THEN ''
                                      ELSE ' for ' || o.concurrency_group END,
           'concurrency', o.concurrency::text, NULL
    FROM o
)
SELECT tool_name FROM o
"""

LIMIT_CHANGES: Final[LiteralString] = """
SELECT id, changed_at, actor, target, field, old_value, new_value
FROM mcp_limit_changes ORDER BY id DESC LIMIT %(limit)s
"""

# Per concurrency group with active jobs: in flight, waiting in the backlog, the declared limit
# and the one in force (an override's). For admins (``tasks limits tools``): reads every active
# job of a limited tool.
CONCURRENCY_GROUPS: Final[LiteralString] = f"""
SELECT t.tool_name, t.concurrency_group,
       count(*) FILTER (WHERE t.dispatched_at IS NOT NULL AND t.suspended_at IS NULL)::int AS in_flight,
       count(*) FILTER (WHERE t.dispatched_at IS NULL)::int AS waiting,
       max(t.concurrency_limit) AS declared,
       COALESCE((SELECT l.concurrency FROM mcp_tool_limits l
                 WHERE l.tool_name = t.tool_name AND l.concurrency_group IN (t.concurrency_group, '*')
                 ORDER BY l.concurrency_group = '*' LIMIT 1), max(t.concurrency_limit)) AS in_force
FROM mcp_tasks t
WHERE t.concurrency_limit IS NOT NULL AND t.status IN {_ACTIVE}
GROUP BY t.tool_name, t.concurrency_group
ORDER BY t.tool_name, t.concurrency_group
LIMIT %(limit)s
"""

# A backlog task of a limited tool: its group, the limit in force and the other runs of the
# group in flight (its statusMessage says it waits for them when they fill the limit). No row:
# not such a task.
GROUP_WAIT: Final[LiteralString] = f"""
SELECT t.tool_name, t.concurrency_group,
       COALESCE((SELECT l.concurrency FROM mcp_tool_limits l
                 WHERE l.tool_name = t.tool_name AND l.concurrency_group IN (t.concurrency_group, '*')
                 ORDER BY l.concurrency_group = '*' LIMIT 1), t.concurrency_limit) AS in_force,
       (SELECT count(*) FROM mcp_tasks r
        WHERE r.tool_name = t.tool_name AND r.concurrency_group = t.concurrency_group
          AND r.concurrency_limit IS NOT NULL AND r.dispatched_at IS NOT NULL
          AND r.suspended_at IS NULL AND r.status IN {_ACTIVE})::int AS running
FROM mcp_tasks t
WHERE t.task_id = %(task_id)s AND t.concurrency_limit IS NOT NULL AND t.dispatched_at IS NULL
  AND t.retry_at IS NULL AND t.status IN {_ACTIVE}
"""

# ---- creates per second across API replicas (``queries.CREATE_TASK`` takes the token) --------

# The principal's creates-per-second bucket shared by every API process (``mcp_principal_buckets``):
# refilled at ``rate`` up to ``burst`` since its last take, then one token taken, in the create's
# own statement (no round trip more). A take that finds less than one token leaves the row as it
# was and the insert below does not happen. The row lock serializes one principal's creates
# across replicas for the length of one statement; rate 0: no bucket is touched.
TAKE_TOKEN: Final = """bucket AS (
    INSERT INTO mcp_principal_buckets AS b (principal, tokens, stamp)
    SELECT %(owner)s, %(burst)s::float8 - 1, clock_timestamp()
    WHERE %(rate)s::float8 > 0 AND (SELECT ok FROM active_ok){only}
    ON CONFLICT (principal) DO UPDATE
    SET tokens = LEAST(%(burst)s::float8, b.tokens + %(rate)s::float8
                       * EXTRACT(EPOCH FROM clock_timestamp() - b.stamp)) - 1,
        stamp = clock_timestamp()
    WHERE LEAST(%(burst)s::float8, b.tokens + %(rate)s::float8
                * EXTRACT(EPOCH FROM clock_timestamp() - b.stamp)) >= 1
    RETURNING 1
)"""
TOKEN_TAKEN: Final = "AND (%(rate)s::float8 <= 0 OR EXISTS (SELECT 1 FROM bucket))"

# After a create that made no row: whether the principal's shared bucket was short of a token,
# and in how many seconds it will hold one (else it was the active-tasks quota).
BUCKET_WAIT: Final[LiteralString] = """
SELECT GREATEST(0, (1 - LEAST(%(burst)s::float8, tokens + %(rate)s::float8
                               * EXTRACT(EPOCH FROM clock_timestamp() - stamp))) / %(rate)s::float8) AS wait_s
FROM mcp_principal_buckets WHERE principal = %(owner)s AND %(rate)s::float8 > 0
"""
