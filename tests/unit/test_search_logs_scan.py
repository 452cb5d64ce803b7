"""search_logs' scanning core against a plain line-by-line search: same matches, same line
numbers, same counts, whatever the block size, the pre-filter or the pause points."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.search_logs import required_literal, scan

PATTERNS = [
    "abc", r"ab?c", r"^abc", r"abc\s*$", r"c a", "a", r"\s", "x*", r"a.b", r"(?s)a.b", r"[^c]b", r"^$",
    r"\bab\b", r"a(?=b)", r"b\Z", r"a[^z]*b", r"\n", r"(?i)ABC", r"aab|bba", r"(ab|cd)abc", r"\x61bc",
    r"abc\d{0,2}", r"[abc]{2,}cab", r"é\wa", r"\N{LATIN SMALL LETTER A}bc", "\ufffd", r"aaa\r",
]  # fmt: skip
TOKENS = ["a", "b", "c", " ", "\n", "\n", "\r\n", "\r", "\t", "é", "abc", "cab ", "\xff", "x" * 40]


def reference(paths: list[Path], regex: re.Pattern[str]) -> tuple[list[tuple[str, int, str]], list[int], int]:
    """(matches, the global line number of each match, total lines): lines end at \\n, one
    trailing \\r is dropped, undecodable bytes become U+FFFD."""
    matches: list[tuple[str, int, str]] = []
    global_lines: list[int] = []
    total = 0
    for path in paths:
        data = path.read_bytes()
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        for number, raw in enumerate(lines, start=1):
            text = raw.decode("utf-8", "replace")
            text = text[:-1] if text.endswith("\r") else text
            if regex.search(text):
                matches.append((str(path), number, text[:300]))
                global_lines.append(total + number)
        total += len(lines)
    return matches, global_lines, total


def write_files(root: Path, contents: list[list[str]]) -> list[Path]:
    paths = []
    for index, tokens in enumerate(contents):
        path = root / f"f{index}.log"
        path.write_bytes(b"".join(t.encode("latin-1") if t == "\xff" else t.encode() for t in tokens))
        paths.append(path)
    return paths


files = st.lists(st.lists(st.sampled_from(TOKENS), max_size=300), min_size=1, max_size=3)
block_sizes = st.sampled_from([1, 2, 7, 64, 1 << 20])


@settings(max_examples=60, deadline=None)
@given(contents=files, block_bytes=block_sizes, pattern=st.sampled_from(PATTERNS))
def test_scan_finds_what_a_line_by_line_search_finds(
    contents: list[list[str]], block_bytes: int, pattern: str
) -> None:
    regex = re.compile(pattern)
    with tempfile.TemporaryDirectory() as root:
        paths = write_files(Path(root), contents)
        expected, _, total = reference(paths, regex)
        progress: list[tuple[int, int]] = []
        result = scan(
            map(str, paths), regex, lambda *p: progress.append(p), lambda *_: False,
            progress_every=17, block_bytes=block_bytes,
        )  # fmt: skip
    assert [(m.file, m.line, m.text) for m in result.matches] == expected
    assert result.match_count == len(expected)
    assert result.lines_scanned == total and result.files_scanned == len(paths)
    assert result.stopped is False
    assert progress[-1] == (total, len(expected))


@settings(max_examples=60, deadline=None)
@given(
    contents=files,
    block_bytes=block_sizes,
    pattern=st.sampled_from(["abc", "a", r"ab?c", r"^abc"]),
    pause_every=st.integers(1, 5),
    keep=st.integers(0, 8),
)
def test_scan_pauses_at_each_multiple_of_pause_every_and_stops_when_told(
    contents: list[list[str]], block_bytes: int, pattern: str, pause_every: int, keep: int
) -> None:
    regex = re.compile(pattern)
    asked: list[tuple[int, int]] = []

    def should_stop(lines: int, matches: int) -> bool:
        asked.append((lines, matches))
        return matches >= 2 * pause_every

    with tempfile.TemporaryDirectory() as root:
        paths = write_files(Path(root), contents)
        expected, global_lines, total = reference(paths, regex)
        result = scan(
            map(str, paths), regex, lambda *_: None, should_stop,
            pause_every=pause_every, keep=keep, progress_every=10, block_bytes=block_bytes,
        )  # fmt: skip
    stop_at = 2 * pause_every
    if len(expected) >= stop_at:
        assert result.stopped is True
        assert result.match_count == stop_at
        assert result.lines_scanned == global_lines[stop_at - 1]
        assert (global_lines[pause_every - 1], pause_every) in asked
        assert asked[-1] == (global_lines[stop_at - 1], stop_at)
    else:
        assert result.stopped is False
        assert (result.match_count, result.lines_scanned) == (len(expected), total)
    assert [(m.file, m.line, m.text) for m in result.matches] == expected[: min(keep, result.match_count)]


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        (r"ERROR \[payments\] .*timeout", "ERROR [payments] "),
        (r"abc", "abc"),
        (r"ab?cdef", "cdef"),
        (r"abcd+", "abc"),
        (r"\d{3}-\d{4}", None),
        (r"(?i)error", None),
        (r"error|warn", None),
        (r"(error|warn) at", " at"),
        (r"[xyz]{2,}done", "done"),
        (r"\x61bcd", None),  # escapes swallow the letters after them: conservative
        (r"\x61-bcd", "-bcd"),
        (r"\N{BULLET} item", " item"),
        (r"ab\.cd", "ab.cd"),
        (r"(?x) a b c ", None),
    ],
)
def test_required_literal_is_a_string_every_match_contains(pattern: str, literal: str | None) -> None:
    assert required_literal(re.compile(pattern)) == literal
