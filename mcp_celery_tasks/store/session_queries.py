"""The SQL of the protocol state the API keeps besides tasks: 2025-11-25 sessions
(``initialize``, ``logging/setLevel``, expiry), the SEP-1686 task listing scoped to one session,
and spent MRTR request states; the rest of the store's statements are in ``queries``."""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.store.queries import TASK_COLUMNS

__all__: list[str] = []

_SESSION_LIVE: Final[LiteralString] = """
    created_at > now() - %(max_age_s)s * interval '1 second'
    AND last_used_at > now() - %(idle_s)s * interval '1 second'"""

# A new session, unless its owner already has ``max_sessions`` live ones.
CREATE_SESSION: Final[LiteralString] = f"""
INSERT INTO mcp_sessions (session_id, owner, protocol_version, client_capabilities, client_info)
SELECT %(session_id)s, %(owner)s, %(protocol_version)s, %(client_capabilities)s, %(client_info)s
WHERE (
    SELECT count(*) FROM (
        SELECT 1 FROM mcp_sessions WHERE owner = %(owner)s AND {_SESSION_LIVE} LIMIT %(max_sessions)s
    ) AS live
) < %(max_sessions)s
RETURNING session_id
"""

# A live session (an expired one reads as unknown); its last use is written at most once a minute.
GET_SESSION: Final[LiteralString] = f"""
WITH found AS (
    SELECT session_id, owner, protocol_version, client_capabilities, client_info, last_used_at, log_level
    FROM mcp_sessions
    WHERE session_id = %(session_id)s AND owner = %(owner)s AND {_SESSION_LIVE}
), touched AS (
    UPDATE mcp_sessions s SET last_used_at = now() FROM found
    WHERE s.session_id = found.session_id AND found.last_used_at < now() - interval '60 seconds'
    RETURNING s.session_id
)
SELECT session_id, owner, protocol_version, client_capabilities, client_info, log_level FROM found
"""

SET_SESSION_LOG_LEVEL: Final[LiteralString] = f"""
UPDATE mcp_sessions SET log_level = %(level)s
WHERE session_id = %(session_id)s AND owner = %(owner)s AND {_SESSION_LIVE}
RETURNING session_id
"""

DELETE_SESSION: Final[LiteralString] = """
DELETE FROM mcp_sessions WHERE session_id = %(session_id)s AND owner = %(owner)s
RETURNING session_id
"""

DELETE_EXPIRED_SESSIONS: Final[LiteralString] = f"""
DELETE FROM mcp_sessions WHERE session_id IN (
    SELECT session_id FROM mcp_sessions WHERE NOT ({_SESSION_LIVE}) LIMIT %(limit)s
)
"""

LIST_TASKS: Final[LiteralString] = f"""
SELECT {TASK_COLUMNS}, statement_timestamp() AS db_now FROM mcp_tasks
WHERE owner = %(owner)s AND session_id = %(session_id)s
  AND (%(after_created)s::timestamptz IS NULL OR (created_at, task_id) < (%(after_created)s, %(after_id)s))
ORDER BY created_at DESC, task_id DESC
LIMIT %(limit)s
"""

# A request state is spent once: the first round to insert its digest wins; a replay (on any
# replica) finds the row and gets nothing back. The same request's own retry (a connection that
# broke after the INSERT committed: ``ApiStore._rows`` sends it again) matches ``spent_by`` and
# still gets its row, so it is not mistaken for a replay.
SPEND_REQUEST_STATE: Final[LiteralString] = """
INSERT INTO mcp_spent_request_states AS s (digest, spent_by, expires_at)
VALUES (%(digest)s, %(spent_by)s, to_timestamp(%(expires)s))
ON CONFLICT (digest) DO UPDATE SET spent_by = s.spent_by WHERE s.spent_by = EXCLUDED.spent_by
RETURNING digest
"""

DELETE_SPENT_REQUEST_STATES: Final[LiteralString] = """
DELETE FROM mcp_spent_request_states WHERE digest IN (
    SELECT digest FROM mcp_spent_request_states WHERE expires_at < now() LIMIT %(limit)s
)
"""

# A bucket untouched for an hour is full again at any rate worth having: forgetting it changes
# nothing (the next create starts a full one).
DELETE_IDLE_BUCKETS: Final[LiteralString] = """
DELETE FROM mcp_principal_buckets WHERE principal IN (
    SELECT principal FROM mcp_principal_buckets WHERE stamp < now() - interval '1 hour' LIMIT %(limit)s
)
"""

# One API replica's requests in progress per principal replace its earlier ones (the rows of
# principals it no longer serves deleted, the others updated in place); the answer is
# the other live replicas' (reported within ``fresh_s``). Rows of replicas silent for a minute
# (crashed) are deleted on the way, so the table holds live replicas' busy principals only.
SHARE_LOAD: Final[LiteralString] = """
WITH gone AS (
    DELETE FROM mcp_api_load
    WHERE (replica = %(replica)s AND NOT principal = ANY(%(principals)s::text[]))
       OR (replica <> %(replica)s AND updated_at < now() - interval '1 minute')
), mine AS (
    INSERT INTO mcp_api_load (replica, principal, in_progress, updated_at)
    SELECT %(replica)s, p, n, now() FROM unnest(%(principals)s::text[], %(counts)s::int[]) AS x(p, n)
    ON CONFLICT (replica, principal) DO UPDATE SET in_progress = EXCLUDED.in_progress, updated_at = now()
)
SELECT principal, sum(in_progress)::int AS in_progress FROM mcp_api_load
WHERE replica <> %(replica)s AND updated_at > now() - %(fresh_s)s * interval '1 second'
GROUP BY principal
"""

FORGET_LOAD: Final[LiteralString] = "DELETE FROM mcp_api_load WHERE replica = %(replica)s RETURNING principal"
