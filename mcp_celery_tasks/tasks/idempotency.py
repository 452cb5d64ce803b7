"""Idempotent ``tools/call``: a client that retries after a lost response gets the task its
first call made, instead of a second run (a GPU training run twice is the cost this avoids).

MCP has no idempotency (SEP-3182 proposed ``idempotencyKey`` on ``tools/call`` and was closed
without a replacement), so the key travels in ``params._meta`` under our prefix
(``wire.IDEMPOTENCY_KEY_META_KEY``), in SEP-3182's shape: a string chosen by the client.

- **Scope**: the principal. The store's unique index is on ``(owner, idempotency_key)``, so one
  principal's key never finds, blocks or reveals another's task.
- **Lifetime**: the task's. A key names its task until the task expires (its retention after it
  ends); an expired task, collected or not, frees its key.
- **Same call**: the SHA-256 of the tool name and the canonical JSON of the validated arguments.
  A key sent again with another tool or other arguments is -32602 naming the difference (a
  reused key is a client bug; answering the old task would hide it).
- **Every path**: task-augmented calls of both revisions answer the existing task; a synchronous
  call waits for the same task's outcome. The tool never runs twice for one key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Final

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.store import TaskRecord
from mcp_celery_tasks.wire import IDEMPOTENCY_KEY_META_KEY

__all__ = ["MAX_KEY_LENGTH", "check_replay", "idempotency_key", "request_digest"]

MAX_KEY_LENGTH: Final = 255
"""Long enough for a UUID with a prefix or a hash, short enough to index cheaply."""


def idempotency_key(meta: Mapping[str, object] | None) -> str | None:
    """The request's key from its ``_meta``, None without one; -32602 for a key that is not a
    string of 1..255 printable ASCII characters (no control characters: keys end up in logs)."""
    if not meta or IDEMPOTENCY_KEY_META_KEY not in meta:
        return None
    key = meta[IDEMPOTENCY_KEY_META_KEY]
    name = f"params._meta[{IDEMPOTENCY_KEY_META_KEY!r}]"
    if not isinstance(key, str):
        raise InvalidParams(f"{name} must be a string, not {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidParams(f"{name} must be 1 to {MAX_KEY_LENGTH} characters long, not {len(key)}")
    if not all(" " <= c <= "~" for c in key):
        raise InvalidParams(f"{name} may hold printable ASCII characters only")
    return key


def request_digest(tool_name: str, arguments: Mapping[str, object]) -> str:
    """What a call asks for, independent of key order and spacing (the arguments as validated,
    so defaults filled in by the schema count as given)."""
    canonical = json.dumps(
        {"tool": tool_name, "arguments": arguments},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_replay(record: TaskRecord, tool_name: str, digest: str) -> None:
    """-32602 unless ``record`` (the task already made under the key) was asked for the same
    tool with the same arguments."""
    if record.tool_name != tool_name:
        raise InvalidParams(
            f"Idempotency key already used for another tool ({record.tool_name!r}, not {tool_name!r})",
            {"taskId": record.task_id, "mismatch": "tool"},
        )
    if record.request_digest != digest:
        raise InvalidParams(
            f"Idempotency key already used for {tool_name!r} with other arguments",
            {"taskId": record.task_id, "mismatch": "arguments"},
        )
