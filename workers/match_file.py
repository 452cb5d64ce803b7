"""Every match of a ``search_logs`` run as an NDJSON file, published as an artifact when there
are more than the result lists inline.

Each match is written as it is found, one JSON object a line (``{"file", "line", "text"}``),
into a ``SpooledTemporaryFile``: in memory up to ``SPOOL_BYTES``, then on the worker's temporary
disk, so a search with millions of matches never builds them into one string. The file is
bounded (``MAX_FILE_BYTES``): past it, matches are still counted but no longer written, and the
result says so.
"""

from __future__ import annotations

import json
import tempfile
from types import TracebackType
from typing import Any, Final

from mcp_types import CallToolResult

from mcp_celery_tasks import TaskContext

__all__ = ["INLINE_MATCHES", "MATCHES_ARTIFACT", "MAX_FILE_BYTES", "NDJSON", "PREVIEW_MATCHES", "MatchFile"]

INLINE_MATCHES: Final = 200
"""Up to this many matches, the result lists them all and links no file (as it always did)."""
PREVIEW_MATCHES: Final = 20
"""Matches a result lists beside the linked file: a glimpse, so the model's context stays small."""
MATCHES_ARTIFACT: Final = "matches.ndjson"
NDJSON: Final = "application/x-ndjson"
SPOOL_BYTES: Final = 1 << 20
MAX_FILE_BYTES: Final = 256 << 20
"""The largest matches file one search publishes (about 700k matches of full-length lines)."""


class MatchFile:
    """Matches written one line each, as found; ``result`` links the file when it is needed."""

    def __init__(self, max_bytes: int = MAX_FILE_BYTES) -> None:
        # Closed by __exit__: the file lives as long as the search.
        self._spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+b")  # noqa: SIM115
        self._max_bytes = max_bytes
        self.written = 0
        """Matches in the file."""
        self.size = 0
        self.full = False
        """A match did not fit under ``max_bytes``: the file holds only the first ``written``."""

    def __enter__(self) -> MatchFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._spool.close()

    def add(self, file: str, line: int, text: str) -> None:
        if self.full:
            return
        record = {"file": file, "line": line, "text": text}
        encoded = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if self.size + len(encoded) > self._max_bytes:
            self.full = True
            return
        self._spool.write(encoded)
        self.size += len(encoded)
        self.written += 1

    def result(self, ctx: TaskContext, summary: dict[str, Any]) -> dict[str, Any] | CallToolResult:
        """``summary`` as it is when its matches fit inline (``match_count`` at most
        ``INLINE_MATCHES``); else the summary with the first ``PREVIEW_MATCHES`` and, beside it,
        the link to every match (``matches.ndjson``, streamed from the file's start)."""
        if summary["match_count"] <= INLINE_MATCHES:
            return summary
        self._spool.seek(0)
        link = ctx.artifact(MATCHES_ARTIFACT, self._spool, NDJSON)
        summary["matches"] = summary["matches"][:PREVIEW_MATCHES]
        summary["matches_truncated"] = True
        summary["matches_file"] = {
            "uri": link["uri"],
            "matches": self.written,
            "bytes": self.size,
            "complete": not self.full,
        }
        text = json.dumps(summary, separators=(",", ":"), ensure_ascii=False)
        return CallToolResult.model_validate(
            {"content": [{"type": "text", "text": text}, dict(link)], "structuredContent": summary}
        )
