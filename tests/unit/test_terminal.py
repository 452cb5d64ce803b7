"""``terminal.plain``: nothing a terminal acts on survives; readable text does."""

from __future__ import annotations

import pytest

from mcp_celery_tasks.client.terminal import plain, plain_json
from mcp_celery_tasks.json_types import JSONValue


@pytest.mark.parametrize(
    ("hostile", "shown"),
    [
        ("\x1b]0;pwned\x07title", "title"),  # OSC window title, ended by BEL
        ("\x1b]0;pwned\x1b\\title", "title"),  # ... or by ST
        ("\x1b[2J\x1b[Hscreen", "screen"),  # clear and home
        ("\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\", "click"),  # OSC 8 hyperlink
        ("\x9b31mred\x9d0;t\x9cx", "redx"),  # 8-bit CSI and OSC
        ("\x1bPdevice\x1b\\ok", "ok"),  # DCS string
        ("\x1bcreset", "reset"),  # a two-byte escape
        ("\x1b]52;c;ZXZpbA==\x07", ""),  # clipboard write
        ("evil\u202egnp.exe\u2066x\u2069", "evilgnp.exex"),  # bidi override and isolates
        ("nul\x00bell\x07del\x7f", "nulbelldel"),
        ("half \x1b[", "half "),  # a sequence cut off at the end
        ("[bold]x[/bold] [link=https://e]y[/link]", "[bold]x[/bold] [link=https://e]y[/link]"),
        ("héllo ✓ 日本", "héllo ✓ 日本"),
    ],
)
def test_control_sequences_go_and_text_stays(hostile: str, shown: str) -> None:
    assert plain(hostile) == shown


def test_line_breaks_are_spaces_in_a_cell_and_kept_on_request() -> None:
    assert plain("a\tb\nc\r\nd") == "a b c  d"
    assert plain("a\tb\nc\r\nd", newlines=True) == "a b\nc\nd"
    assert plain(None) == "" and plain(42) == "42"


def test_every_string_of_a_json_value_is_plain_keys_included() -> None:
    value: JSONValue = {"\x1b[31mkey": ["\x1b]0;t\x07v", 1, None, {"n": "line\nbreak"}]}
    assert plain_json(value) == {"key": ["v", 1, None, {"n": "line\nbreak"}]}
