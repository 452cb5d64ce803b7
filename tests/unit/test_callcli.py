"""``call``'s checks before calling and what it prints, without a server."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from mcp_celery_tasks.client.arguments import UsageError, check_call, parse_args
from mcp_celery_tasks.client.view import (
    NOT_STARTED,
    duration,
    heard_from_tool,
    live_status,
    show_result,
    task_mode,
)
from tests import cliprobe

TOOLS: list[dict[str, Any]] = [
    {
        "name": "slow_compute",
        "inputSchema": {"type": "object", "properties": {"seconds": {}, "label": {}}},
        "_meta": {"io.github.mcp-celery-tasks/taskSupport": "optional"},
    },
    {
        "name": "train_model",
        "inputSchema": {
            "type": "object",
            "properties": {"model_path": {}, "epochs": {}},
            "required": ["model_path"],
        },
    },
    {"name": "noop", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "open", "inputSchema": {"type": "object", "additionalProperties": True}},
    {"name": "peer", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}},
]


def test_an_unknown_tool_is_refused_with_a_suggestion_and_the_list() -> None:
    with pytest.raises(UsageError) as refused:
        check_call(TOOLS, "slow_compte", {})
    assert "unknown tool 'slow_compte': did you mean slow_compute?" in str(refused.value)
    assert "Tools on this server: noop, open, peer, slow_compute, train_model" in str(refused.value)


def test_an_argument_the_schema_lacks_is_refused_with_the_valid_names() -> None:
    with pytest.raises(UsageError) as refused:
        check_call(TOOLS, "slow_compute", {"secs": "1"})
    assert str(refused.value) == (
        "slow_compute has no argument secs (did you mean seconds?); its arguments: [seconds], [label]"
    )
    with pytest.raises(UsageError, match="noop takes no arguments, got x"):
        check_call(TOOLS, "noop", {"x": "1"})


def test_a_missing_required_argument_is_refused() -> None:
    with pytest.raises(
        UsageError, match=r"train_model needs --arg model_path=…; its arguments: model_path, \[epochs\]"
    ):
        check_call(TOOLS, "train_model", {"epochs": "2"})


def test_a_schema_that_allows_more_properties_takes_any_argument() -> None:
    check_call(TOOLS, "open", {"anything": "1"})
    check_call(TOOLS, "slow_compute", {"seconds": "1"})


def test_arguments_parse_as_json_else_as_text() -> None:
    texts = parse_args(["n=3", "s=hello", "l=[1]", "e="])
    assert check_call(TOOLS, "open", texts) == {"n": 3, "s": "hello", "l": [1], "e": ""}
    with pytest.raises(UsageError, match="--arg expects key=value"):
        parse_args(["novalue"])


TYPED: list[dict[str, Any]] = [
    {
        "name": "typed",
        "inputSchema": {
            "type": "object",
            "properties": {
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "label": {"type": "string"},
                "flag": {"type": "boolean"},
                "paths": {"type": "array", "items": {"type": "string"}},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "any": {},
                "ref": {"$ref": "#/$defs/Thing"},
            },
        },
    }
]


@pytest.mark.parametrize(
    ("pair", "line"),
    [
        ("count=abc", "--arg count=abc: typed takes an integer for count"),
        ("count=1.5", "--arg count=1.5: typed takes an integer for count"),
        ("count=true", "--arg count=true: typed takes an integer for count"),
        ("ratio=fast", "--arg ratio=fast: typed takes a number for ratio"),
        ("flag=yes", "--arg flag=yes: typed takes true or false for flag"),
        ("paths=a.txt", "--arg paths=a.txt: typed takes a JSON list for paths"),
        ("limit=none", "--arg limit=none: typed takes an integer or null for limit"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_argument_and_the_type(pair: str, line: str) -> None:
    with pytest.raises(UsageError) as refused:
        check_call(TYPED, "typed", parse_args([pair]))
    assert str(refused.value) == line


def test_values_of_the_right_type_are_sent_as_json_and_text_stays_text() -> None:
    pairs = ["count=3", "ratio=2", "label=123", 'paths=["a"]', "flag=false", "limit=null", "any=x", "ref=7"]
    assert check_call(TYPED, "typed", parse_args(pairs)) == {
        "count": 3,
        "ratio": 2,  # an integer is a number
        "label": "123",  # a string parameter gets the text as typed, not the number
        "paths": ["a"],
        "flag": False,
        "limit": None,
        "any": "x",
        "ref": 7,  # a schema the client cannot read takes anything (the server checks it)
    }
    assert check_call(TYPED, "typed", parse_args(['label="quoted"'])) == {"label": "quoted"}


def test_the_live_line_says_a_silent_task_may_still_wait_for_a_worker() -> None:
    created = {"taskId": "t", "status": "working"}
    assert live_status(created, heard=heard_from_tool(created)) == NOT_STARTED
    queued = {"taskId": "t", "status": "working", "statusMessage": "queued: 3 ahead"}
    assert not heard_from_tool(queued)  # the server's word on the backlog, not the tool's
    assert live_status(queued, heard=False) == "queued: 3 ahead"
    running = {"taskId": "t", "status": "working", "statusMessage": "computing"}
    assert heard_from_tool(running) and live_status(running, heard=True) == "computing"
    assert live_status(created, heard=True) == ""  # the tool ran and has nothing to say now
    assert heard_from_tool({"taskId": "t", "status": "input_required"})


def test_the_task_mode_comes_from_meta_or_execution() -> None:
    assert [task_mode(t) for t in TOOLS] == ["optional", None, None, None, "required"]


def _shown(result: dict[str, Any], terminal: bool = False) -> str:
    screen = io.StringIO()
    out = Console(
        file=screen, force_terminal=terminal, width=60, color_system="standard" if terminal else None
    )
    show_result(out, result)
    return screen.getvalue()


def test_structured_content_is_indented_once_not_one_long_line() -> None:
    value = {"counts": {"a": 1, "b": 2}}
    shown = _shown(
        {
            "content": [{"type": "text", "text": json.dumps(value)}],
            "structuredContent": value,
            "isError": False,
        }
    )
    assert shown == json.dumps(value, indent=2) + "\n"


def test_json_text_is_indented_and_other_text_printed_as_is() -> None:
    shown = _shown(
        {"content": [{"type": "text", "text": '[1, {"a": 2}]'}, {"type": "text", "text": "[red]x"}]}
    )
    assert shown == json.dumps([1, {"a": 2}], indent=2) + "\n[red]x\n"


def test_structured_content_is_highlighted_on_a_terminal() -> None:
    shown = _shown({"content": [], "structuredContent": {"a": 1}}, terminal=True)
    assert "\x1b[" in shown and '"a"' in shown


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.04, "0.0 s"), (12.34, "12.3 s"), (245, "4 min 05 s"), (7620, "2 h 07 min")]
)
def test_durations_read_naturally(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.fixture(scope="module")
def help_shown() -> dict[str, cliprobe.Screen]:
    """``call --help`` and ``tools --help`` in one interpreter, with nothing of this shell's
    environment but a PATH."""
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin"}
    commands = ["call", "tools"]
    screens = cliprobe.help_screens([((command, "--help"), env) for command in commands])
    return dict(zip(commands, screens, strict=True))


@pytest.mark.parametrize("command", ["call", "tools"])
def test_help_shows_what_to_type_not_python_types(
    help_shown: dict[str, cliprobe.Screen], command: str
) -> None:
    shown = help_shown[command]
    assert shown.code == 0, shown.stderr
    for tag in ("<str>", "<bool>", "<list", "<path>", "<float>", "<int>"):
        assert tag not in shown.stdout
    assert "--url" in shown.stdout and "URL" in shown.stdout
    if command == "call":
        assert "KEY=VALUE" in shown.stdout and "FILE" in shown.stdout and "Exit codes" in shown.stdout


def test_the_client_reads_the_mode_key_the_server_writes() -> None:
    from mcp_celery_tasks import wire
    from mcp_celery_tasks.client import view as callview

    assert callview.MODE == wire.TOOL_MODE_META_KEY
    assert callview.PLACE_IN_LINE == wire.PLACE_IN_LINE
