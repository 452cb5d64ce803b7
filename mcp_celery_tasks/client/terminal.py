"""Text from callers, tools or the database made safe to show on a terminal.

A JWT ``sub``, a tool name, a status message or an error is written by someone else. Printed
raw, ``ESC ] 0 ; … BEL`` retitles the operator's window, ``ESC [ 2 J`` clears the screen,
``ESC ] 8 ; ; url ST`` makes a fake hyperlink, and a right-to-left override reorders what is
shown (``evil\u202egnp.exe``). Every CLI value from outside goes through ``plain`` (and is then
rendered as a Rich ``Text`` or with markup off, so ``[bold]`` stays literal).

What goes: escape sequences whole (CSI, OSC up to BEL or ST, DCS/SOS/PM/APC strings, and
two-byte escapes), their 8-bit C1 forms, every other C0 and C1 control and DEL, and the Unicode
bidi controls. Tabs and line breaks become spaces unless the caller keeps line breaks (a
multi-line result shown on its own), so one value cannot fake a table row. ``--json`` output is
JSON for programs and is not altered (JSON escapes C0 controls itself).
"""

from __future__ import annotations

import re

from mcp_celery_tasks.json_types import JSONValue

__all__ = ["plain", "plain_json"]

_SEQUENCES = re.compile(
    r"""
    (?:\x1b\[|\x9b) [\x30-\x3f]* [\x20-\x2f]* [\x40-\x7e]?        # CSI … final byte
  | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]) .*? (?:\x07|\x1b\\|\x9c|$)  # OSC, DCS, SOS, PM, APC … BEL/ST
  | \x1b [\x20-\x2f]* [\x30-\x7e]?                                 # two-byte (and nF) escapes
    """,
    re.VERBOSE | re.DOTALL,
)
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0), *map(ord, _BIDI)]
_ONE_LINE: dict[int, str | None] = {code: None for code in _CONTROLS} | dict.fromkeys(
    map(ord, "\t\n\r\v\f"), " "
)
_LINES: dict[int, str | None] = (
    {code: None for code in _CONTROLS}
    | {ord("\t"): " ", ord("\v"): "\n", ord("\f"): "\n"}
    | {ord("\n"): "\n"}
)


def plain(value: object, *, newlines: bool = False) -> str:
    """``value`` as text with nothing a terminal would act on (``None`` is empty)."""
    if value is None:
        return ""
    return _SEQUENCES.sub("", str(value)).translate(_LINES if newlines else _ONE_LINE)


def plain_json(value: JSONValue) -> JSONValue:
    """A JSON value whose every string (keys included) went through ``plain`` (line breaks kept:
    a JSON string shows them escaped)."""
    if isinstance(value, str):
        return plain(value, newlines=True)
    if isinstance(value, list):
        return [plain_json(item) for item in value]
    if isinstance(value, dict):
        return {plain(key): plain_json(item) for key, item in value.items()}
    return value
