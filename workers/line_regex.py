"""The user's pattern for search_logs: compiled with RE2 to match within one line, and the
literal every match contains (a fast pre-filter).

RE2 (google-re2) runs in time linear in the text: no pattern can backtrack for hours on a
crafted line. It has no backreferences or lookaround; those patterns are refused with a message
that says so. The pattern is compiled with ``(?m)`` and ``never_nl``, so a block of many lines
can be searched at once and a match still never leaves its line.
"""

from __future__ import annotations

import re
import string
from typing import Any, Protocol

import re2

from mcp_celery_tasks import ToolError

__all__ = ["compile_pattern", "required_literal"]

_QUANTIFIER = re.compile(r"[*+?]|\{\d*(?:,\d*)?\}")
_ESCAPED_LITERAL = frozenset(string.punctuation + " ")
_CASELESS = re.compile(r"\(\?[a-zA-Z]*i")
_FLAGS = re.compile(r"[a-zA-Z]*(?:-[a-zA-Z]*)?")

_LINE_OPTIONS = re2.Options()
_LINE_OPTIONS.never_nl = True  # no match spans a line break, so a block of lines is searched at once
_LINE_OPTIONS.log_errors = False  # a bad pattern is the caller's mistake, not a log line


class _Patterned(Protocol):
    @property
    def pattern(self) -> str: ...


def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled with RE2 to match within one line (``^`` and ``$`` at its ends).

    A ``ToolError`` for what RE2 cannot run (backreferences, lookaround) and for what would not
    mean "within one line" when a block of lines is searched at once (``\\A``, ``\\z``, ``\\C``,
    turning the ``m`` flag off).
    """
    construct = _whole_text_construct(pattern)
    if construct is not None:
        raise ToolError(
            f"{construct} is not supported in {pattern!r}: the pattern is matched against one line"
            " at a time; use ^ and $ for the start and the end of a line"
        )
    try:
        return re2.compile("(?m)" + pattern, _LINE_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ToolError(
            f"invalid regular expression {pattern!r}: {reason}. Patterns run on RE2, in linear time:"
            r" backreferences (\1) and lookaround ((?=...), (?!...), (?<=...), (?<!...)) are not supported"
        ) from exc


def _whole_text_construct(pattern: str) -> str | None:
    """The first construct of ``pattern`` that means the start, the end or a byte of the text."""
    i = 0
    while i < len(pattern):
        if pattern.startswith("\\Q", i):  # literal text up to \E
            end = pattern.find("\\E", i + 2)
            i = len(pattern) if end < 0 else end + 2
        elif pattern[i] == "\\":
            if pattern[i + 1 : i + 2] in ("A", "z", "C"):
                return pattern[i : i + 2]
            i += 2
        elif pattern[i] == "[":
            i = _skip_class(pattern, i)
        elif pattern.startswith("(?", i):
            flags = _FLAGS.match(pattern, i + 2)
            if flags and "m" in flags.group().partition("-")[2]:
                return f"(?{flags.group()})"
            i += 2
        else:
            i += 1
    return None


def required_literal(regex: _Patterned) -> str | None:
    """A string that every match of ``regex`` contains (the longest run of plain characters at
    the top level), or None when there is no useful one.

    Conservative: anything it does not understand ends a run, so what it returns is always
    required. Case-insensitive, verbose, ``\\Q...\\E`` and top-level alternation patterns have none.
    """
    if isinstance(regex, re.Pattern) and regex.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    pattern = regex.pattern
    if _CASELESS.search(pattern) or "\\Q" in pattern:
        return None
    runs: list[str] = []
    run: list[str] = []

    def close() -> None:
        if run:
            runs.append("".join(run))
            run.clear()

    i = 0
    while i < len(pattern):
        char = pattern[i]
        quantifier = _QUANTIFIER.match(pattern, i)
        if quantifier:
            if run:
                run.pop()  # the character before is optional or repeated
            close()
            i = quantifier.end()
        elif char == "\\":
            following = pattern[i + 1 : i + 2]
            if following in _ESCAPED_LITERAL:
                run.append(following)
                i += 2
                continue
            close()  # a class (\d), an anchor (\b), a code (\x41, \N{...}, \p{L}) or a backreference
            if following in ("N", "p", "P", "x") and pattern.startswith("{", i + 2):
                i = pattern.find("}", i) + 1 or len(pattern)
            else:
                i += 2
                while i < len(pattern) and pattern[i].isalnum():
                    i += 1
        elif char == "|":
            return None
        elif char in "([":
            close()
            i = _skip_group(pattern, i) if char == "(" else _skip_class(pattern, i)
        elif char in ".^${}":
            close()
            i += 1
        else:
            run.append(char)
            i += 1
    close()
    usable = [r for r in runs if len(r.encode()) >= 3 and not set(r) & {"\n", "\r", "\ufffd"}]
    return max(usable, key=lambda r: len(r.encode()), default=None)


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class that starts at ``pattern[i] == "["``."""
    i += 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        if pattern.startswith("[:", i):  # an RE2 (POSIX) class: [[:alpha:]]
            end = pattern.find(":]", i + 2)
            i = len(pattern) if end < 0 else end + 2
        else:
            i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _skip_group(pattern: str, i: int) -> int:
    """The index after the group that starts at ``pattern[i] == "("``."""
    depth = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _skip_class(pattern, i)
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        i += 1
        if depth == 0:
            break
    return i
