"""``resources/read``, ``resources/list`` and ``resources/templates/list``: a job's artifacts
(``ctx.artifact``), for 2026-07-28 and 2025-11-25 clients alike: one body per method, a thin entry per era.

An artifact's uri is ``mcp-tasks://artifacts/<artifact_id>/<name>``. Reads are scoped to the
caller (``tasks.artifacts``): a uri that is malformed, unknown, or another principal's artifact
all answer the same error, the uri in ``data``: -32602 "Resource not found" on 2026-07-28
(SEP-2164 standardized it there), -32002 on 2025-11-25 (that revision's server/resources). Text
(``text/*``, ``application/json``) read whole comes back as ``text``, anything else, and every
byte range, as base64 ``blob``; a read is bounded by ``MAX_READ_BYTES`` (the whole content
travels in one JSON response): a larger artifact is read in ranges, ``<uri>?offset=&length=``
(the one resource template, ``tasks.artifacts.RANGE_TEMPLATE``).
Beside the artifacts, the fixed resources and templates tool modules register
(``tools.fixed_resources``; none by default) are listed first and read by every caller.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Final

from mcp_types import ListResourcesResult, ListResourceTemplatesResult, ReadResourceResult

from mcp_celery_tasks.errors import InvalidParams, ResourceNotFound
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.protocol.services import Services
from mcp_celery_tasks.store.artifact_queries import ArtifactRecord
from mcp_celery_tasks.tasks.artifacts import RANGE_TEMPLATE
from mcp_celery_tasks.tasks.service import RequestContext
from mcp_celery_tasks.tools.artifacts import artifact_uri
from mcp_celery_tasks.tools.fixed_resources import (
    FixedResource,
    ResourceTemplate,
    find_fixed,
    fixed_resources,
    resource_templates,
)
from mcp_celery_tasks.wire import (
    LegacyListParams,
    LegacyReadResourceParams,
    PagedParams,
    ReadResourceParams,
)

__all__ = [
    "MAX_READ_BYTES",
    "PAGE",
    "list_resources",
    "list_templates",
    "read_resource",
    "read_resource_legacy",
]

MAX_READ_BYTES: Final = 16 * 1024 * 1024
"""The largest artifact one ``resources/read`` returns (its base64 is a third larger again)."""

PAGE: Final = 50
"""Artifacts per ``resources/list`` page."""

_TEXT_TYPES: Final = frozenset({"application/json"})


def _is_text(mime_type: str) -> bool:
    base = mime_type.partition(";")[0].strip().lower()
    return base.startswith("text/") or base in _TEXT_TYPES


async def read_resource(
    services: Services, ctx: RequestContext, params: ReadResourceParams
) -> ReadResourceResult:
    """2026-07-28: an unknown resource is -32602 (SEP-2164: "Resource not found", the uri in data)."""
    try:
        return ReadResourceResult.model_validate(await _read(services, ctx, params.uri))
    except ResourceNotFound as exc:
        raise InvalidParams(exc.message, exc.data) from None


async def read_resource_legacy(
    services: Services, ctx: RequestContext, params: LegacyReadResourceParams
) -> JSONObject:
    """2025-11-25: an unknown resource is -32002 (server/resources, "Error Handling")."""
    return await _read(services, ctx, params.uri)


async def _read(services: Services, ctx: RequestContext, uri: str) -> JSONObject:
    fixed = find_fixed(uri)
    if fixed is not None:
        mime_type, found = fixed
        if isinstance(found, str):
            return {"contents": [{"uri": uri, "mimeType": mime_type, "text": found}]}
        return {"contents": [{"uri": uri, "mimeType": mime_type, "blob": base64.b64encode(found).decode()}]}
    read = await services.artifacts.read(uri, ctx.principal, MAX_READ_BYTES)
    record, data = read.record, read.data
    content: JSONObject = {"uri": uri, "mimeType": record.mime_type}
    if _is_text(record.mime_type) and not read.ranged:
        try:
            content["text"] = data.decode()
        except UnicodeDecodeError:
            content["blob"] = base64.b64encode(data).decode()
    else:
        content["blob"] = base64.b64encode(data).decode()
    return {"contents": [content]}


def _resource(record: ArtifactRecord) -> JSONObject:
    return {"uri": artifact_uri(record.artifact_id, record.name), "name": record.name,
            "mimeType": record.mime_type, "size": record.size}  # fmt: skip


async def list_resources(services: Services, ctx: RequestContext, params: PagedParams) -> ListResourcesResult:
    """The caller's complete artifacts, newest first, ``PAGE`` at a time (private: never cached
    for another caller, ``ttlMs`` 0: the list grows as jobs publish)."""
    return ListResourcesResult.model_validate(await _listing(services, ctx, params.cursor))


async def list_resources_legacy(
    services: Services, ctx: RequestContext, params: LegacyListParams
) -> JSONObject:
    return await _listing(services, ctx, params.cursor)


_RANGE: Final[JSONObject] = {
    "uriTemplate": RANGE_TEMPLATE,
    "name": "artifact-range",
    "title": "A byte range of an artifact",
    "description": (
        "Bytes offset..offset+length of the artifact mcp-tasks://artifacts/{id}/{name} (its link's "
        f"size is the total), returned as a base64 blob; length is at most {MAX_READ_BYTES} bytes, "
        "the most one resources/read returns, and is cut at the end."
    ),
    "mimeType": "application/octet-stream",
}


async def list_templates(
    services: Services, ctx: RequestContext, params: PagedParams
) -> ListResourceTemplatesResult:
    """The byte-range template of artifacts (an artifact over ``MAX_READ_BYTES`` is read in
    parts), then the registered ones (``tools.fixed_resources``); every artifact itself is listed
    by its own uri."""
    return ListResourceTemplatesResult.model_validate(_templates())


async def list_templates_legacy(
    services: Services, ctx: RequestContext, params: LegacyListParams
) -> JSONObject:
    return _templates()


def _templates() -> JSONObject:
    registered = [_described(t, uriTemplate=t.uri_template) for t in resource_templates()]
    templates: list[JSONValue] = [dict(_RANGE), *registered]
    return {"resourceTemplates": templates}


def _described(entry: FixedResource | ResourceTemplate, **where: str) -> JSONObject:
    """A fixed resource or template as listed: where it is, its name, mime type, description."""
    listed: JSONObject = {**where, "name": entry.name, "mimeType": entry.mime_type}
    if entry.description:
        listed["description"] = entry.description
    return listed


async def _listing(services: Services, ctx: RequestContext, cursor: str | None) -> JSONObject:
    after = _cursor(cursor) if cursor is not None else None
    records = await services.artifacts.list(ctx.principal, PAGE + 1, after)
    fixed: list[JSONValue] = (
        [] if cursor is not None else [_described(r, uri=r.uri) for r in fixed_resources()]
    )
    result: JSONObject = {"resources": [*fixed, *(_resource(r) for r in records[:PAGE])]}
    if len(records) > PAGE:
        last = records[PAGE - 1]
        token = f"{last.created_at.isoformat()}|{last.artifact_id}".encode()
        result["nextCursor"] = base64.urlsafe_b64encode(token).decode()
    return result


def _cursor(cursor: str) -> tuple[datetime, str]:
    try:
        stamp, _, artifact_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        after = (datetime.fromisoformat(stamp), artifact_id)
    except ValueError as exc:  # includes binascii.Error and UnicodeDecodeError
        raise InvalidParams("Invalid cursor") from exc
    if not artifact_id or "\x00" in artifact_id or after[0].tzinfo is None:
        raise InvalidParams("Invalid cursor")
    return after
