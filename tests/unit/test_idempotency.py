"""The idempotency key's shape, the call digest and the mismatch errors (no server needed; the
behaviour on the real server is tests/e2e/test_idempotency.py)."""

from __future__ import annotations

import dataclasses

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.tasks.idempotency import MAX_KEY_LENGTH, check_replay, idempotency_key, request_digest
from mcp_celery_tasks.wire import IDEMPOTENCY_KEY_META_KEY as KEY
from tests.unit.test_wire_parity import RECORD


def test_no_meta_or_no_key_means_no_key() -> None:
    assert idempotency_key(None) is None
    assert idempotency_key({}) is None
    assert idempotency_key({"idempotencyKey": "not ours"}) is None


@pytest.mark.parametrize(
    "key", ["a", "x" * MAX_KEY_LENGTH, " ~!{}\"'\\", "550e8400-e29b-41d4-a716-446655440000"]
)
def test_printable_ascii_keys_up_to_255_characters_are_taken_as_they_are(key: str) -> None:
    assert idempotency_key({KEY: key}) == key


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "1 to 255 characters long, not 0"),
        ("x" * (MAX_KEY_LENGTH + 1), "not 256"),
        (7, "must be a string, not int"),
        (None, "must be a string, not NoneType"),
        ({"k": 1}, "must be a string, not dict"),
        ("a\nb", "printable ASCII"),
        ("a\x1bb", "printable ASCII"),
        ("\x7f", "printable ASCII"),
        ("clé", "printable ASCII"),
    ],
)
def test_any_other_key_is_invalid_params_naming_the_field(key: object, says: str) -> None:
    with pytest.raises(InvalidParams) as raised:
        idempotency_key({KEY: key})
    assert raised.value.code == codes.INVALID_PARAMS
    assert KEY in raised.value.message and says in raised.value.message


def test_the_digest_ignores_key_order_and_tells_tools_and_values_apart() -> None:
    base = request_digest("t", {"a": 1, "b": {"x": [1, 2], "y": "z"}})
    assert base == request_digest("t", {"b": {"y": "z", "x": [1, 2]}, "a": 1})
    assert base != request_digest("u", {"a": 1, "b": {"x": [1, 2], "y": "z"}})
    assert base != request_digest("t", {"a": 1, "b": {"x": [2, 1], "y": "z"}})
    assert request_digest("t", {"a": 1}) != request_digest("t", {"a": "1"})
    assert len(base) == 64


def test_a_replay_of_the_same_call_passes_and_a_mismatch_names_what_differs() -> None:
    digest = request_digest(RECORD.tool_name, {"a": 1})
    record = dataclasses.replace(RECORD, request_digest=digest)
    check_replay(record, RECORD.tool_name, digest)
    with pytest.raises(InvalidParams) as tool:
        check_replay(record, "other_tool", request_digest("other_tool", {"a": 1}))
    assert tool.value.data == {"taskId": RECORD.task_id, "mismatch": "tool"}
    assert "another tool" in tool.value.message
    with pytest.raises(InvalidParams) as arguments:
        check_replay(record, RECORD.tool_name, request_digest(RECORD.tool_name, {"a": 2}))
    assert arguments.value.data == {"taskId": RECORD.task_id, "mismatch": "arguments"}
    assert "other arguments" in arguments.value.message
