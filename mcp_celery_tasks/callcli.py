"""``mcp-celery-tasks call``: call a tool as a task and follow it live in the terminal.

Spinner, elapsed time and the statusMessage while it runs; each input request asked once
(a form built from the requested schema); Ctrl-C sends tasks/cancel; the result at the end.
``--json`` makes it quiet and scriptable (answers from ``--answers FILE`` or declined).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.prompt import Confirm, FloatPrompt, IntPrompt, Prompt
from rich.spinner import Spinner
from rich.text import Text

from mcp_celery_tasks.client import TERMINAL, ClientError, TasksClient, TaskStore

__all__ = ["parse_args", "run_call"]

CAPABILITIES: dict[str, Any] = {"elicitation": {}, "sampling": {}, "roots": {}}


def parse_args(pairs: list[str]) -> dict[str, Any]:
    """``k=v`` pairs; values are JSON when they parse as JSON, else strings."""
    arguments: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--arg expects key=value, got {pair!r}")
        try:
            arguments[key] = json.loads(value)
        except ValueError:
            arguments[key] = value
    return arguments


class _Answerer:
    """Answers input requests: interactively, from a file, or by declining."""

    def __init__(self, console: Console, interactive: bool, answers: dict[str, Any]) -> None:
        self.console = console
        self.interactive = interactive
        self.answers = answers
        self.live: Live | None = None

    def __call__(self, key: str, request: dict[str, Any]) -> dict[str, Any] | None:
        method = request.get("method")
        params = request.get("params") or {}
        if key in self.answers:
            answer: dict[str, Any] = self.answers[key]
            return answer
        if method == "elicitation/create" and "*" in self.answers:
            default: dict[str, Any] = self.answers["*"]  # one answer for any form (keys are the server's)
            return default
        if method == "roots/list":
            return {"roots": [{"uri": Path.cwd().as_uri(), "name": Path.cwd().name}]}
        if not self.interactive:
            return {"action": "decline"} if method == "elicitation/create" else None
        if self.live is not None:
            self.live.stop()
        try:
            if method == "elicitation/create":
                return self._form(params)
            if method == "sampling/createMessage":
                return self._sample(params)
            return None
        finally:
            if self.live is not None:
                self.live.start()

    def _form(self, params: dict[str, Any]) -> dict[str, Any]:
        self.console.print(f"\n[bold]{params.get('message', 'The tool asks:')}[/bold]")
        choice = Prompt.ask(
            "accept, decline or cancel", choices=["accept", "decline", "cancel"], default="accept"
        )
        if choice != "accept":
            return {"action": choice}
        schema = params.get("requestedSchema") or {}
        required = set(schema.get("required") or [])
        content: dict[str, Any] = {}
        for name, prop in (schema.get("properties") or {}).items():
            label = prop.get("title") or prop.get("description") or name
            kind = prop.get("type")
            options = prop.get("enum") or [
                o.get("const") for o in prop.get("oneOf", []) if isinstance(o, dict)
            ]
            default = prop.get("default")
            if kind == "boolean":
                content[name] = Confirm.ask(label, default=bool(default) if default is not None else True)
            elif options:
                content[name] = Prompt.ask(label, choices=[str(o) for o in options], default=default)
            elif kind == "integer":
                content[name] = IntPrompt.ask(label, default=default)
            elif kind == "number":
                content[name] = FloatPrompt.ask(label, default=default)
            else:
                text = Prompt.ask(
                    label, default=default if default is not None else ("" if name not in required else None)
                )
                if text or name in required:
                    content[name] = text
        return {"action": "accept", "content": content}

    def _sample(self, params: dict[str, Any]) -> dict[str, Any]:
        self.console.print("\n[bold]The tool asks a language model:[/bold]")
        for message in params.get("messages", []):
            content = message.get("content") or {}
            self.console.print(f"  {message.get('role')}: {content.get('text', content)}")
        text = Prompt.ask("Your answer (you are the model)")
        return {"role": "assistant", "content": {"type": "text", "text": text}, "model": "human"}


def _render_result(console: Console, task: dict[str, Any]) -> int:
    status = task["status"]
    if status == "completed":
        result = task.get("result") or {}
        for block in result.get("content", []):
            console.print(
                block.get("text", json.dumps(block)) if block.get("type") == "text" else json.dumps(block)
            )
        return 1 if result.get("isError") else 0
    if status == "failed":
        error = task.get("error") or {}
        console.print(f"[red]failed[/red]: {error.get('message')} ({error.get('code')})")
        return 1
    console.print("[yellow]cancelled[/yellow]")
    return 130


def run_call(
    *,
    url: str,
    token: str | None,
    tool: str | None,
    arguments: dict[str, Any],
    resume: str | None,
    as_json: bool,
    answers_file: Path | None,
) -> int:
    console = Console(stderr=as_json)
    answers = json.loads(answers_file.read_text()) if answers_file else {}
    client = TasksClient(url, token=token, capabilities=CAPABILITIES)
    store = TaskStore()
    answerer = _Answerer(console, interactive=not as_json and sys.stdin.isatty(), answers=answers)
    task_id: str | None = resume
    started = time.monotonic()
    try:
        if resume is not None:
            remembered = store.get(resume)
            if remembered and url == "http://127.0.0.1:8000/mcp":
                client.url = remembered["url"]
            task = client.get(resume)
        else:
            assert tool is not None
            result = client.call_tool(tool, arguments)
            rounds = 0
            while result.get("resultType") == "input_required" and rounds < 10:
                rounds += 1  # MRTR before the task exists (or on a synchronous call)
                responses = {
                    key: answer
                    for key, request in (result.get("inputRequests") or {}).items()
                    if (answer := answerer(key, request)) is not None
                }
                result = client.call_tool(
                    tool, arguments, input_responses=responses, request_state=result.get("requestState")
                )
            if result.get("resultType") != "task":
                _print(console, as_json, {"status": "completed", "result": result})
                return 1 if result.get("isError") else 0
            task = result
            task_id = str(task["taskId"])
            store.add(task_id, client.url, tool)
            if not as_json:
                console.print(f"task {task_id} (resume with: mcp-celery-tasks call --resume {task_id})")
        final = _follow(client, task, console, answerer, as_json, started)
        store.remove(str(final["taskId"]))
        _print(console, as_json, final)
        return 0 if as_json and final["status"] == "completed" else _code(final)
    except KeyboardInterrupt:
        if task_id is not None:
            console.print("\ncancelling…")
            client.cancel(task_id)
            final = _wait_terminal(client, task_id)
            store.remove(task_id)
            _print(console, as_json, final)
        return 130
    except ClientError as exc:
        console.print(f"[red]error[/red]: {exc}")
        return 2
    finally:
        client.close()


def _code(task: dict[str, Any]) -> int:
    if task["status"] == "completed":
        return 1 if (task.get("result") or {}).get("isError") else 0
    return 130 if task["status"] == "cancelled" else 1


def _print(console: Console, as_json: bool, task: dict[str, Any]) -> None:
    if as_json:
        print(json.dumps(task))
    else:
        _render_result(console, task)


def _wait_terminal(client: TasksClient, task_id: str, limit_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    task = client.get(task_id)
    while task["status"] not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
        task = client.get(task_id)
    return task


def _follow(
    client: TasksClient,
    task: dict[str, Any],
    console: Console,
    answerer: _Answerer,
    as_json: bool,
    started: float,
) -> dict[str, Any]:
    if as_json:
        return client.follow(task, on_update=lambda t: None, answer=answerer)
    spinner = Spinner("dots", text="starting")
    with Live(spinner, console=console, refresh_per_second=8, transient=True) as live:
        answerer.live = live

        def show(current: dict[str, Any]) -> None:
            elapsed = time.monotonic() - started
            message = current.get("statusMessage") or ""
            spinner.update(text=Text(f"{current['status']}  {elapsed:5.1f}s  {message}"))

        return client.follow(task, on_update=show, answer=answerer)
