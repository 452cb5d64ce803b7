"""What ``call`` and ``tools`` print: a tool result for a person, durations, the tools table."""

from __future__ import annotations

import json
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mcp_celery_tasks.client.terminal import plain, plain_json
from mcp_celery_tasks.json_types import JSONObject, JSONValue, as_array, as_object

__all__ = [
    "arguments_text",
    "duration",
    "heard_from_tool",
    "live_status",
    "print_tools",
    "show_result",
    "size_text",
    "task_mode",
]

MODE = "io.github.mcp-celery-tasks/taskSupport"
"""Where our server puts a tool's task mode (``wire.TOOL_MODE_META_KEY``; spelled out here so the
client starts without the server's modules)."""
HEADERS = ("tool", "mode", "arguments", "description")
PLACE_IN_LINE = "queued: "
"""How our server begins a fair-backlog task's statusMessage (``wire.PLACE_IN_LINE``): the
server's word on where the task waits, not a sign its tool started."""
NOT_STARTED = "waiting for a worker slot or the tool's first report"
"""The live line of a working task that has said nothing yet. Which of the two it is, the
protocol does not tell a client (a task in our fair backlog says its place in line instead)."""


def task_mode(tool: JSONObject) -> str | None:
    """How a tool runs as a task, when the server says (our ``_meta`` or 2025-11 ``execution``)."""
    mode = as_object(tool.get("_meta")).get(MODE) or as_object(tool.get("execution")).get("taskSupport")
    return str(mode) if mode else None


def arguments_text(schema: JSONObject) -> str:
    """A tool's argument names, optional ones in brackets: ``model_path, [epochs]``."""
    required = {name for name in as_array(schema.get("required")) if isinstance(name, str)}
    names = list(as_object(schema.get("properties")))
    return ", ".join(name if name in required else f"[{name}]" for name in names)


def print_tools(tools: list[JSONObject], *, as_json: bool) -> None:
    """The ``tools`` listing on stdout: a table (whole lines in a pipe), or JSON."""
    if as_json:
        listed = [
            {
                "name": t["name"],
                "mode": task_mode(t),
                "description": t.get("description"),
                "inputSchema": t.get("inputSchema"),
            }
            for t in tools
        ]
        print(json.dumps(listed, indent=2, ensure_ascii=False))
        return
    out = Console()
    if out.is_terminal:
        out.print(_tools_table(tools, out.width))
        return
    wide = Console(width=10_000)  # a pipe gets whole lines, never cut to 80 columns
    with wide.capture() as captured:
        wide.print(_tools_table(tools, wide.width))
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _tools_table(tools: list[JSONObject], width: int) -> Table:
    """Names and modes in full, arguments wrapped, the description cut to what fits on the line."""
    rows = [
        tuple(
            plain(cell)  # names, schemas and descriptions are the server's and its tools' text
            for cell in (
                str(t["name"]),
                task_mode(t) or "",
                arguments_text(as_object(t.get("inputSchema"))),
                (str(t.get("description") or "").strip().splitlines() or [""])[0],
            )
        )
        for t in sorted(tools, key=lambda t: str(t["name"]))
    ]
    name_w, mode_w, args_w = (max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(HEADERS[:3]))
    args_w = min(24, args_w)
    table = Table(box=None, header_style="bold", pad_edge=False)
    tool_h, mode_h, args_h, description_h = HEADERS
    table.add_column(tool_h, no_wrap=True, style="bold", min_width=name_w)
    table.add_column(mode_h, no_wrap=True, min_width=mode_w)
    table.add_column(args_h, min_width=args_w)
    table.add_column(
        description_h,
        no_wrap=True,
        overflow="ellipsis",
        max_width=max(20, width - name_w - mode_w - args_w - 6),
    )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def live_status(task: Mapping[str, object], *, heard: bool) -> str:
    """What the live line says after the status and the time: the task's ``statusMessage``, or
    ``NOT_STARTED`` while it is working and nothing was ``heard`` from its tool yet (see
    ``heard_from_tool``)."""
    message = str(task.get("statusMessage") or "")
    if not message and task.get("status") == "working" and not heard:
        return NOT_STARTED
    return message


def heard_from_tool(task: Mapping[str, object]) -> bool:
    """Whether a task snapshot shows its tool has run: it asked for input, ended, or set a status
    message other than the server's place in line."""
    if task.get("status") != "working":
        return True
    message = str(task.get("statusMessage") or "")
    return bool(message) and not message.startswith(PLACE_IN_LINE)


def duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 07 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def size_text(size: int) -> str:
    """``512 bytes``, ``4.2 KiB``, ``3.0 MiB``, ``1.5 GiB``."""
    if size < 1024:
        return f"{size} bytes"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _as_json(text: str) -> JSONValue:
    """The JSON object or array ``text`` holds, else None."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        value: JSONValue = json.loads(text)
    except ValueError:
        return None
    return value


def _encodes(text: JSONValue, value: JSONValue) -> bool:
    try:
        return isinstance(text, str) and json.loads(text) == value
    except ValueError:
        return False


def _describe(block: JSONObject) -> str:
    kind = block.get("type")
    if kind in ("image", "audio"):
        size = len(str(block.get("data", ""))) * 3 // 4
        return f"[{kind} {block.get('mimeType', '')}, {size} bytes]"
    if kind == "resource_link":
        claimed = block.get("size")
        sized = f" ({size_text(claimed)})" if type(claimed) is int and claimed >= 0 else ""
        return f"[link] {block.get('name', '')}{sized} {block.get('uri', '')}".rstrip()
    if kind == "resource":
        resource = as_object(block.get("resource"))
        text = resource.get("text")
        return f"[resource] {resource.get('uri', '')}" + (f"\n{text}" if text else "")
    return json.dumps(block, indent=2, ensure_ascii=False)


def show_result(out: Console, result: JSONObject) -> None:
    """A CallToolResult for a person: structured content indented (highlighted on a terminal)."""

    def show_json(value: JSONValue) -> None:
        value = plain_json(value)  # a tool's strings: no escapes, no bidi overrides
        if out.is_terminal:
            out.print_json(data=value, ensure_ascii=False)
        else:
            out.out(json.dumps(value, indent=2, ensure_ascii=False), highlight=False)

    blocks = [b for b in as_array(result.get("content")) if isinstance(b, dict)]
    if "structuredContent" in result:
        structured = result["structuredContent"]
        show_json(structured)
        # The same value again as JSON text (the spec's fallback for older clients) is skipped.
        blocks = [b for b in blocks if not _encodes(b.get("text"), structured)]
    for block in blocks:
        text = block.get("text")
        if block.get("type") == "text" and isinstance(text, str):
            value = _as_json(text)
            if value is not None:
                show_json(value)
            else:
                out.out(plain(text, newlines=True), highlight=False)
        else:
            out.out(plain(_describe(block), newlines=True), highlight=False)
