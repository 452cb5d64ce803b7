"""Header value decoding and task ids."""

from __future__ import annotations

import base64
import re

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import HeaderMismatch
from mcp_celery_tasks.protocol.rpc import decode_header_value
from mcp_celery_tasks.tasks.service import new_task_id

URL_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def encoded(raw: bytes) -> str:
    return "=?base64?" + base64.b64encode(raw).decode() + "?="


@pytest.mark.parametrize("value", ["slow_compute", "a-task_ID", "name=?x", "=?base64?"])
def test_plain_header_value_is_returned_unchanged(value: str) -> None:
    assert decode_header_value(value) == value


def test_base64_header_value_is_decoded_as_utf8() -> None:
    assert decode_header_value(encoded("résumé_工具".encode())) == "résumé_工具"


def test_base64_header_value_may_encode_plain_ascii() -> None:
    assert decode_header_value(encoded(b"greet")) == "greet"


@pytest.mark.parametrize("value", ["=?base64?not base64!?=", "=?base64?abc?=", "=?base64?YWJj=ZA==?="])
def test_invalid_base64_header_value_is_a_header_mismatch(value: str) -> None:
    with pytest.raises(HeaderMismatch) as raised:
        decode_header_value(value)
    assert raised.value.code == codes.HEADER_MISMATCH


def test_base64_of_invalid_utf8_is_a_header_mismatch() -> None:
    with pytest.raises(HeaderMismatch) as raised:
        decode_header_value(encoded(b"\xff\xfe"))
    assert raised.value.code == codes.HEADER_MISMATCH


def test_task_id_is_long_and_url_safe() -> None:
    task_id = new_task_id()
    assert len(task_id) >= 32  # at least 128 bits of entropy, in base64
    assert URL_SAFE.match(task_id)


def test_task_id_is_never_of_the_encoded_header_form() -> None:
    for _ in range(200):
        task_id = new_task_id()
        assert "=" not in task_id and "?" not in task_id
        assert decode_header_value(task_id) == task_id


def test_task_ids_are_unique() -> None:
    ids = [new_task_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(task_id) >= 32 and URL_SAFE.match(task_id) for task_id in ids)
