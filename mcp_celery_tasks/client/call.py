"""``mcp-celery-tasks call`` and ``tools``: call a tool as a task and follow it in the terminal.

Spinner, elapsed time and the statusMessage while it runs; each input request asked once
(a form built from the requested schema); Ctrl-C, SIGTERM and SIGHUP (a closed terminal) send
tasks/cancel, or with ``--detach`` leave the task running for a later ``--resume``; the result
at the end, then one closing status line. ``--json`` makes it quiet and scriptable. Without a
terminal to ask in (``--json``, or stdin not a terminal) a call never waits on a question: it
answers from ``--answers FILE`` or declines at once, each decline said on stderr. Arguments are
checked against the tool's ``inputSchema`` (names, required ones, JSON types) before anything is
sent. Tools are learned from ``tools/list`` only, so any SEP-2663 server will do.

The result goes to stdout; the live line, forms, status and errors go to stderr (one line per
error, never a traceback). Exit codes:

- 0: the task completed.
- 1: the task failed or was cancelled, the tool reported an error (``isError``), or a linked
  artifact could not be saved (``--save-artifacts DIR``: ``saving``).
- 2: refused before anything ran: a usage mistake (unknown tool or argument, a value of the wrong
  type, a bad ``--answers`` file, a wrong ``--url`` or token) or a JSON-RPC error from the server.
- 3: no MCP answer from the server: connection refused, timed out, or not an MCP endpoint.
- 130: interrupted with Ctrl-C, SIGTERM or SIGHUP (the task was cancelled, or with ``--detach``
  left running).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.text import Text

from mcp_celery_tasks.client.arguments import UsageError, check_call, parse_args
from mcp_celery_tasks.client.forms import Answerer, AnswersError, load_answers
from mcp_celery_tasks.client.protocol import (
    TERMINAL,
    ClientError,
    RpcError,
    ServerUnavailable,
    TasksClient,
    TaskStore,
)
from mcp_celery_tasks.client.saving import save_reported
from mcp_celery_tasks.client.stopping import Stopped, signals_stop
from mcp_celery_tasks.client.terminal import plain
from mcp_celery_tasks.client.view import duration, heard_from_tool, live_status, print_tools, show_result
from mcp_celery_tasks.json_types import JSONObject, as_object

__all__ = ["check_call", "parse_args", "run_call", "run_tools"]

EXIT_OK = 0
EXIT_TASK_FAILED = 1
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
CAPABILITIES: JSONObject = {"elicitation": {}, "sampling": {}, "roots": {}}


def _shown(value: object) -> str:
    """A value from the server or a tool inside a markup line: controls stripped, markup escaped."""
    return escape(plain(value))


def _error(console: Console, message: str) -> None:
    console.print(f"[red]error[/red]: {escape(plain(message, newlines=True))}", soft_wrap=True)


def _exit_code(exc: ClientError) -> int:
    if isinstance(exc, ServerUnavailable):
        return EXIT_UNREACHABLE
    return EXIT_REFUSED  # InvalidUrl, Unauthorized, RpcError


def _client_message(exc: ClientError) -> str:
    if isinstance(exc, RpcError):
        return f"the server refused the request: {exc}"
    return str(exc)


def run_tools(*, url: str, token: str | None, as_json: bool, timeout: float) -> int:
    """``mcp-celery-tasks tools``: name, task mode and a one-line description of every tool."""
    err = Console(stderr=True, soft_wrap=True)
    client = TasksClient(url, token=token, capabilities=CAPABILITIES, timeout_s=timeout)
    try:
        tools = client.list_tools()
    except ClientError as exc:
        _error(err, _client_message(exc))
        return _exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        client.close()
    print_tools(tools, as_json=as_json)
    return EXIT_OK


class _Clock:
    """Elapsed time of a task, without the time its user spent answering forms here."""

    def __init__(self) -> None:
        self.origin = time.monotonic()
        self.created: float | None = None
        self.paused_s = 0.0

    def since(self, created_at: object) -> None:
        """Count from the task's ``createdAt`` (a resumed task did not start with this process)."""
        self.created = _timestamp(created_at)
        if self.created is not None:
            self.origin = time.monotonic() - max(0.0, time.time() - self.created)

    @contextmanager
    def paused(self) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.paused_s += time.monotonic() - began

    def elapsed(self, ended_at: object = None) -> float:
        """Seconds so far, or until ``ended_at`` (a finished task's ``lastUpdatedAt``) on resume."""
        ended = _timestamp(ended_at)
        if self.created is not None and ended is not None:
            return max(0.0, ended - self.created - self.paused_s)
        return max(0.0, time.monotonic() - self.origin - self.paused_s)


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def run_call(
    *,
    url: str,
    url_given: bool,
    token: str | None,
    tool: str | None,
    args: list[str],
    resume: str | None,
    as_json: bool,
    answers_file: Path | None,
    timeout: float,
    detach: bool = False,
    idempotency_key: str | None = None,
    save_artifacts: Path | None = None,
) -> int:
    """``mcp-celery-tasks call``: start (or resume) a task, follow it to its end; the exit code.
    The create carries ``idempotency_key`` (one is made when None), so its retries and a rerun
    with the same key find the same task; a completed result's artifacts are saved into
    ``save_artifacts`` (``saving``)."""
    err = Console(stderr=True, soft_wrap=True)
    try:
        if (tool is None) == (resume is None):
            raise UsageError("name a tool, or --resume TASK_ID (not both)")
        texts = parse_args(args)
        if resume is not None and texts:
            raise UsageError("--arg goes with a tool name, not with --resume")
        if resume is not None and idempotency_key is not None:
            raise UsageError("--idempotency-key goes with a tool name, not with --resume")
        answers = load_answers(answers_file) if answers_file else {}
        if save_artifacts is not None and save_artifacts.exists() and not save_artifacts.is_dir():
            raise UsageError(f"--save-artifacts {save_artifacts}: not a directory")
    except (UsageError, AnswersError) as exc:
        _error(err, str(exc))
        return EXIT_REFUSED
    client = TasksClient(url, token=token, capabilities=CAPABILITIES, timeout_s=timeout)
    call = _Call(err, client, as_json=as_json, answers=answers, detach=detach)
    call.idempotency_key = idempotency_key or ""
    call.save_dir = save_artifacts
    with signals_stop():
        return _run(call, tool, texts, resume, url_given=url_given)


