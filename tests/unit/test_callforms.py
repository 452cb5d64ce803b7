"""``call``'s answers: forms that never pick the consequential choice, and checked answer files."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mcp_celery_tasks.client.forms import (
    SAMPLING_DECLINED,
    Answerer,
    AnswersError,
    _Choice,
    _Field,
    load_answers,
)
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.tools.inputs import validate_response


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


def _said(console: Console) -> str:
    """What ``_console()`` printed so far."""
    screen = console.file
    assert isinstance(screen, io.StringIO)
    return screen.getvalue()


def _typed(lines: list[str]) -> io.StringIO:
    return io.StringIO("".join(line + "\n" for line in lines))


def _ask(prop: dict[str, Any], lines: list[str], *, required: bool = False) -> tuple[Any, str]:
    console = _console()
    value = _Field(console, "field", prop, required)(stream=_typed(lines))
    output = _said(console)
    return value, output


def test_enter_alone_never_accepts_a_form() -> None:
    console = _console()
    assert _Choice(console)(stream=_typed(["", "", "d"])) == "decline"
    assert _said(console).count("Type a (accept), d (decline) or c (cancel)") == 2


@pytest.mark.parametrize(("typed", "action"), [("a", "accept"), ("ACCEPT", "accept"), ("c", "cancel")])
def test_the_form_choice_takes_a_prefix(typed: str, action: str) -> None:
    assert _Choice(_console())(stream=_typed([typed])) == action


def test_a_boolean_without_a_schema_default_needs_an_explicit_answer() -> None:
    value, output = _ask({"type": "boolean"}, ["", "", "n"])
    assert value is False
    assert output.count("Type y or n") == 2
    assert "[y/n]" in output


def test_an_optional_boolean_without_a_default_still_needs_an_answer() -> None:
    value, output = _ask({"type": "boolean"}, ["", "yes"], required=False)
    assert value is True
    assert "Type y or n" in output


@pytest.mark.parametrize(("default", "hint"), [(False, "[y/N]"), (True, "[Y/n]")])
def test_a_boolean_schema_default_is_honoured(default: bool, hint: str) -> None:
    value, output = _ask({"type": "boolean", "default": default}, [""])
    assert value is default
    assert hint in output


def test_schema_defaults_of_other_fields_are_honoured() -> None:
    assert _ask({"type": "integer", "default": 3}, [""])[0] == 3
    assert _ask({"type": "string", "enum": ["red", "blue"], "default": "blue"}, [""])[0] == "blue"
    assert _ask({"type": "string", "default": "x"}, [""], required=True)[0] == "x"


def test_enter_leaves_an_optional_field_out_and_asks_a_required_one_again() -> None:
    assert _ask({"type": "string"}, [""])[0] is None
    assert _ask({"type": "string", "enum": ["red", "blue"]}, [""])[0] is None
    value, output = _ask({"type": "string", "enum": ["red", "blue"]}, ["", "green", "red"], required=True)
    assert value == "red"
    assert "An answer is needed" in output and "Choose from red, blue" in output


def test_numbers_are_parsed_and_kept_in_range() -> None:
    value, output = _ask({"type": "integer", "minimum": 1, "maximum": 5}, ["x", "9", "4"], required=True)
    assert value == 4
    assert "Type a whole number" in output and "At most 5" in output
    assert _ask({"type": "number"}, ["2.5"], required=True)[0] == 2.5


def test_an_integer_enum_answers_an_integer_and_a_multi_select_a_list() -> None:
    assert _ask({"type": "integer", "enum": [1, 2]}, ["2"], required=True)[0] == 2
    items = {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}}
    assert _ask(items, ["a, c"], required=True)[0] == ["a", "c"]


# ---- without a terminal ----------------------------------------------------------------------

FORM: JSONObject = {"method": "elicitation/create", "params": {"message": "Delete x?", "requestedSchema": {}}}


def test_without_a_terminal_an_unanswered_form_is_declined_and_said() -> None:
    console = _console()
    answerer = Answerer(console, interactive=False, answers={})
    assert answerer("confirm", FORM) == {"action": "decline"}
    said = _said(console)
    assert said == 'declined form "confirm" (Delete x?): no terminal to answer it (use --answers FILE)\n'
    assert answerer.declined == ["confirm"]


SAMPLE: JSONObject = {
    "method": "sampling/createMessage",
    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5},
}


def test_without_a_terminal_a_sampling_request_is_declined_at_once_and_said() -> None:
    console = _console()
    answerer = Answerer(console, interactive=False, answers={})
    answer = answerer("summary", SAMPLE)
    assert answer == SAMPLING_DECLINED
    said = _said(console)
    assert said == 'declined sampling request "summary": no terminal to answer it (use --answers FILE)\n'
    # The server takes it as an answer (an outstanding request would keep the task waiting).
    assert validate_response("summary", SAMPLE["method"], SAMPLE["params"], answer) == answer  # type: ignore[arg-type]


def test_a_sampling_request_is_answered_from_the_file_by_key_never_by_the_form_wildcard() -> None:
    reply: JSONObject = {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "me"}
    assert Answerer(_console(), interactive=False, answers={"summary": reply})("summary", SAMPLE) == reply
    console = _console()
    wildcard = Answerer(console, interactive=False, answers={"*": {"action": "accept"}})
    assert wildcard("summary", SAMPLE) == SAMPLING_DECLINED
    assert '--answers has no "summary" (it has "*")' in _said(console)


def test_a_declined_form_names_the_keys_the_answers_file_has() -> None:
    console = _console()
    answerer = Answerer(console, interactive=False, answers={"confim": {"action": "accept"}})
    assert answerer("confirm", FORM) == {"action": "decline"}
    assert '--answers has no "confirm" or "*" (it has "confim")' in _said(console)


def test_answers_by_key_and_for_any_form() -> None:
    accept: JSONObject = {"action": "accept", "content": {"confirm": True}}
    assert Answerer(_console(), interactive=False, answers={"k": accept})("k", FORM) == accept
    assert Answerer(_console(), interactive=False, answers={"*": accept})("other", FORM) == accept


# ---- the answers file --------------------------------------------------------------------------


def _file(tmp_path: Path, content: str) -> Path:
    path = tmp_path / "answers.json"
    path.write_text(content)
    return path


def test_a_good_answers_file_loads(tmp_path: Path) -> None:
    answers = {
        "*": {"action": "accept", "content": {"confirm": True, "tags": ["a"], "n": 2}},
        "no": {"action": "decline"},
        "llm": {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "me"},
        "roots": {"roots": []},
    }
    assert load_answers(_file(tmp_path, json.dumps(answers))) == answers


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "is not JSON"),
        ("[]", "expected an object of input key → answer"),
        ('{"confirm": true}', '"confirm": expected an answer object such as'),
        ('{"*": {"action": "yes"}}', '"*": "action" must be "accept", "decline" or "cancel", got "yes"'),
        ('{"k": {"action": "decline", "content": {"a": 1}}}', '"content" goes only with "action": "accept"'),
        ('{"k": {"action": "accept", "content": [1]}}', '"content" must be an object'),
        ('{"k": {"action": "accept", "content": {"a": {"b": 1}}}}', '"content.a" must be a string'),
        ('{"k": {"acton": "accept"}}', 'not an answer (it has "acton")'),
        ('{"*": {"roots": []}}', '"*": not an answer'),
    ],
)
def test_a_wrong_answers_file_is_refused_naming_the_problem(
    tmp_path: Path, content: str, problem: str
) -> None:
    with pytest.raises(AnswersError) as refused:
        load_answers(_file(tmp_path, content))
    assert problem in str(refused.value)


def test_a_missing_or_unreadable_answers_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AnswersError, match=r"cannot read --answers .*missing\.json: No such file"):
        load_answers(tmp_path / "missing.json")
    with pytest.raises(AnswersError, match="cannot read --answers"):
        load_answers(tmp_path)  # a directory
