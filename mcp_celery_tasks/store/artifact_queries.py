"""The SQL of artifacts (``ctx.artifact``, ``resources/read``), and their record.

An artifact is a file a job publishes: one row in ``mcp_task_artifacts`` (task, owner, name,
mime type, and once complete its size and sha256) and its bytes in ``mcp_task_artifact_chunks``,
exactly 1 MiB a row but the last (so a byte range maps to chunk numbers), or in a file under
``artifact_dir`` (``storage = 'directory'``, ``store.artifact_dir``). A worker writes it in three
kinds of statement, each its own short transaction (a 1 GB upload never holds the task row): the
row (incomplete), one per chunk (which also grows ``size`` by the chunk, refused when that would
pass ``max_artifact_bytes`` or the principal's ``artifact_quota_bytes``: the quota counts an
upload as it streams), then the flip to complete. Each is fenced like the worker's other
writes (``worker = :me`` on an active task, the task row locked ``FOR SHARE`` for the
statement), so a run that lost its lease writes nothing more. Readers see complete artifacts
only; incomplete ones left by a killed job go in the collector's orphan sweep once their task is
terminal, and every artifact goes with its task (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, LiteralString

from mcp_celery_tasks.lifecycle import ACTIVE, sql_list

__all__ = ["ORPHAN_AFTER", "ArtifactRecord"]

_ACTIVE: Final = sql_list(ACTIVE)

ORPHAN_AFTER: Final = "1 hour"
"""An incomplete artifact of a terminal task is swept once it is older than this."""

_MINE: Final = f"""
SELECT task_id, owner FROM mcp_tasks
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {_ACTIVE}
FOR SHARE
"""


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """A complete artifact: who owns it, what it is called, its size and digest."""

    artifact_id: str
    task_id: str
    owner: str
    name: str
    mime_type: str
    size: int
    sha256: str
    chunks: int
    created_at: datetime
    storage: str = "postgres"


COLUMNS: Final = "artifact_id, task_id, owner, name, mime_type, size, sha256, chunks, created_at, storage"

# ---- the worker's writes ------------------------------------------------------------------------

CREATE_ARTIFACT: Final[LiteralString] = f"""
WITH mine AS ({_MINE})
INSERT INTO mcp_task_artifacts (artifact_id, task_id, owner, name, mime_type, storage)
SELECT %(artifact_id)s, task_id, owner, %(name)s, %(mime_type)s, %(storage)s FROM mine
RETURNING artifact_id
"""

# The artifact grows by %(n)s bytes unless that passes the per-artifact cap or the owner's quota
# (0: none), summed over every artifact of the owner, incomplete ones included. Two uploads of one
# principal racing may each pass by one chunk: the quota is exact to a chunk per upload.
_GROWN: Final = f"""
mine AS ({_MINE}),
grown AS (
    UPDATE mcp_task_artifacts a SET size = a.size + %(n)s
    FROM mine
    WHERE a.artifact_id = %(artifact_id)s AND a.task_id = mine.task_id AND NOT a.complete
      AND a.size + %(n)s <= %(max_bytes)s
      AND (%(quota)s = 0 OR %(n)s + (SELECT coalesce(sum(o.size), 0) FROM mcp_task_artifacts o
                                     WHERE o.owner = mine.owner) <= %(quota)s)
    RETURNING a.artifact_id
)
"""

INSERT_CHUNK: Final[LiteralString] = f"""
WITH {_GROWN}
INSERT INTO mcp_task_artifact_chunks (artifact_id, seq, data)
SELECT artifact_id, %(seq)s, %(data)s FROM grown
RETURNING seq
"""

# A directory artifact's chunk: the row grows (and the quota is checked) before the bytes land.
GROW: Final[LiteralString] = f"""
WITH {_GROWN}
SELECT artifact_id FROM grown
"""

# Why a chunk was refused: the run is no longer the task's (None), or the owner's usage.
REFUSAL: Final[LiteralString] = f"""
WITH mine AS ({_MINE})
SELECT (SELECT coalesce(sum(o.size), 0) FROM mcp_task_artifacts o WHERE o.owner = mine.owner) AS used
FROM mine
"""

# Complete only with every chunk written (a count check against what the writer sent; a
# directory artifact has no chunk rows).
COMPLETE_ARTIFACT: Final[LiteralString] = f"""
WITH mine AS ({_MINE})
UPDATE mcp_task_artifacts a SET complete = true, size = %(size)s, sha256 = %(sha256)s,
    chunks = %(chunks)s
FROM mine
WHERE a.artifact_id = %(artifact_id)s AND a.task_id = mine.task_id AND NOT a.complete
  AND (SELECT count(*) FROM mcp_task_artifact_chunks k WHERE k.artifact_id = a.artifact_id) = %(rows)s
RETURNING a.artifact_id
"""

# A refused upload (over its cap or the quota, or its source failed) is removed at once by its
# own run; a run that lost the task leaves it to the orphan sweep.
DISCARD_ARTIFACT: Final[LiteralString] = f"""
WITH mine AS ({_MINE})
DELETE FROM mcp_task_artifacts a USING mine
WHERE a.artifact_id = %(artifact_id)s AND a.task_id = mine.task_id AND NOT a.complete
"""

# ---- readers (the API, principal-scoped) -----------------------------------------------------

# ``complete`` comes back so that a half-written artifact is refused by name, not as unknown.
ARTIFACT: Final[LiteralString] = f"""
SELECT {COLUMNS}, complete FROM mcp_task_artifacts
WHERE artifact_id = %(artifact_id)s AND owner = %(owner)s
"""

CHUNK: Final[LiteralString] = """
SELECT data FROM mcp_task_artifact_chunks WHERE artifact_id = %(artifact_id)s AND seq = %(seq)s
"""

# Newest first; the cursor is the last row's (created_at, artifact_id).
LIST_ARTIFACTS: Final[LiteralString] = f"""
SELECT {COLUMNS} FROM mcp_task_artifacts
WHERE owner = %(owner)s AND complete
  AND (%(after_at)s::timestamptz IS NULL OR (created_at, artifact_id) < (%(after_at)s, %(after_id)s))
ORDER BY created_at DESC, artifact_id DESC
LIMIT %(limit)s
"""

# Which of these artifact ids still have a row (the directory sweep keeps their files).
KNOWN_ARTIFACTS: Final[LiteralString] = """
SELECT artifact_id FROM mcp_task_artifacts WHERE artifact_id = ANY(%(ids)s)
"""

# ---- maintenance -------------------------------------------------------------------------------

# A job killed mid-upload leaves an incomplete artifact; once its task is terminal nobody will
# complete it. Its chunks go with it (cascade).
DELETE_ORPHANS: Final[LiteralString] = f"""
DELETE FROM mcp_task_artifacts WHERE artifact_id IN (
    SELECT a.artifact_id FROM mcp_task_artifacts a JOIN mcp_tasks t USING (task_id)
    WHERE NOT a.complete AND a.created_at < now() - interval '{ORPHAN_AFTER}'
      AND t.status NOT IN {_ACTIVE}
    LIMIT %(limit)s
)
"""