def _run(call: _Call, tool: str | None, texts: dict[str, str], resume: str | None, *, url_given: bool) -> int:
    err = call.err
    try:
        if resume is not None:
            return call.resume(resume, url_given=url_given)
        assert tool is not None
        return call.start(tool, texts)
    except KeyboardInterrupt as exc:
        return call.interrupted(str(exc) if isinstance(exc, Stopped) else None)
    except UsageError as exc:
        _error(err, str(exc))
        return EXIT_REFUSED
    except ClientError as exc:
        _error(err, _client_message(exc))
        if call.task_id is not None and isinstance(exc, ServerUnavailable):
            err.print(f"the task may still be running: mcp-celery-tasks call --resume {_shown(call.task_id)}")
        return _exit_code(exc)
    finally:
        call.client.close()


class _Call:
    """One ``call``: start or resume a task, follow it, answer its questions, show how it ended."""

    def __init__(
        self,
        err: Console,
        client: TasksClient,
        *,
        as_json: bool,
        answers: dict[str, JSONObject],
        detach: bool = False,
    ) -> None:
        self.err = err
        self.out = Console()
        self.client = client
        self.as_json = as_json
        self.detach = detach
        self.store = TaskStore()
        self.clock = _Clock()
        self.live: Live | None = None
        self.task_id: str | None = None
        self.tool = ""
        self.last: JSONObject = {}
        """The latest snapshot of the task (what ``--json`` prints when ``--detach`` leaves it)."""
        self.heard = False
        """Whether the tool has shown it runs (``view.heard_from_tool``), for the live line."""
        self.idempotency_key = ""
        """The create's key (``""``: made on the first call, kept across its rounds)."""
        self.save_dir: Path | None = None
        interactive = not as_json and sys.stdin.isatty()
        self.answerer = Answerer(err, interactive=interactive, answers=answers, pause=self._paused)

    @contextmanager
    def _paused(self) -> Iterator[None]:
        """A form is on screen: the live line steps aside and the clock stops."""
        if self.live is not None:
            self.live.stop()
        try:
            with self.clock.paused():
                yield
        finally:
            if self.live is not None:
                self.live.start()

    def start(self, name: str, texts: dict[str, str]) -> int:
        arguments = check_call(self.client.list_tools(), name, texts)
        self.tool = name
        self.clock = _Clock()
        key = self.idempotency_key or f"cli-{uuid.uuid4()}"
        result = self.client.call_tool(name, arguments, idempotency_key=key)
        rounds = 0
        while result.get("resultType") == "input_required" and rounds < 10:
            rounds += 1  # MRTR before the task exists (or on a synchronous call)
            responses: JSONObject = {
                key: answer
                for key, request in as_object(result.get("inputRequests")).items()
                if (answer := self.answerer(key, request)) is not None
            }
            result = self.client.call_tool(
                name,
                arguments,
                input_responses=responses,
                request_state=result.get("requestState"),
                idempotency_key=key,
            )
        if result.get("resultType") == "input_required":
            raise UsageError(
                f"{name} kept asking for input before it started; giving up after {rounds} rounds"
            )
        if result.get("resultType") != "task":
            return self._finish({"status": "completed", "result": result}, cancelled_here=False)
        self.task_id = str(result["taskId"])
        self.store.add(self.task_id, self.client.url, name)
        if not self.as_json:
            shown = _shown(self.task_id)
            self.err.print(f"task {shown} (resume with: mcp-celery-tasks call --resume {shown})")
        return self._finish(self._follow(result), cancelled_here=False)

    def resume(self, task_id: str, *, url_given: bool) -> int:
        remembered = self.store.get(task_id)
        if remembered and not url_given:
            self.client.url = remembered["url"]
        self.task_id = task_id
        task = self.client.get(task_id)
        self.clock.since(task.get("createdAt"))
        return self._finish(self._follow(task), cancelled_here=False)

    def _seen(self, task: JSONObject) -> None:
        self.last = task
        self.heard = self.heard or heard_from_tool(task)

    def _follow(self, task: JSONObject) -> JSONObject:
        if self.as_json:
            return self.client.follow(task, on_update=self._seen, answer=self.answerer)
        spinner = Spinner("dots", text="starting")

        def show(current: JSONObject) -> None:
            self._seen(current)
            message = live_status(current, heard=self.heard)
            line = f"{current['status']}  {duration(self.clock.elapsed())}  {message}"
            spinner.update(text=Text(plain(line)))

        with Live(spinner, console=self.err, refresh_per_second=8, transient=True) as live:
            self.live = live
            try:
                return self.client.follow(task, on_update=show, answer=self.answerer)
            finally:
                self.live = None

    def interrupted(self, signal_name: str | None) -> int:
        """Ctrl-C, SIGTERM or SIGHUP: cancel the task (if there is one yet) and show how it ended;
        with ``--detach``, leave it running and say how to follow it again."""
        said = f"{signal_name}: " if signal_name else ""
        if self.task_id is None:
            self.err.print(f"{said}interrupted")
            return EXIT_INTERRUPTED
        if self.detach:
            return self._detached(self.task_id, said)
        self.err.print(f"\n{said}cancelling…")
        try:
            self.client.cancel(self.task_id)
            final = self._wait_terminal(self.task_id)
        except KeyboardInterrupt:
            self.err.print(f"stopped waiting; the task is being cancelled ({_shown(self.task_id)})")
            return EXIT_INTERRUPTED
        except ClientError as exc:
            _error(self.err, f"could not cancel task {self.task_id}: {_client_message(exc)}")
            return _exit_code(exc)
        return self._finish(final, cancelled_here=True)

    def _detached(self, task_id: str, said: str) -> int:
        if self.store.get(task_id) is None:
            self.store.add(task_id, self.client.url, self.tool)
        if self.as_json:
            print(json.dumps(self.last or {"taskId": task_id}, indent=2, ensure_ascii=False))
        self.err.print(
            f"\n{said}left task {_shown(task_id)} running (--detach); "
            f"follow it with: mcp-celery-tasks call --resume {_shown(task_id)}",
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED

    def _wait_terminal(self, task_id: str, limit_s: float = 30.0) -> JSONObject:
        deadline = time.monotonic() + limit_s
        task = self.client.get(task_id)
        while task["status"] not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
            task = self.client.get(task_id)
        return task

    def _finish(self, task: JSONObject, *, cancelled_here: bool) -> int:
        """Print the outcome (the result on stdout, one status line on stderr); the exit code."""
        status = task.get("status")
        elapsed = duration(self.clock.elapsed(task.get("lastUpdatedAt") if status in TERMINAL else None))
        if status in TERMINAL and "taskId" in task:
            self.store.remove(str(task["taskId"]))
        result = as_object(task.get("result"))
        if self.as_json:
            print(json.dumps(task, indent=2, ensure_ascii=False))
        elif status == "completed":
            show_result(self.out, result)
        if status == "completed":
            saved = self.save_dir is None or save_reported(self.err, self.client, result, self.save_dir)
            if result.get("isError"):
                self._status(f"[red]tool error[/red] after {elapsed}")
                return EXIT_TASK_FAILED
            self._status(
                f"[green]completed[/green] in {elapsed}" + ("" if saved else ", not every artifact saved")
            )
            return EXIT_OK if saved else EXIT_TASK_FAILED
        if status == "failed":
            error = as_object(task.get("error"))
            detail = f"{error.get('message')} ({error.get('code')})"
            self._status(f"[red]failed[/red] after {elapsed}: {_shown(detail)}")
            return EXIT_TASK_FAILED
        if status == "cancelled":
            self._status(f"[yellow]cancelled[/yellow] after {elapsed}")
            return EXIT_INTERRUPTED if cancelled_here else EXIT_TASK_FAILED
        self._status(f"still {_shown(status)} after {elapsed}; resume with --resume {_shown(self.task_id)}")
        return EXIT_INTERRUPTED if cancelled_here else EXIT_TASK_FAILED

    def _status(self, line: str) -> None:
        if not self.as_json:
            self.err.print(line, soft_wrap=True)
