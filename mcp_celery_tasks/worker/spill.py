"""Large results become artifacts: a tool's result over ``inline_result_bytes`` (as JSON) keeps
its small blocks inline and has its large ones stored with ``ctx.artifact``, each replaced by a
``resource_link`` and a short text preview, largest first until the result fits.

What is stored:

- a ``text`` block as ``result-<n>.txt`` (``text/plain``), previewed by its first
  ``PREVIEW_CHARS`` characters;
- an ``image`` or ``audio`` block's bytes (its base64 decoded) under its mime type;
- an embedded ``resource`` block's text or blob under its mime type;
- ``structuredContent``, when it alone is over half the threshold, as ``structured-content.json``
  (``application/json``). It is then dropped from the result (a client reads it through the
  link; a text block carrying the same JSON, as a plain return value has, shares the link), and
  a text note says so. A tool with an ``outputSchema`` whose structured result is this large
  should publish its data with ``ctx.artifact`` and return a small structure instead.

Blocks of another kind (``resource_link``), and blocks smaller than ``MIN_SPILL_BYTES``, stay.
A result still over ``max_result_bytes`` after this ends with ``isError`` as before. Each
artifact counts against the principal's quota like any other (``ArtifactRefused``). A result
at or under the threshold never gets here (``runner``): one length comparison, no query.
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from collections.abc import Callable
from typing import Final

from mcp_celery_tasks.errors import ToolError
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.tools.artifacts import ArtifactData, ResourceLink, checked_mime_type

__all__ = ["MIN_SPILL_BYTES", "PREVIEW_CHARS", "json_size", "spill"]

PREVIEW_CHARS: Final = 2048
"""Characters of a stored text block kept inline as its preview."""
MIN_SPILL_BYTES: Final = 4 * PREVIEW_CHARS
"""A block smaller than this (as JSON) stays inline: its link and preview would be as large."""
STRUCTURED_NAME: Final = "structured-content.json"

Publish = Callable[[str, ArtifactData, str | None], ResourceLink]
"""``ctx.artifact``."""


def json_size(value: JSONValue) -> int:
    """The size the result is measured by (compact JSON, as the row stores it)."""
    return len(json.dumps(value, separators=(",", ":")))


def spill(result: JSONObject, publish: Publish, inline_bytes: int) -> JSONObject:
    """``result`` with its large blocks stored through ``publish`` and replaced by links and
    previews, largest first, until it is at most ``inline_bytes`` as JSON (or nothing is left
    to store)."""
    raw = result.get("content")
    blocks: list[JSONValue] = list(raw) if isinstance(raw, list) else []
    spilled: dict[int, list[JSONValue]] = {}
    out = dict(result)
    total = json_size(result)
    structured = result.get("structuredContent")
    if structured is not None and (size := json_size(structured)) * 2 > inline_bytes:
        text = json.dumps(structured, separators=(",", ":"), ensure_ascii=False)
        link = publish(STRUCTURED_NAME, text, "application/json")
        del out["structuredContent"]
        total -= size
        note: JSONValue = _text(
            f"[structuredContent ({link['size']} bytes) was stored as the linked resource "
            f"{link['name']}: read it with resources/read]"
        )
        for n, block in enumerate(blocks):
            if isinstance(block, dict) and block.get("type") == "text" and block.get("text") == text:
                spilled[n] = [_link(link), _preview(text, link)]  # the same JSON: one artifact
                total += _grown(block, spilled[n])
        blocks.append(note)
        if not spilled:
            blocks.append(_link(link))
        total += json_size(note) + (0 if spilled else json_size(_link(link)))
    order = sorted(((json_size(b), n) for n, b in enumerate(blocks) if n not in spilled), reverse=True)
    for size, n in order:
        if total <= inline_bytes or size < MIN_SPILL_BYTES:
            break
        replaced = _stored(blocks[n], n, publish)
        if replaced is not None:
            spilled[n] = replaced
            total += _grown(blocks[n], replaced)
    flat: list[JSONValue] = []
    for n, block in enumerate(blocks):
        flat.extend(spilled.get(n, [block]))
    out["content"] = flat
    return out


def _grown(block: JSONValue, replaced: list[JSONValue]) -> int:
    return sum(json_size(b) + 1 for b in replaced) - json_size(block) - 1


def _stored(block: JSONValue, n: int, publish: Publish) -> list[JSONValue] | None:
    """The link and preview that replace ``block`` once stored; None for a kind that stays."""
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind == "text" and isinstance(text := block.get("text"), str):
        link = publish(f"result-{n}.txt", text, "text/plain; charset=utf-8")
        return [_link(link), _preview(text, link)]
    if kind in ("image", "audio"):
        return _stored_bytes(block.get("data"), block.get("mimeType"), n, publish)
    resource = block.get("resource")
    if kind == "resource" and isinstance(resource, dict):
        mime = resource.get("mimeType")
        if isinstance(text := resource.get("text"), str):
            link = publish(f"result-{n}{_extension(mime, '.txt')}", text, _mime(mime, "text/plain"))
            return [_link(link), _preview(text, link)]
        return _stored_bytes(resource.get("blob"), mime, n, publish)
    return None


def _stored_bytes(data: JSONValue, mime: JSONValue, n: int, publish: Publish) -> list[JSONValue] | None:
    if not isinstance(data, str):
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None  # not base64: kept as it came (and measured against max_result_bytes)
    link = publish(f"result-{n}{_extension(mime, '.bin')}", raw, _mime(mime, "application/octet-stream"))
    return [
        _link(link),
        _text(f"[{link['name']}: {link['size']} bytes of {link['mimeType']}, stored as the linked resource]"),
    ]


def _preview(text: str, link: ResourceLink) -> JSONValue:
    shown = text[:PREVIEW_CHARS]
    return _text(
        f"[preview of {link['name']} ({link['size']} bytes): its first {len(shown)} characters; "
        f"the whole is the linked resource, read it with resources/read]\n{shown}"
    )


def _link(link: ResourceLink) -> JSONValue:
    return {"type": link["type"], "uri": link["uri"], "name": link["name"], "mimeType": link["mimeType"],
            "size": link["size"]}  # fmt: skip


def _text(text: str) -> JSONValue:
    return {"type": "text", "text": text}


def _mime(mime: JSONValue, default: str) -> str:
    """The block's own mime type when it is well formed (a result is not refused for it)."""
    if not isinstance(mime, str):
        return default
    try:
        return checked_mime_type(mime, "")
    except ToolError:
        return default


def _extension(mime: JSONValue, default: str) -> str:
    if not isinstance(mime, str):
        return default
    return mimetypes.guess_extension(mime.partition(";")[0].strip(), strict=False) or default
