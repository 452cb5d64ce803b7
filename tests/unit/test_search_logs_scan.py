"""search_logs' scanning core against a plain line-by-line search: same matches, same line
numbers, same counts, whatever the block size, the line cap, the pre-filter or the pause points;
and what it refuses: patterns RE2 cannot run, files outside the root."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_celery_tasks import FileRoot, ToolError
from workers.line_regex import compile_pattern, required_literal
from workers.search_logs import find_files, scan

PATTERNS = [
    "abc", r"ab?c", r"^abc", r"abc\s*$", r"c a", "a", r"\s", "x*", r"a.b", r"(?s)a.b", r"[^c]b", r"^$",
    r"\bab\b", r"\Bb", r"b$", r"a[^z]*b", r"\n", r"(?i)ABC", r"aab|bba", r"(ab|cd)abc", r"\x61bc",
    r"abc\d{0,2}", r"[abc]{2,}cab", r"é\wa", r"\x{61}bc", "\ufffd", r"aaa\r", r"\p{Latin}bc",
    r"[[:space:]]c", r"\Qa.b\E", r"(.+)+X", r"(?U)a+b", r"x{40}$",
]  # fmt: skip
TOKENS = ["a", "b", "c", " ", "\n", "\n", "\r\n", "\r", "\t", "é", "abc", "cab ", "\xff", "x" * 40]


def reference(
    paths: list[Path], regex: Any, max_line: int
) -> tuple[list[tuple[str, int, str]], list[int], int]:
    """(matches, the global line number of each match, total lines): lines end at \\n and are
    cut to ``max_line`` bytes, one trailing \\r is dropped, undecodable bytes become U+FFFD."""
    matches: list[tuple[str, int, str]] = []
    global_lines: list[int] = []
    total = 0
    for path in paths:
        data = path.read_bytes()
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        for number, raw in enumerate(lines, start=1):
            text = raw[:max_line].decode("utf-8", "replace")
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
line_caps = st.sampled_from([1, 5, 41, 1 << 20])


@settings(max_examples=80, deadline=None)
@given(contents=files, block_bytes=block_sizes, max_line=line_caps, pattern=st.sampled_from(PATTERNS))
def test_scan_finds_what_a_line_by_line_search_finds(
    contents: list[list[str]], block_bytes: int, max_line: int, pattern: str
) -> None:
    regex = compile_pattern(pattern)
    with tempfile.TemporaryDirectory() as root:
        paths = write_files(Path(root), contents)
        expected, _, total = reference(paths, regex, max_line)
        progress: list[tuple[int, int]] = []
        result = scan(
            FileRoot(root, max_line_bytes=max_line), map(str, paths), regex,
            lambda *p: progress.append(p), lambda *_: False, progress_every=17, block_bytes=block_bytes,
        )  # fmt: skip
    assert [(m.file, m.line, m.text) for m in result.matches] == expected
    assert result.match_count == len(expected)
    assert result.lines_scanned == total and result.files_scanned == len(paths)
    assert result.stopped is False and result.unreadable == []
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
    regex = compile_pattern(pattern)
    asked: list[tuple[int, int]] = []

    def should_stop(lines: int, matches: int) -> bool:
        asked.append((lines, matches))
        return matches >= 2 * pause_every

    with tempfile.TemporaryDirectory() as root:
        paths = write_files(Path(root), contents)
        expected, global_lines, total = reference(paths, regex, 1 << 20)
        result = scan(
            FileRoot(root), map(str, paths), regex, lambda *_: None, should_stop,
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
    ("pattern", "lines"),
    [
        (r"^abc", [1, 3, 4]),
        (r"abc$", [1, 2, 3, 4]),
        (r"^abc$", [1, 3, 4]),
        (r"^$", [5]),
        (r"\babc\b", [1, 3, 4]),
        (r"c\s+x", []),  # \s never reaches into the next line
        (r"abc[^z]*abc", []),
    ],
)
def test_anchors_and_classes_see_one_line_in_a_block_of_many(
    tmp_path: Path, pattern: str, lines: list[int]
) -> None:
    (tmp_path / "a.log").write_bytes(b"abc\nxabc\nabc\r\nabc\n\nxyz")
    root = FileRoot(tmp_path)
    # As written (a required literal: lines holding it are searched one by one), and behind a
    # top-level | (no literal: RE2 searches the whole block).
    for regex in (compile_pattern(pattern), compile_pattern(f"(?:{pattern})|qq")):
        result = scan(root, [str(tmp_path / "a.log")], regex, *NO_HOOKS)
        assert [m.line for m in result.matches] == lines


def test_a_backtracking_pattern_on_a_100kb_line_returns_within_a_second(tmp_path: Path) -> None:
    (tmp_path / "long.log").write_text("a" * 100_000 + "\n" + "a" * 100_000 + "X\n")
    regex = compile_pattern("(.+)+X")  # Python's re takes longer than the age of the universe
    started = time.monotonic()
    result = scan(FileRoot(tmp_path), [str(tmp_path / "long.log")], regex, lambda *_: None, lambda *_: False)
    assert time.monotonic() - started < 1
    assert [m.line for m in result.matches] == [2] and len(result.matches[0].text) == 300


def test_a_line_longer_than_the_cap_is_cut_and_never_buffered_whole(tmp_path: Path) -> None:
    (tmp_path / "huge.log").write_bytes(b"ERROR " + b"x" * (8 << 20) + b" secret\nERROR next\n")
    root = FileRoot(tmp_path, max_line_bytes=4096)
    regex = compile_pattern("ERROR")
    result = scan(
        root, [str(tmp_path / "huge.log")], regex, lambda *_: None, lambda *_: False, block_bytes=1024
    )
    assert [(m.line, m.text[:10]) for m in result.matches] == [(1, "ERROR xxxx"), (2, "ERROR next")]
    assert scan(root, [str(tmp_path / "huge.log")], compile_pattern("secret"), *NO_HOOKS).match_count == 0


NO_HOOKS = (lambda *_: None, lambda *_: False)


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        (r"(a)\1", "backreferences"),
        (r"a(?=b)", "lookaround"),
        (r"(?<!a)b", "lookaround"),
        (r"(unclosed", "invalid regular expression"),
        (r"\Aabc", "use ^ and $"),
        (r"abc\z", "use ^ and $"),
        (r"a\Cb", "use ^ and $"),
        (r"(?-m)^a", "use ^ and $"),
        (r"(?s-m:^a)", "use ^ and $"),
    ],
)
def test_patterns_re2_cannot_run_line_by_line_are_refused_with_the_reason(pattern: str, problem: str) -> None:
    with pytest.raises(ToolError, match=re.escape(problem)):
        compile_pattern(pattern)


@pytest.mark.parametrize("pattern", [r"\\A", r"[\\z]", r"\Q\A\E", r"(?i)a", r"(?m)^a$"])
def test_look_alikes_of_refused_constructs_compile(pattern: str) -> None:
    compile_pattern(pattern)


def test_the_walk_stays_inside_the_root_and_scan_skips_what_the_root_refuses(tmp_path: Path) -> None:
    root_dir, outside = tmp_path / "root", tmp_path / "outside"
    (root_dir / "logs").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.log").write_text("ERROR password=hunter2\n")
    (root_dir / "logs" / "app.log").write_text("ERROR disk full\n")
    (root_dir / "logs" / "linked-out.log").symlink_to(outside / "secret.log")
    (root_dir / "logs" / "linked-in.log").symlink_to(root_dir / "logs" / "app.log")
    (root_dir / "logs" / "outside-dir").symlink_to(outside)
    os.mkfifo(root_dir / "logs" / "pipe.log")
    root = FileRoot(root_dir)

    paths = find_files(root, "logs", "*.log")
    assert [os.path.relpath(p, root_dir) for p in paths] == [
        "logs/app.log",
        "logs/linked-in.log",
        "logs/pipe.log",
    ]
    result = scan(root, [*paths, str(outside / "secret.log")], compile_pattern("ERROR"), *NO_HOOKS)
    assert [m.text for m in result.matches] == ["ERROR disk full", "ERROR disk full"]
    assert len(result.unreadable) == 2
    assert "named pipe" in result.unreadable[0] and "outside" in result.unreadable[1]
    for directory in ["/etc", "../outside", "logs/outside-dir", "/proc/self"]:
        with pytest.raises(ToolError, match="outside the allowed directory"):
            find_files(root, directory, "*")


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


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        (r"ERROR \[payments\] .*timeout", "ERROR [payments] "),
        (r"\p{Greek}abc", "abc"),
        (r"\x{61}bcd", "bcd"),
        (r"[[:alpha:]]abc", "abc"),
        (r"abc(?i)def", None),
        (r"(?U)abc+", None),
        (r"\Qabc\E", None),
        (r"(?i)error", None),
    ],
)
def test_required_literal_understands_re2_syntax(pattern: str, literal: str | None) -> None:
    assert required_literal(compile_pattern(pattern)) == literal
