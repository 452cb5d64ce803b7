"""Turning what a tool returns into the ``CallToolResult`` stored on the row."""

from __future__ import annotations

import json
from typing import Any

from mcp_types import CallToolResult
from pydantic import BaseModel

from mcp_celery_tasks.json_types import JSONObject

__all__ = ["error_result", "to_call_tool_result"]


def _text(text: str) -> JSONObject:
    return {"type": "text", "text": text}


def to_call_tool_result(value: Any) -> JSONObject:
    """A ``CallToolResult`` as JSON (with ``resultType: "complete"``) for a tool's return value
    (any value: the tool's to return).

    ``str`` becomes one text block; a ``CallToolResult`` passes through; other JSON values
    become ``structuredContent`` with their JSON as text (2026-07-28 allows any JSON value).
    """
    if isinstance(value, CallToolResult):
        data = value.model_dump(by_alias=True, exclude_none=True, mode="json")
        data["resultType"] = "complete"
        return data
    if isinstance(value, str):
        return {"content": [_text(value)], "isError": False, "resultType": "complete"}
    if value is None:
        return {"content": [], "isError": False, "resultType": "complete"}
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return {
        "content": [_text(text)],
        "structuredContent": value,
        "isError": False,
        "resultType": "complete",
    }


def error_result(message: str) -> JSONObject:
    """A tool-level error: the task still ends ``completed`` (SEP-2663 S-17)."""
    return {"content": [_text(message)], "isError": True, "resultType": "complete"}
