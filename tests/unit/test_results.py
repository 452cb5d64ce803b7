"""What a tool returns becomes the ``CallToolResult`` stored on the row."""

from __future__ import annotations

import json
from typing import Any

from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel

from mcp_celery_tasks.tools.results import error_result, to_call_tool_result


class Report(BaseModel):
    accuracy: float
    labels: list[str]


def test_string_becomes_one_text_block() -> None:
    assert to_call_tool_result("done") == {
        "content": [{"type": "text", "text": "done"}],
        "isError": False,
        "resultType": "complete",
    }


def test_none_becomes_empty_content() -> None:
    assert to_call_tool_result(None) == {"content": [], "isError": False, "resultType": "complete"}


def test_dict_becomes_structured_content_with_its_json_as_text() -> None:
    value = {"rows": 3, "names": ["é", "b"]}
    result: Any = to_call_tool_result(value)  # read by path
    assert result["structuredContent"] == value
    assert result["isError"] is False
    assert result["resultType"] == "complete"
    [block] = result["content"]
    assert block["type"] == "text"
    assert json.loads(block["text"]) == value
    assert "é" in block["text"]  # not \u-escaped


def test_list_becomes_structured_content() -> None:
    result: Any = to_call_tool_result([1, 2, 3])
    assert result["structuredContent"] == [1, 2, 3]
    assert json.loads(result["content"][0]["text"]) == [1, 2, 3]


def test_pydantic_model_becomes_its_json_dump() -> None:
    result: Any = to_call_tool_result(Report(accuracy=0.9, labels=["cat"]))
    assert result["structuredContent"] == {"accuracy": 0.9, "labels": ["cat"]}
    assert json.loads(result["content"][0]["text"]) == {"accuracy": 0.9, "labels": ["cat"]}


def test_call_tool_result_passes_through() -> None:
    value = CallToolResult(
        content=[TextContent(type="text", text="partial")],
        structured_content={"ok": False},
        is_error=True,
    )
    assert to_call_tool_result(value) == {
        "content": [{"type": "text", "text": "partial"}],
        "structuredContent": {"ok": False},
        "isError": True,
        "resultType": "complete",
    }


def test_error_result_is_an_error_with_the_message() -> None:
    assert error_result("disk full") == {
        "content": [{"type": "text", "text": "disk full"}],
        "isError": True,
        "resultType": "complete",
    }
