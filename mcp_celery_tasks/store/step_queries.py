"""The SQL of durable steps and checkpoints (``ctx.step``, ``ctx.checkpoint``), and its records.

Every write is fenced like the worker's other writes: it lands only while the task is active and
held by the writing worker (``worker = :me AND status IN ('working', 'input_required')``), and it
locks the task row ``FOR SHARE`` so that a claim by another worker cannot slip in between the
check and the write. A write that finds the task not ours writes nothing and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, LiteralString

from mcp_celery_tasks.lifecycle import ACTIVE, sql_list

__all__ = ["CHUNK_BYTES", "CheckpointRecord", "StepWrite"]

CHUNK_BYTES: Final = 1024 * 1024
"""A checkpoint kept in Postgres is stored (and streamed) in chunks of this size."""

_ACTIVE: Final = sql_list(ACTIVE)

_MINE: Final = f"""
SELECT task_id FROM mcp_tasks
WHERE task_id = %(task_id)s AND worker = %(worker)s AND status IN {_ACTIVE}
FOR SHARE
"""


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A task's latest checkpoint of one name: where its bytes are and what they must hash to."""

    name: str
    generation: str
    storage: str
    """``postgres`` (chunks in ``mcp_task_checkpoint_chunks``) or ``directory`` (``path``)."""
    size: int
    sha256: str
    chunks: int
    path: str | None
    """The file, relative to ``checkpoint_dir`` (``directory`` storage only)."""
    saved_at: datetime | None = None


StepWrite = bool | None
"""What a step write came to: True recorded; False the task is not ours (nothing written); None
ours, but a step of that position or name was recorded already (by another run)."""

# ---- steps ---------------------------------------------------------------------------------------

STEP_INDEX: Final[LiteralString] = """
SELECT seq, name FROM mcp_task_steps WHERE task_id = %(task_id)s ORDER BY seq
"""

STEP_RESULT: Final[LiteralString] = """
SELECT result FROM mcp_task_steps WHERE task_id = %(task_id)s AND seq = %(seq)s
"""

RECORD_STEP: Final[LiteralString] = f"""
WITH mine AS ({_MINE}),
recorded AS (
    INSERT INTO mcp_task_steps (task_id, seq, name, result, size)
    SELECT task_id, %(seq)s, %(name)s, %(result)s::json, %(size)s FROM mine
    ON CONFLICT DO NOTHING
    RETURNING seq
)
SELECT (SELECT count(*) FROM mine) AS mine, (SELECT count(*) FROM recorded) AS recorded
"""

# ---- checkpoints ---------------------------------------------------------------------------------

CHECKPOINT_COLUMNS: Final = "name, generation, storage, size, sha256, chunks, path, saved_at"

CHECKPOINT: Final[LiteralString] = f"""
SELECT {CHECKPOINT_COLUMNS} FROM mcp_task_checkpoints WHERE task_id = %(task_id)s AND name = %(name)s
"""

INSERT_CHUNK: Final[LiteralString] = """
INSERT INTO mcp_task_checkpoint_chunks (task_id, name, generation, seq, data)
VALUES (%(task_id)s, %(name)s, %(generation)s, %(seq)s, %(data)s)
"""

CHUNK: Final[LiteralString] = """
SELECT data FROM mcp_task_checkpoint_chunks
WHERE task_id = %(task_id)s AND name = %(name)s AND generation = %(generation)s AND seq = %(seq)s
"""

# The checkpoint row flips to the new generation, fenced; the previous record comes back (its
# chunks or file are deleted next). ``previous`` is NULL for a first save, and no row at all comes
# back when the task is not ours.
RECORD_CHECKPOINT: Final[LiteralString] = f"""
WITH mine AS ({_MINE}),
previous AS (
    SELECT c.generation, c.storage, c.path FROM mcp_task_checkpoints c JOIN mine USING (task_id)
    WHERE c.name = %(name)s
),
saved AS (
    INSERT INTO mcp_task_checkpoints (task_id, name, generation, storage, size, sha256, chunks, path)
    SELECT task_id, %(name)s, %(generation)s, %(storage)s, %(size)s, %(sha256)s, %(chunks)s, %(path)s
    FROM mine
    ON CONFLICT (task_id, name) DO UPDATE SET generation = EXCLUDED.generation,
        storage = EXCLUDED.storage, size = EXCLUDED.size, sha256 = EXCLUDED.sha256,
        chunks = EXCLUDED.chunks, path = EXCLUDED.path, saved_at = now()
    RETURNING saved_at
)
SELECT saved.saved_at, previous.generation, previous.storage, previous.path
FROM saved LEFT JOIN previous ON true
"""

DELETE_OTHER_CHUNKS: Final[LiteralString] = """
DELETE FROM mcp_task_checkpoint_chunks
WHERE task_id = %(task_id)s AND name = %(name)s AND generation <> %(generation)s
"""

DELETE_CHECKPOINT: Final[LiteralString] = f"""
WITH mine AS ({_MINE}),
gone AS (
    DELETE FROM mcp_task_checkpoints c USING mine
    WHERE c.task_id = mine.task_id AND c.name = %(name)s
    RETURNING c.generation, c.storage, c.path
),
chunks AS (
    DELETE FROM mcp_task_checkpoint_chunks k USING mine
    WHERE k.task_id = mine.task_id AND k.name = %(name)s
)
SELECT (SELECT count(*) FROM mine) AS mine, gone.generation, gone.storage, gone.path
FROM (SELECT 1) AS one LEFT JOIN gone ON true
"""

# ---- admin ---------------------------------------------------------------------------------------

ADMIN_STEPS: Final[LiteralString] = """
SELECT seq, name, size, recorded_at FROM mcp_task_steps WHERE task_id = %(task_id)s ORDER BY seq
"""

ADMIN_CHECKPOINTS: Final[LiteralString] = """
SELECT name, storage, size, sha256, path, saved_at FROM mcp_task_checkpoints
WHERE task_id = %(task_id)s ORDER BY name
"""

# ---- maintenance -------------------------------------------------------------------------------

KNOWN_JOBS: Final[LiteralString] = """
SELECT job_id FROM mcp_tasks WHERE job_id = ANY(%(job_ids)s)
"""
