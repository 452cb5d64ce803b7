"""A regex search over every log file under a directory, built to stream millions of lines.

Shows coarse-grained ``ctx.report`` / cancellation checkpoints in a hot loop, and a question in
the middle of a run (``ctx.elicit``): after every ``max_matches`` matches the user decides
whether the search goes on.

The scanning core, ``scan``, is a plain function (no context) so it can be timed on its own
(``tests/bench/search_logs_bench.py``). A line matches when ``pattern`` is found in it (Python
``re.search`` on the line without its line break: ``\\n``, or ``\\r\\n``). Files are read as UTF-8
(undecodable bytes become U+FFFD).
"""

from __future__ import annotations

import fnmatch
import io
import itertools
import os
import re
import string
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mcp_celery_tasks import InputNotSupported, InputTimedOut, TaskContext, ToolError, tool

__all__ = ["Match", "ScanResult", "find_files", "scan", "search_logs"]

PROGRESS_EVERY_LINES = 50_000
"""Progress and cancellation checkpoints: about every this many lines (a few per second)."""
MAX_TEXT_CHARS = 300
MAX_KEPT_MATCHES = 2_000
"""Matches listed in the result (all are counted): keeps the result well below its size limit."""
BLOCK_BYTES = 1 << 20
"""Bytes read per step: about 10k lines of a typical log."""

CONTINUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"continue": {"type": "boolean", "description": "Keep searching"}},
    "required": ["continue"],
}

_QUANTIFIER = re.compile(r"[*+?]|\{\d*(?:,\d*)?\}")
_ESCAPED_LITERAL = frozenset(string.punctuation + " ")


@dataclass(frozen=True)
class Match:
    file: str
    line: int
    text: str


@dataclass
class ScanResult:
    files_scanned: int = 0
    lines_scanned: int = 0
    match_count: int = 0
    matches: list[Match] = field(default_factory=list)
    stopped: bool = False
    unreadable: list[str] = field(default_factory=list)


class _Stop(Exception):
    pass


def find_files(directory: str, glob: str) -> list[str]:
    """Files under ``directory`` (recursively, symlinked directories not followed) whose name
    matches ``glob``, in a stable order."""
    found: list[str] = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        found.extend(os.path.join(root, name) for name in sorted(files) if fnmatch.fnmatch(name, glob))
    return found


def required_literal(regex: re.Pattern[str]) -> str | None:
    """A string that every match of ``regex`` contains (the longest run of plain characters at
    the top level), or None when there is no useful one.

    Conservative: anything it does not understand ends a run, so what it returns is always
    required. Case-insensitive, verbose and top-level alternation patterns have none.
    """
    if regex.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    pattern = regex.pattern
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
            close()  # a class (\d), an anchor (\b), a code (\x41, \N{...}) or a backreference
            if pattern.startswith("N{", i + 1):
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


def _blocks(handle: io.RawIOBase, size: int) -> Iterator[tuple[bytearray, int]]:
    """``(buffer, end)``: ``buffer[:end]`` holds whole lines, the last one without its line break.

    One buffer, reused (no allocation per block); it grows only for a line longer than itself.
    """
    buffer = bytearray(size)
    filled = 0
    while True:
        if filled == len(buffer):
            buffer.extend(bytes(len(buffer)))
        with memoryview(buffer) as view, view[filled:] as free:
            got = handle.readinto(free)
        if not got:
            if filled:
                yield buffer, filled  # a last line without a line break
            return
        filled += got
        cut = buffer.rfind(b"\n", 0, filled)
        if cut < 0:
            continue
        yield buffer, cut
        rest = filled - cut - 1
        buffer[:rest] = buffer[cut + 1 : filled]
        filled = rest


@dataclass
class _Hits:
    """The matching lines of one block: their numbers (in the file) and a way to get their text."""

    lines: list[int]
    text: Callable[[int], str]  # the text of the i-th hit
    line_count: int  # lines in the block
    candidates: int  # lines that held the required literal (or the hits, without a literal)


