"""The HTTP edge's own request reading (``intake``): headers read once, the body read straight
from ASGI messages. The whole edge runs against a real server in tests/e2e/test_http_protocol.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from starlette.requests import Request

from mcp_celery_tasks.api.intake import Disconnected, read_body, request_headers


def _request(headers: list[tuple[bytes, bytes]], messages: Iterable[dict[str, Any]] = ()) -> Request:
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        return pending.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "query_string": b""}
    return Request(scope, receive)


def test_a_repeated_header_keeps_its_first_value_as_starlette_does() -> None:
    raw = [
        (b"authorization", b"Bearer first"),
        (b"mcp-method", b"tasks/get"),
        (b"authorization", b"Bearer second"),
    ]
    request = _request(raw)
    headers = request_headers(request.scope["headers"])
    assert headers["authorization"] == request.headers.get("authorization") == "Bearer first"
    assert headers["mcp-method"] == "tasks/get"


def test_a_non_ascii_header_value_is_read_as_latin_1_like_starlette() -> None:
    request = _request([(b"mcp-name", "café".encode())])
    assert request_headers(request.scope["headers"])["mcp-name"] == request.headers["mcp-name"]


async def test_a_body_in_several_messages_is_joined() -> None:
    parts = [{"type": "http.request", "body": b'{"a":', "more_body": True}]
    parts.append({"type": "http.request", "body": b"1}", "more_body": False})
    assert await read_body(_request([], parts).receive, None, 100) == b'{"a":1}'


async def test_a_body_over_the_limit_is_refused_while_it_streams_or_by_its_declared_length() -> None:
    parts = [{"type": "http.request", "body": b"x" * 60, "more_body": True}] * 2
    assert await read_body(_request([], parts).receive, None, 100) is None
    assert await read_body(_request([]).receive, "101", 100) is None  # no message is read at all


async def test_a_client_that_disconnects_mid_body_ends_the_read() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.disconnect"},
    ]
    with pytest.raises(Disconnected):
        await read_body(_request([], parts).receive, None, 100)
