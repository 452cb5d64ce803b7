"""Answers to input requests are checked against the request they answer before anything is
recorded: ElicitResult against the requested schema, sampling and roots results by shape."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.tools.inputs import ELICIT, ROOTS, SAMPLE, elicit_params, params_hash, validate_response

SCHEMA = {
    "type": "object",
    "properties": {
        "confirm": {"type": "boolean"},
        "count": {"type": "integer"},
        "color": {"type": "string", "enum": ["red", "blue"]},
    },
    "required": ["confirm"],
}
FORM = elicit_params("Go?", SCHEMA)


@pytest.mark.parametrize(
    "answer",
    [
        {"action": "accept", "content": {"confirm": True}},
        {"action": "accept", "content": {"confirm": False, "count": 3, "color": "red", "extra": 1}},
        {"action": "decline"},
        {"action": "cancel", "content": {}},
    ],
)
def test_valid_elicit_answers_pass(answer: dict[str, Any]) -> None:
    assert validate_response("k", ELICIT, FORM, answer) == answer


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("yes", "must be an object"),
        ({"action": "maybe"}, "action"),
        ({"action": "decline", "content": {"confirm": True}}, "only allowed with action accept"),
        ({"action": "accept", "content": {}}, "required field 'confirm'"),
        ({"action": "accept", "content": {"confirm": "yes"}}, "type boolean"),
        ({"action": "accept", "content": {"confirm": True, "count": True}}, "type integer"),
        ({"action": "accept", "content": {"confirm": True, "color": "green"}}, "one of"),
        ({"action": "accept", "content": [1]}, "must be an object"),
    ],
)
def test_invalid_elicit_answers_name_the_problem(answer: Any, problem: str) -> None:
    with pytest.raises(InvalidParams, match=problem):
        validate_response("k", ELICIT, FORM, answer)


def test_extra_fields_are_refused_when_the_schema_says_so() -> None:
    strict = elicit_params("Go?", {**SCHEMA, "additionalProperties": False})
    with pytest.raises(InvalidParams, match="unexpected field"):
        validate_response("k", ELICIT, strict, {"action": "accept", "content": {"confirm": True, "x": 1}})


def test_sampling_and_roots_answers_are_checked_by_shape() -> None:
    message = {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}
    assert validate_response("k", SAMPLE, {}, message) == message
    assert validate_response("k", ROOTS, None, {"roots": [{"uri": "file:///x"}]})
    with pytest.raises(InvalidParams):
        validate_response("k", SAMPLE, {}, {"role": "assistant"})
    with pytest.raises(InvalidParams):
        validate_response("k", ROOTS, None, {"roots": "all"})


def test_the_hash_of_a_request_is_stable_and_sensitive() -> None:
    assert params_hash(ELICIT, FORM) == params_hash(ELICIT, dict(reversed(list(FORM.items()))))
    assert params_hash(ELICIT, FORM) != params_hash(ELICIT, elicit_params("Go!", SCHEMA))
    assert params_hash(ROOTS, None) != params_hash(ELICIT, None)
