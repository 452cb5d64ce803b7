"""A regex search over every log file under a directory, built to stream millions of lines.

Shows coarse-grained ``ctx.report`` / cancellation checkpoints in a hot loop, and a question in
the middle of a run (``ctx.elicit``): after every ``max_matches`` matches the user decides
whether the search goes on.

The pattern and the directory come from a model, so both are hostile. Files are read only
under ``MCP_EXAMPLES_FILES_ROOT`` (a ``FileRoot``): the walk never enters a symlinked directory
and skips a symlinked file that resolves outside the root. The pattern runs on RE2
(google-re2), in time linear in the text, so no pattern backtracks for hours on a crafted line;
what RE2 cannot run (backreferences, lookaround) is refused. Lines longer than the root's
``max_line_bytes`` are cut, so no line is buffered without bound. A search with more matches
than fit inline returns a summary and links every match as an NDJSON artifact
(``ctx.artifact``, written as found: ``workers.match_file``).

The scanning core, ``scan``, is a plain function (no context) so it can be timed on its own
(``tests/bench/search_logs_bench.py``). A line matches when ``pattern`` is found in it (an RE2
search of the line without its line break: ``\\n``, or ``\\r\\n``; ``^`` and ``$`` are its
start and end). Files are read as UTF-8 (undecodable bytes become U+FFFD).
"""

from __future__ import annotations

import fnmatch
import io
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mcp_types import CallToolResult

from mcp_celery_tasks import FileRoot, InputNotSupported, InputTimedOut, TaskContext, ToolError, tool
from workers.line_regex import compile_pattern, required_literal
from workers.match_file import INLINE_MATCHES, MatchFile

__all__ = ["Match", "ScanResult", "find_files", "scan", "search_logs"]

FILES_ROOT = "MCP_EXAMPLES_FILES_ROOT"
PROGRESS_EVERY_LINES = 50_000
"""Progress and cancellation checkpoints: about every this many lines (a few per second)."""
MAX_TEXT_CHARS = 300
MAX_KEPT_MATCHES = 2_000
"""Matches ``scan`` lists by default (all are counted)."""
BLOCK_BYTES = 1 << 20
"""Bytes read per step: about 10k lines of a typical log."""

CONTINUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"continue": {"type": "boolean", "description": "Keep searching"}},
    "required": ["continue"],
}


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
    """Files not read, each with the reason (outside the root, not a regular file, an I/O error)."""


class _Stop(Exception):
    pass


def find_files(root: FileRoot, directory: str, glob: str) -> list[str]:
    """Files under ``directory`` (inside ``root``, recursively) whose name matches ``glob``, in
    a stable order.

    Symlinked directories are never entered; a symlinked file is listed only when it resolves
    inside the root (``scan`` checks again what it opens).
    """
    top = root.resolve(directory)
    if not top.is_dir():
        raise ToolError(f"{directory!r} is not a directory")
    found: list[str] = []
    for current, dirs, files in os.walk(top):  # followlinks=False
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(current, name)
            if fnmatch.fnmatch(name, glob) and (not os.path.islink(path) or _inside(root, path)):
                found.append(path)
    return found


def _inside(root: FileRoot, path: str) -> bool:
    try:
        root.resolve(path)
    except ToolError:
        return False
    return True


def _blocks(handle: io.RawIOBase, size: int, max_line: int) -> Iterator[tuple[bytearray, int]]:
    """``(buffer, end)``: ``buffer[:end]`` holds whole lines, the last one without its line break.

    One buffer, reused (no allocation per block); it grows only for a line longer than itself,
    and never past ``max_line`` bytes: a longer line comes alone, cut to its first ``max_line``
    bytes, and the rest of it is read and dropped.
    """
    buffer = bytearray(min(size, max_line))
    filled = 0
    while True:
        if filled == len(buffer) < max_line:  # one line fills the buffer
            buffer.extend(bytes(min(len(buffer), max_line - len(buffer))))
        if filled == max_line:
            yield buffer, filled
            filled = 0
            got = _drop_rest_of_line(handle, buffer)
            if got < 0:
                return
        else:
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


def _drop_rest_of_line(handle: io.RawIOBase, buffer: bytearray) -> int:
    """Read past the next line break; what follows it (in the same read) is moved to the front
    of ``buffer``. Returns how many bytes that is, or -1 at the end of the file."""
    while True:
        got = handle.readinto(buffer)
        if not got:
            return -1
        cut = buffer.find(b"\n", 0, got)
        if cut >= 0:
            rest = got - cut - 1
            buffer[:rest] = buffer[cut + 1 : got]
            return rest


def _searchable(buffer: bytearray, end: int) -> bytes:
    """The block as the regex sees it: valid UTF-8 (undecodable bytes become U+FFFD) and ``\\n``
    line breaks (one ``\\r`` before each is dropped)."""
    with memoryview(buffer) as view, view[:end] as block:
        data = bytes(block)  # RE2 reads bytes in place; it would copy a bytearray on every search
    if not data.isascii():
        data = data.decode("utf-8", "replace").encode()
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").removesuffix(b"\r")
    return data


@dataclass
class _Hits:
    """The matching lines of one block: their numbers (in the file) and a way to get their text."""

    lines: list[int]
    text: Callable[[int], str]  # the text of the i-th hit
    line_count: int  # lines in the block
    candidates: int  # lines that held the required literal (when it was looked for)


