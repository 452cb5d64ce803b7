"""The API's artifact reads, scoped to the caller: what ``protocol.resources`` answers from.

A uri that is malformed, unknown, or another principal's artifact all raise the same
``ResourceNotFound``, so a uri's existence never leaks; a half-written artifact of the caller's
own is refused by name; a read larger than the caller's bound is refused before any chunk is
read.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final

from mcp_celery_tasks.errors import InvalidParams, ResourceNotFound
from mcp_celery_tasks.store import ApiStore
from mcp_celery_tasks.store.artifact_calls import HalfWritten
from mcp_celery_tasks.store.artifact_queries import ArtifactRecord
from mcp_celery_tasks.tools.artifacts import ARTIFACT_URI_PREFIX

__all__ = ["ArtifactService"]

_URI: Final = re.compile(re.escape(ARTIFACT_URI_PREFIX) + r"([A-Za-z0-9_-]{1,64})/([^/\\]{1,200})")


class ArtifactService:
    """Reads of the caller's artifacts (``Services.artifacts``)."""

    def __init__(self, store: ApiStore) -> None:
        self._store = store

    async def read(self, uri: str, principal: str, max_bytes: int) -> tuple[ArtifactRecord, bytes]:
        """The artifact named by ``uri`` and its bytes; ``ResourceNotFound`` unless it is the
        principal's and complete, -32602 naming ``max_bytes`` when it is larger."""
        match = _URI.fullmatch(uri)
        if match is None:
            raise ResourceNotFound(uri)
        artifact_id, name = match.groups()
        try:
            record = await self._store.artifact(artifact_id, principal)
        except HalfWritten:
            raise ResourceNotFound(
                uri, "Resource not readable: its upload is incomplete (still being written, or interrupted)"
            ) from None
        if record is None or record.name != name:
            raise ResourceNotFound(uri)
        if record.size > max_bytes:
            raise InvalidParams(
                f"Resource is {record.size} bytes, more than one resources/read returns "
                f"(MAX_READ_BYTES = {max_bytes})",
                {"uri": uri, "size": record.size, "maxReadBytes": max_bytes},
            )
        return record, await self._store.artifact_bytes(record)

    async def list(
        self, principal: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[ArtifactRecord]:
        """The principal's complete artifacts, newest first."""
        return await self._store.list_artifacts(principal, limit, after)
