"""Many task rows at once, for the console's plan tests and its benchmark (tests/bench/console_bench.py).

Plain SQL on purpose: a million rows through the store's create would take minutes, and only the
rows' shape matters here (statuses, principals, tools and queues spread as in a busy pool, with
creation times that repeat, so the list's keyset tie-break is exercised).
"""

from __future__ import annotations

from typing import Any

import psycopg

FILL = """
INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, status_message,
                       created_at, last_updated_at, retention_ms, poll_interval_ms, queue,
                       max_attempts, protocol_version, client_capabilities, dispatched_at,
                       started_at, finished_at, error_kind, attempts)
SELECT 'bulk-task-' || %(tag)s || '-' || n,
       CASE WHEN %(uuid_jobs)s THEN md5(%(tag)s || n)::uuid::text
            ELSE 'bulk-job-' || %(tag)s || '-' || lpad(n::text, 8, '0') END,
       'token:user' || (n %% %(owners)s),
       'tool_' || (n %% 7),
       jsonb_build_object('n', n),
       s.status,
       'step ' || (n %% 10),
       c.at, c.at, 3600000, 1000,
       CASE WHEN n %% 5 = 0 THEN 'gpu' ELSE 'default' END,
       3, '2026-07-28', '{}'::jsonb,
       c.at, c.at + interval '1 second',
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled') THEN c.at + interval '5 seconds' END,
       CASE WHEN s.status = 'completed' AND n %% 50 = 0 THEN 'tool_error' END,
       1
FROM generate_series(1, %(rows)s) AS n
CROSS JOIN LATERAL (
    SELECT CASE WHEN n > %(rows)s - %(active)s THEN 'working'
                WHEN n %% 97 = 0 THEN 'failed'
                WHEN n %% 89 = 0 THEN 'cancelled'
                ELSE 'completed' END AS status
) s
-- Every creation time is shared by three rows: the page order must break the tie.
CROSS JOIN LATERAL (SELECT now() - (%(rows)s - n) / 3 * interval '10 milliseconds' AS at) c
"""


def fill(
    dsn: str, rows: int, *, tag: str = "a", owners: int = 200, active: int = 100, uuid_jobs: bool = False
) -> None:
    """Insert ``rows`` tasks (the newest ``active`` of them working), then ANALYZE. Job ids are
    ``bulk-job-<tag>-<n, 8 digits>``, or with ``uuid_jobs`` UUIDs as the API makes them (random,
    so a prefix's rows spread over the whole time range as real ones do)."""
    params: dict[str, Any] = {
        "rows": rows, "tag": tag, "owners": owners, "active": active, "uuid_jobs": uuid_jobs,
    }  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FILL, params)
        conn.execute("ANALYZE mcp_tasks")
