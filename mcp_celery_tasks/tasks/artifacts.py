"""The API's artifact reads, scoped to the caller: what ``protocol.resources`` answers from.

A uri that is malformed, unknown, or another principal's artifact all raise the same
``ResourceNotFound``, so a uri's existence never leaks; a half-written artifact of the caller's
own is refused by name; a read larger than the caller's bound is refused before any chunk is
read, naming the bound and the ranged form that reads it in parts:
``mcp-tasks://artifacts/<id>/<name>?offset=<n>&length=<m>`` (``RANGE_TEMPLATE``, RFC 6570).
``offset`` (default 0) must fall inside the artifact; ``length`` (default: the rest, up to the
bound) is at least 1 and at most the bound, and is cut at the artifact's end. Both are plain
decimal integers; anything else (a sign, a fraction, another parameter, a repeat) is -32602.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from mcp_celery_tasks.errors import InvalidParams, ResourceNotFound
from mcp_celery_tasks.store import ApiStore
from mcp_celery_tasks.store.artifact_calls import HalfWritten
from mcp_celery_tasks.store.artifact_dir import ArtifactDirectory
from mcp_celery_tasks.store.artifact_queries import ArtifactRecord
from mcp_celery_tasks.tools.artifacts import ARTIFACT_URI_PREFIX

__all__ = ["RANGE_TEMPLATE", "ArtifactRead", "ArtifactService"]

logger = logging.getLogger("mcp_celery_tasks.artifacts")

RANGE_TEMPLATE: Final = ARTIFACT_URI_PREFIX + "{id}/{name}{?offset,length}"
"""The resource template of a byte range of an artifact (``resources/templates/list``)."""

_URI: Final = re.compile(
    re.escape(ARTIFACT_URI_PREFIX) + r"([A-Za-z0-9_-]{1,64})/([^/\\?#]{1,200})(?:\?(.*))?"
)
_DIGITS: Final = re.compile(r"[0-9]{1,19}")


@dataclass(frozen=True, slots=True)
class ArtifactRead:
    """What one ``resources/read`` of an artifact returns: the record and the bytes read."""

    record: ArtifactRecord
    data: bytes
    ranged: bool
    """The uri asked for a range (returned as a blob, whatever the mime type)."""


class ArtifactService:
    """Reads of the caller's artifacts (``Services.artifacts``)."""

    def __init__(self, store: ApiStore, directory: ArtifactDirectory | None = None) -> None:
        self._store = store
        self._directory = directory

    async def read(self, uri: str, principal: str, max_bytes: int) -> ArtifactRead:
        """The artifact (or the byte range) named by ``uri``; ``ResourceNotFound`` unless it is
        the principal's and complete, -32602 naming ``max_bytes`` when it is larger (or when a
        range is malformed or outside the artifact)."""
        match = _URI.fullmatch(uri)
        if match is None:
            raise ResourceNotFound(uri)
        artifact_id, name, query = match.groups()
        try:
            record = await self._store.artifact(artifact_id, principal)
        except HalfWritten:
            raise ResourceNotFound(
                uri, "Resource not readable: its upload is incomplete (still being written, or interrupted)"
            ) from None
        if record is None or record.name != name:
            raise ResourceNotFound(uri)
        if query is None:
            if record.size > max_bytes:
                raise InvalidParams(
                    f"Resource is {record.size} bytes, more than one resources/read returns "
                    f"(MAX_READ_BYTES = {max_bytes}): read it in parts of at most {max_bytes} bytes "
                    f"with {uri}?offset=<n>&length=<m> (resource template {RANGE_TEMPLATE})",
                    {
                        "uri": uri,
                        "size": record.size,
                        "maxReadBytes": max_bytes,
                        "uriTemplate": RANGE_TEMPLATE,
                    },
                )
            offset, length = 0, record.size
        else:
            offset, length = _range(uri, query, record.size, max_bytes)
        try:
            data = await self._store.artifact_bytes(record, offset, length, self._directory)
        except LookupError as exc:  # collected while we read, or a storage this API cannot reach
            logger.warning("resources/read of artifact %s: %s", record.artifact_id, exc)
            raise ResourceNotFound(uri) from None
        return ArtifactRead(record, data, ranged=query is not None)

    async def list(
        self, principal: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[ArtifactRecord]:
        """The principal's complete artifacts, newest first."""
        return await self._store.list_artifacts(principal, limit, after)


def _range(uri: str, query: str, size: int, max_bytes: int) -> tuple[int, int]:
    """(offset, length) of a ranged uri, validated strictly."""
    values: dict[str, int] = {}
    for part in query.split("&"):
        key, sep, value = part.partition("=")
        if key not in ("offset", "length") or not sep:
            raise _bad_range(uri, f"unknown range parameter {part!r}: use offset and length")
        if key in values:
            raise _bad_range(uri, f"{key} is given twice")
        if not _DIGITS.fullmatch(value):
            raise _bad_range(uri, f"{key} must be a non-negative integer, not {value!r}")
        values[key] = int(value)
    offset = values.get("offset", 0)
    if offset >= size and not (offset == 0 and size == 0):
        raise _bad_range(uri, f"offset {offset} is beyond the resource's end ({size} bytes)")
    length = values.get("length", min(size - offset, max_bytes))
    if "length" in values and not 1 <= length <= max_bytes:
        raise _bad_range(uri, f"length must be from 1 to {max_bytes} (MAX_READ_BYTES), not {length}")
    return offset, min(length, size - offset)


def _bad_range(uri: str, why: str) -> InvalidParams:
    return InvalidParams(f"Invalid range: {why}", {"uri": uri, "uriTemplate": RANGE_TEMPLATE})
