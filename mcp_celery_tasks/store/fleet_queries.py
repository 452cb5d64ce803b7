"""The SQL of the worker registry (``mcp_workers``) and of the demand per queue
(``mcp_queue_demand``, migration 0013): heartbeats from worker main processes, the beats the
maintenance worker hears from, and what the API's gauges and ``tasks workers`` read."""

from __future__ import annotations

from typing import Final, LiteralString

from mcp_celery_tasks.store.queries import ACTIVE_SQL

__all__: list[str] = []

# One statement per heartbeat: register, or refresh our own row. Another live process holding the
# node name keeps it (two workers started with one ``-n``): nothing comes back, and the caller says
# so. A row whose process died (expired) is taken over. ``devices`` stays as the worker last said.
HEARTBEAT: Final[LiteralString] = """
INSERT INTO mcp_workers (node, kind, hostname, pid, pids, queues, slots, devices, version, pool,
    instance, started_at, heartbeat_at, expires_at)
VALUES (%(node)s, 'worker', %(hostname)s, %(pid)s, %(pids)s, %(queues)s, %(slots)s, %(devices)s,
    %(version)s, %(pool)s, %(instance)s, %(started_at)s, now(),
    now() + %(timeout_s)s * interval '1 second')
ON CONFLICT (node) DO UPDATE SET
    kind = 'worker', hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, pids = EXCLUDED.pids,
    queues = EXCLUDED.queues, slots = EXCLUDED.slots, devices = EXCLUDED.devices,
    version = EXCLUDED.version, pool = EXCLUDED.pool, instance = EXCLUDED.instance,
    started_at = EXCLUDED.started_at, heartbeat_at = now(), expires_at = EXCLUDED.expires_at
WHERE mcp_workers.instance = EXCLUDED.instance OR mcp_workers.expires_at < now()
RETURNING node
"""

NODE_HOLDER: Final[LiteralString] = """
SELECT hostname, pid, started_at FROM mcp_workers WHERE node = %(node)s AND expires_at > now()
"""

DEREGISTER: Final[LiteralString] = """
DELETE FROM mcp_workers WHERE node = %(node)s AND instance = %(instance)s RETURNING node
"""

# A beat is known by the ``origin`` of the jobs it sends (``gen<pid>@<host>``). Another beat whose
# latest job came over an interval after this one's first (so not a beat that stopped before this
# one started: a job older than 0.9 intervals expires unread) ran at the same time.
SAW_BEAT: Final[LiteralString] = """
WITH me AS (
    INSERT INTO mcp_workers (node, kind, hostname, pid, instance, started_at, heartbeat_at, expires_at)
    VALUES (%(node)s, 'beat', %(hostname)s, %(pid)s, %(node)s, now(), now(),
            now() + %(timeout_s)s * interval '1 second')
    ON CONFLICT (node) DO UPDATE SET
        started_at = CASE WHEN mcp_workers.expires_at < now() THEN now()
                          ELSE mcp_workers.started_at END,
        heartbeat_at = now(), expires_at = EXCLUDED.expires_at
    RETURNING started_at
)
SELECT b.node FROM mcp_workers b, me
WHERE b.kind = 'beat' AND b.node <> %(node)s AND b.expires_at > now()
  AND b.heartbeat_at > me.started_at + %(interval_s)s * interval '1 second'
ORDER BY b.node
"""

DELETE_DEAD: Final[LiteralString] = """
DELETE FROM mcp_workers WHERE expires_at < now() - %(kept_s)s * interval '1 second'
"""

# ``tasks workers``: every row (live first), with what each runs now: the active tasks whose
# ``worker`` identity (``host:pid:nonce``) is one of the row's processes on its host. One pass over
# the claimed active rows, hashed against every worker's (host, pid) pairs (materialized: else the
# planner re-reads the active rows once per worker).
WORKERS: Final[LiteralString] = f"""
WITH procs AS MATERIALIZED (
    SELECT w.node, w.hostname, p.pid::text AS pid
    FROM mcp_workers w CROSS JOIN LATERAL unnest(w.pids || w.pid) AS p(pid)
    WHERE w.kind = 'worker'
), claimed AS MATERIALIZED (
    SELECT split_part(t.worker, ':', 1) AS hostname, split_part(t.worker, ':', 2) AS pid,
           jsonb_build_object('job_id', t.job_id, 'tool', t.tool_name, 'status', t.status,
                              'queue', t.queue, 'since', t.started_at) AS job, t.started_at
    FROM mcp_tasks t
    WHERE t.status IN {ACTIVE_SQL} AND t.worker IS NOT NULL
), jobs AS (
    SELECT procs.node, jsonb_agg(claimed.job ORDER BY claimed.started_at) AS jobs
    FROM claimed JOIN procs USING (hostname, pid)
    GROUP BY procs.node
)
SELECT w.node, w.kind, w.hostname, w.pid, w.queues, w.slots, w.devices, w.version, w.pool,
       w.started_at, w.heartbeat_at, w.expires_at, w.expires_at > now() AS alive,
       EXTRACT(EPOCH FROM now() - w.heartbeat_at)::float AS heartbeat_age_s,
       COALESCE(jobs.jobs, '[]'::jsonb) AS jobs
FROM mcp_workers w LEFT JOIN jobs ON jobs.node = w.node
WHERE %(all)s OR w.expires_at > now()
ORDER BY w.expires_at > now() DESC, w.kind DESC, w.node
"""

# The demand view, every queue: what the API's gauges read once per interval.
DEMAND: Final[LiteralString] = """
SELECT queue, demand_slots, backlog, published, running, waiting_resident, waiting_suspended,
       oldest_queued_s, worker_slots, slots_available, workers
FROM mcp_queue_demand ORDER BY queue
"""