def _literal_hits(
    buffer: bytearray, end: int, literal: bytes, line_search: Callable[[str], object], base: int
) -> _Hits:
    """Only lines that contain ``literal`` (found in the raw bytes) are decoded and searched."""
    hits: list[int] = []
    texts: list[str] = []
    candidates = 0
    line = base + 1  # the number of the line that starts at counted_to
    counted_to = 0
    pos = buffer.find(literal, 0, end)
    while pos >= 0:
        candidates += 1
        start = buffer.rfind(b"\n", 0, pos) + 1
        stop = buffer.find(b"\n", pos, end)
        if stop < 0:
            stop = end
        line += buffer.count(b"\n", counted_to, start)
        counted_to = start
        text = buffer[start:stop].decode("utf-8", "replace")
        if text.endswith("\r"):
            text = text[:-1]
        if line_search(text):
            hits.append(line)
            texts.append(text)
        pos = buffer.find(literal, stop + 1, end)
    line_count = line - base + buffer.count(b"\n", counted_to, end)
    return _Hits(hits, texts.__getitem__, line_count, candidates)


def _line_hits(
    buffer: bytearray, end: int, literal: str | None, line_search: Callable[[str], object], base: int
) -> _Hits:
    """Every line through the regex, the loops in C (map, compress): no Python code per line."""
    with memoryview(buffer) as view, view[:end] as block:
        text = str(block, "utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if text.endswith("\r"):
            text = text[:-1]
    lines = text.split("\n")
    hits = list(itertools.compress(range(base + 1, base + 1 + len(lines)), map(line_search, lines)))
    candidates = len(hits)
    if literal is not None and candidates * DENSE_FRACTION < len(lines):
        candidates = text.count(literal)  # few hits: is the literal rare enough to filter again?

    def text_of(i: int) -> str:
        return lines[hits[i] - base - 1]

    return _Hits(hits, text_of, len(lines), candidates)


DENSE_FRACTION = 10
"""Lines holding the required literal, as a fraction (1/DENSE_FRACTION) of all lines, above
which decoding every line is cheaper than handling each candidate line on its own."""


def scan(
    paths: Iterable[str],
    regex: re.Pattern[str],
    on_progress: Callable[[int, int], None],
    should_stop: Callable[[int, int], bool],
    *,
    pause_every: int | None = None,
    keep: int = MAX_KEPT_MATCHES,
    progress_every: int = PROGRESS_EVERY_LINES,
    label: Callable[[str], str] = lambda path: path,
    block_bytes: int = BLOCK_BYTES,
) -> ScanResult:
    """Search ``regex`` in every line of ``paths``.

    ``on_progress(lines, matches)`` and ``should_stop(lines, matches)`` run about every
    ``progress_every`` lines; ``should_stop`` also runs each time the match count reaches a
    multiple of ``pause_every`` (with the lines scanned up to that match). When it returns True
    the scan ends with ``stopped`` set. The first ``keep`` matches are listed (``label`` names
    their file); all are counted.

    Files are read as bytes in large blocks into one reused buffer. When the pattern contains a
    required literal and few lines hold it, only those lines are decoded and searched; otherwise
    the block is decoded, split, and every line goes through the regex with the loop in C.
    """
    result = ScanResult()
    line_search = regex.search
    literal = required_literal(regex)
    needle = literal.encode() if literal is not None else None
    dense = needle is None
    next_progress = progress_every

    def record(name: str, lines_before_file: int, hits: _Hits) -> None:
        done, total = 0, len(hits.lines)
        while done < total:
            step = total - done
            if pause_every:
                step = min(step, pause_every - result.match_count % pause_every)
            room = keep - len(result.matches)
            for i in range(done, done + min(step, max(room, 0))):
                result.matches.append(Match(name, hits.lines[i], hits.text(i)[:MAX_TEXT_CHARS]))
            result.match_count += step
            done += step
            if pause_every and result.match_count % pause_every == 0:
                result.lines_scanned = lines_before_file + hits.lines[done - 1]
                if should_stop(result.lines_scanned, result.match_count):
                    raise _Stop

    try:
        for path in paths:
            name = label(path)
            lines_before_file = result.lines_scanned
            try:
                handle = open(path, "rb", buffering=0)  # noqa: SIM115
            except OSError:
                result.unreadable.append(name)
                continue
            with handle:
                base = 0  # lines of this file before the current block
                try:
                    for buffer, end in _blocks(handle, block_bytes):
                        if dense or needle is None:
                            hits = _line_hits(buffer, end, literal, line_search, base)
                        else:
                            hits = _literal_hits(buffer, end, needle, line_search, base)
                        dense = needle is None or hits.candidates * DENSE_FRACTION > hits.line_count
                        record(name, lines_before_file, hits)
                        base += hits.line_count
                        result.lines_scanned = lines_before_file + base
                        if result.lines_scanned >= next_progress:
                            next_progress = result.lines_scanned + progress_every
                            on_progress(result.lines_scanned, result.match_count)
                            if should_stop(result.lines_scanned, result.match_count):
                                raise _Stop
                except OSError:
                    result.unreadable.append(name)
            result.files_scanned += 1
    except _Stop:
        result.stopped = True
    on_progress(result.lines_scanned, result.match_count)
    return result


@tool(retention_seconds=3600, poll_interval_ms=500)
def search_logs(
    ctx: TaskContext, directory: str, pattern: str, max_matches: int = 1000, glob: str = "*.log"
) -> dict[str, Any]:
    """Search a regex in every matching file under a directory, line by line.

    Reports "N lines scanned, M matches" a few times a second and stops when cancelled. After
    every `max_matches` matches it asks whether to go on; declining ends the search with the
    partial results.
    """
    if max_matches < 1:
        raise ToolError("max_matches must be at least 1")
    if not os.path.isdir(directory):
        raise ToolError(f"{directory} is not a directory")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from exc
    paths = find_files(directory, glob)
    ctx.report(f"{len(paths)} files to search")
    stop_reason: list[str] = []
    next_question = max_matches

    def on_progress(lines: int, matches: int) -> None:
        ctx.report(f"{lines} lines scanned, {matches} matches")

    def should_stop(lines: int, matches: int) -> bool:
        nonlocal next_question
        ctx.raise_if_cancelled()
        if matches < next_question:
            return False
        next_question = (matches // max_matches + 1) * max_matches
        return _ask_to_continue(ctx, lines, matches, stop_reason)

    result = scan(
        paths,
        regex,
        on_progress,
        should_stop,
        pause_every=max_matches,
        label=lambda path: os.path.relpath(path, directory),
    )
    return {
        "directory": directory,
        "pattern": pattern,
        "files": len(paths),
        "files_scanned": result.files_scanned,
        "lines_scanned": result.lines_scanned,
        "match_count": result.match_count,
        "matches": [{"file": m.file, "line": m.line, "text": m.text} for m in result.matches],
        "matches_truncated": result.match_count > len(result.matches),
        "stopped_early": result.stopped,
        "stop_reason": stop_reason[0] if stop_reason else None,
        "unreadable_files": result.unreadable[:20],
    }


def _ask_to_continue(ctx: TaskContext, lines: int, matches: int, stop_reason: list[str]) -> bool:
    """Ask whether to go on after ``matches`` matches; True means stop."""
    ctx.report(f"{lines} lines scanned, {matches} matches: waiting for the user")
    try:
        answer = ctx.elicit(
            f"{matches} matches so far ({lines} lines scanned). Continue searching?",
            CONTINUE_SCHEMA,
            key=f"continue-after-{matches}",
        )
    except InputNotSupported:
        stop_reason.append(f"reached {matches} matches; the client cannot be asked to continue")
        return True
    except InputTimedOut:
        stop_reason.append(f"reached {matches} matches; nobody answered whether to continue")
        return True
    if answer.action == "accept" and (answer.content or {}).get("continue") is True:
        return False
    stop_reason.append(f"reached {matches} matches; the user chose to stop")
    return True