def _search_block(data: bytes, regex: Any, needle: bytes | None, base: int) -> _Hits:
    """The lines of ``data`` that ``regex`` matches.

    With a ``needle`` (a literal every match contains) only the lines holding it are searched,
    each on its own. Without, RE2 searches the whole block and each match names its line (RE2
    runs with ``never_nl`` and ``(?m)``: a match never leaves its line).
    """
    lines: list[int] = []
    spans: list[tuple[int, int]] = []
    candidates = 0
    line = base + 1  # the number of the line that starts at counted_to
    counted_to = 0
    pos = 0
    while pos <= len(data):
        if needle is not None:
            at = data.find(needle, pos)
            if at < 0:
                break
            candidates += 1
            start = data.rfind(b"\n", 0, at) + 1
            stop = _line_end(data, at)
            found = regex.search(data, start, stop) is not None
        else:
            match = regex.search(data, pos)
            if match is None:
                break
            start = data.rfind(b"\n", 0, match.start()) + 1
            stop = _line_end(data, match.start())
            found = True
        if found:
            line += data.count(b"\n", counted_to, start)
            counted_to = start
            lines.append(line)
            spans.append((start, stop))
        pos = stop + 1

    def text_of(i: int) -> str:
        start, stop = spans[i]
        # 4 bytes per character at most: enough bytes for MAX_TEXT_CHARS whole characters.
        return data[start : min(stop, start + 4 * MAX_TEXT_CHARS)].decode("utf-8", "replace")[:MAX_TEXT_CHARS]

    return _Hits(lines, text_of, line - base + data.count(b"\n", counted_to), candidates)


def _line_end(data: bytes, pos: int) -> int:
    stop = data.find(b"\n", pos)
    return len(data) if stop < 0 else stop


DENSE_FRACTION = 10
"""Lines holding the required literal, as a fraction (1/DENSE_FRACTION) of all lines, above
which one RE2 search of the whole block is cheaper than a search of each of those lines."""


def scan(
    root: FileRoot,
    paths: Iterable[str],
    regex: Any,
    on_progress: Callable[[int, int], None],
    should_stop: Callable[[int, int], bool],
    *,
    pause_every: int | None = None,
    keep: int = MAX_KEPT_MATCHES,
    progress_every: int = PROGRESS_EVERY_LINES,
    label: Callable[[str], str] = lambda path: path,
    block_bytes: int = BLOCK_BYTES,
    on_match: Callable[[str, int, str], None] | None = None,
) -> ScanResult:
    """Search ``regex`` (from ``compile_pattern``) in every line of ``paths``, read through ``root``.

    ``on_progress(lines, matches)`` and ``should_stop(lines, matches)`` run about every
    ``progress_every`` lines; ``should_stop`` also runs each time the match count reaches a
    multiple of ``pause_every`` (with the lines scanned up to that match). When it returns True
    the scan ends with ``stopped`` set. The first ``keep`` matches are listed (``label`` names
    their file); all are counted, and each is passed to ``on_match(file, line, text)`` when
    given, as it is found. A file ``root`` refuses is listed in ``unreadable``; lines
    longer than ``root.max_line_bytes`` are cut to that many bytes.

    Files are read as bytes in large blocks into one reused buffer, and each block is searched
    by RE2 at once. When the pattern contains a required literal and few lines hold it, only
    those lines are searched.
    """
    result = ScanResult()
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
                result.matches.append(Match(name, hits.lines[i], hits.text(i)))
            if on_match is not None:
                for i in range(done, done + step):
                    on_match(name, hits.lines[i], hits.text(i))
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
                handle = root.open(path)
            except ToolError as exc:
                result.unreadable.append(f"{name}: {exc}")
                continue
            with handle:
                base = 0  # lines of this file before the current block
                try:
                    for buffer, end in _blocks(handle, block_bytes, root.max_line_bytes):
                        data = _searchable(buffer, end)
                        hits = _search_block(data, regex, None if dense else needle, base)
                        if needle is not None:
                            held = hits.candidates if not dense else data.count(needle)
                            dense = held * DENSE_FRACTION > hits.line_count
                        record(name, lines_before_file, hits)
                        base += hits.line_count
                        result.lines_scanned = lines_before_file + base
                        if result.lines_scanned >= next_progress:
                            next_progress = result.lines_scanned + progress_every
                            on_progress(result.lines_scanned, result.match_count)
                            if should_stop(result.lines_scanned, result.match_count):
                                raise _Stop
                except OSError as exc:
                    result.unreadable.append(f"{name}: {exc.strerror or exc}")
            result.files_scanned += 1
    except _Stop:
        result.stopped = True
    on_progress(result.lines_scanned, result.match_count)
    return result


@tool(retention_seconds=3600, poll_interval_ms=500)
def search_logs(
    ctx: TaskContext, directory: str, pattern: str, max_matches: int = 1000, glob: str = "*.log"
) -> dict[str, Any] | CallToolResult:
    """Search a regex (RE2 syntax) in every matching file under a directory, line by line.

    The directory is relative to the files directory this server allows (or inside it). Reports
    "N lines scanned, M matches" a few times a second and stops when cancelled. After every
    `max_matches` matches it asks whether to go on; declining ends the search with the partial
    results. Up to 200 matches are listed in the result; above that it lists the first 20 and
    links every match as an NDJSON file (`matches.ndjson`, read with resources/read).
    """
    root = FileRoot.require_env(FILES_ROOT)
    if max_matches < 1:
        raise ToolError("max_matches must be at least 1")
    regex = compile_pattern(pattern)
    paths = find_files(root, directory, glob)
    top = root.resolve(directory)
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

    with MatchFile() as every_match:
        result = scan(
            root,
            paths,
            regex,
            on_progress,
            should_stop,
            pause_every=max_matches,
            keep=INLINE_MATCHES,
            label=lambda path: os.path.relpath(path, top),
            on_match=every_match.add,
        )
        summary = {
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
        return every_match.result(ctx, summary)


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
