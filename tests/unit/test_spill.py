"""Large results become artifacts (``worker.spill``): which blocks are stored, what replaces
them, structuredContent, and the small result left exactly as it was. The publish function here
keeps the artifacts in a dict (the store side is tests/integration/test_artifact_limits.py and
tests/e2e/test_artifacts_large.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.tools.artifacts import ArtifactData, ResourceLink, artifact_chunks
from mcp_celery_tasks.tools.results import to_call_tool_result
from mcp_celery_tasks.worker.spill import MIN_SPILL_BYTES, PREVIEW_CHARS, json_size, spill


class Kept:
    """``ctx.artifact`` keeping the bytes in memory."""

    def __init__(self) -> None:
        self.stored: dict[str, tuple[str, bytes]] = {}

    def __call__(self, name: str, data: ArtifactData, mime_type: str | None) -> ResourceLink:
        raw = b"".join(artifact_chunks(data))
        uri = f"mcp-tasks://artifacts/id{len(self.stored)}/{name}"
        self.stored[uri] = (mime_type or "", raw)
        return {
            "type": "resource_link",
            "uri": uri,
            "name": name,
            "mimeType": mime_type or "",
            "size": len(raw),
        }


def _result(*content: Any) -> JSONObject:
    return {"content": list(content), "isError": False, "resultType": "complete"}


def test_a_large_text_block_becomes_a_link_and_a_marked_preview_and_small_ones_stay() -> None:
    kept = Kept()
    big = "line of log\n" * 50_000
    result = _result({"type": "text", "text": "summary: 50000 matches"}, {"type": "text", "text": big})
    out: Any = spill(result, kept, inline_bytes=64 * 1024)

    summary, link, preview = out["content"]
    assert summary == {"type": "text", "text": "summary: 50000 matches"}
    assert link["type"] == "resource_link" and link["name"] == "result-1.txt"
    assert link["size"] == len(big.encode()) and link["mimeType"] == "text/plain; charset=utf-8"
    assert kept.stored[link["uri"]] == ("text/plain; charset=utf-8", big.encode())
    assert preview["text"].startswith(
        f"[preview of result-1.txt ({len(big)} bytes): its first {PREVIEW_CHARS} "
    )
    assert preview["text"].endswith(big[:PREVIEW_CHARS])
    assert json_size(out) < 64 * 1024 and out["isError"] is False


def test_blocks_are_stored_largest_first_only_until_the_result_fits() -> None:
    kept = Kept()
    blocks = [{"type": "text", "text": c * size} for c, size in [("a", 30_000), ("b", 90_000), ("c", 50_000)]]
    out: Any = spill(_result(*blocks), kept, inline_bytes=100_000)
    assert [name for _, name in sorted((u, u.rsplit("/", 1)[1]) for u in kept.stored)] == ["result-1.txt"]
    assert out["content"][0] == blocks[0] and out["content"][-1] == blocks[2]


def test_image_audio_and_embedded_resource_bytes_are_stored_decoded_under_their_mime_type() -> None:
    kept = Kept()
    png, wav = b"\x89PNG" + bytes(range(256)) * 200, b"RIFF" + b"\x00" * 60_000
    result = _result(
        {"type": "image", "data": base64.b64encode(png).decode(), "mimeType": "image/png"},
        {"type": "audio", "data": base64.b64encode(wav).decode(), "mimeType": "not a mime type"},
        {
            "type": "resource",
            "resource": {"uri": "file:///x.csv", "mimeType": "text/csv", "text": "a,b\n" * 20_000},
        },
    )
    out: Any = spill(result, kept, inline_bytes=4096)
    links = [b for b in out["content"] if b["type"] == "resource_link"]
    # The extension comes from the mime type when the platform knows one (.bin otherwise).
    assert [(link["name"].split(".")[0], link["mimeType"]) for link in links] == [
        ("result-0", "image/png"),
        ("result-1", "application/octet-stream"),  # a malformed mime type does not fail the call
        ("result-2", "text/csv"),
    ]
    assert links[0]["name"] == "result-0.png" and links[2]["name"] == "result-2.csv"
    assert {link["uri"]: kept.stored[link["uri"]][1] for link in links} == {
        links[0]["uri"]: png,
        links[1]["uri"]: wav,
        links[2]["uri"]: ("a,b\n" * 20_000).encode(),
    }


def test_a_huge_structured_result_is_one_json_artifact_shared_with_its_text_block() -> None:
    kept = Kept()
    value = {"matches": [{"line": n, "text": "x" * 40} for n in range(20_000)]}
    result = to_call_tool_result(value)  # structuredContent plus the same JSON as text
    out: Any = spill(result, kept, inline_bytes=64 * 1024)

    assert "structuredContent" not in out
    ((uri, (mime, raw)),) = kept.stored.items()  # stored once
    assert mime == "application/json" and json.loads(raw) == value
    link, preview, note = out["content"]
    assert link["uri"] == uri and link["name"] == "structured-content.json"
    assert preview["text"].startswith("[preview of structured-content.json")
    assert "structuredContent" in note["text"] and "resources/read" in note["text"]


def test_what_cannot_be_stored_stays_as_it_came() -> None:
    kept = Kept()
    small = [{"type": "text", "text": "y" * (MIN_SPILL_BYTES - 100)} for _ in range(10)]
    not_base64 = {"type": "image", "data": "%%%" * 10_000, "mimeType": "image/png"}
    link = {"type": "resource_link", "uri": "https://example.com/x", "name": "x"}
    result = _result(*small, not_base64, link)
    assert spill(result, kept, inline_bytes=1024) == result  # the runner then applies max_result_bytes
    assert kept.stored == {}
