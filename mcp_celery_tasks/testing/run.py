"""``run_tool``: one call of a tool as the server and a worker would make it, all in memory.

The arguments are checked by the tool's schema as the server checks them; the job then runs
through the worker's own ``JobRunner`` (the real ``Runtime`` and ``TaskContext``, the same
mapping of return values and exceptions to a ``CallToolResult``) on a ``MemoryStore``. The
client's part (answering input requests, cancelling) is played from the call's arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel

from mcp_celery_tasks.errors import (
    TASKS_EXTENSION,
    InvalidParams,
    MissingCapability,
    ProtocolError,
    TaskError,
)
from mcp_celery_tasks.json_types import JSONObject, JSONValue, as_array, as_object
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.records import ClaimedTask
from mcp_celery_tasks.testing.memory import MemoryInbox, MemoryStore, Row
from mcp_celery_tasks.testing.memory_steps import TaskDurables
from mcp_celery_tasks.tools.artifacts import artifact_uri
from mcp_celery_tasks.tools.inputs import CAPABILITY_FOR, validate_response
from mcp_celery_tasks.tools.registry import InvalidArguments, ToolSpec, all_tools, get_tool
from mcp_celery_tasks.tools.results import error_result
from mcp_celery_tasks.wire import declares_tasks
from mcp_celery_tasks.worker.leases import LeaseKeeper
from mcp_celery_tasks.worker.runner import JobRunner
from mcp_celery_tasks.worker.runtime import Runtime

__all__ = ["ALL_CAPABILITIES", "InputRequest", "LogEntry", "Report", "ToolRun", "UnansweredInput", "run_tool"]

ALL_CAPABILITIES: Final[Mapping[str, JSONObject]] = {
    "elicitation": {"form": {}},
    "sampling": {},
    "roots": {},
    "extensions": {TASKS_EXTENSION: {}},
}
"""What the default caller declares: every input kind, and the tasks extension."""

Answer = Mapping[str, object] | BaseModel | Callable[[JSONObject | None], Mapping[str, object] | BaseModel]
"""An answer as the client would send it (``{"action": "accept", "content": {...}}``, an
``ElicitResult``…), or a function of the request's params that returns one."""


class UnansweredInput(AssertionError):
    """The tool asked for input that ``answers`` has no (valid) answer for.

    Raised by ``run_tool`` once the run is over (the task is cancelled under the tool, as a
    client that gives up would); ``request`` is the question.
    """

    def __init__(self, message: str, request: InputRequest) -> None:
        super().__init__(message)
        self.request = request


@dataclass(frozen=True, slots=True)
class Report:
    """One ``ctx.report``, as written to the task's ``statusMessage``."""

    message: str
    progress: float | None = None
    total: float | None = None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One ``ctx.log`` as a synchronous caller would receive it (``notifications/message``)."""

    level: str
    logger: str | None
    data: JSONValue


@dataclass(frozen=True, slots=True)
class InputRequest:
    """One input request the tool made, and the answer it got (None: unanswered)."""

    key: str
    method: str
    params: JSONObject | None
    answer: Mapping[str, object] | None = None


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What one ``run_tool`` call came to.

    Attributes:
        status: the task's final status: ``completed`` (also for a tool error: see
            ``is_error``), ``failed`` (an ``McpError``: ``error``) or ``cancelled``.
        result: the ``CallToolResult`` as the server stores it (None unless completed).
        error: the JSON-RPC error (``{"code", "message", "data"?}``) of a failed task.
        reports: every status report, in order.
        logs: every ``ctx.log`` entry (all levels: the caller is taken to ask for ``debug``).
        requests: every input request, with its answer.
        artifacts: the bytes of every artifact the run published (``ctx.artifact``), by the
            uri of its ``resource_link``.
    """

    status: str
    result: JSONObject | None = None
    error: TaskError | None = None
    reports: list[Report] = field(default_factory=list)
    logs: list[LogEntry] = field(default_factory=list)
    requests: list[InputRequest] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)

    @property
    def is_error(self) -> bool:
        """The tool ended in a tool error (``isError: true``): a ``ToolError``, a crash, or arguments
        that do not fit the schema."""
        return bool(self.result and self.result.get("isError"))

    @property
    def text(self) -> str:
        """The result's text content blocks, joined by newlines."""
        blocks = [as_object(block) for block in as_array((self.result or {}).get("content"))]
        return "\n".join(str(block["text"]) for block in blocks if block.get("type") == "text")

    @property
    def structured(self) -> Any:
        """The result's ``structuredContent`` (None when the tool returned text): the tool's
        return value as JSON, any value."""
        return (self.result or {}).get("structuredContent")


def run_tool(
    tool: str | Callable[..., Any],
    arguments: Mapping[str, object] | None = None,
    *,
    answers: Mapping[str, Answer] | None = None,
    cancel_after: int | None = None,
    capabilities: Mapping[str, object] | None = None,
    preflight: Mapping[str, object] | None = None,
    settings: Settings | None = None,
    principal: str = "anon",
    synchronous: bool = False,
) -> ToolRun:
    """Call a ``@tool`` as the server would, with no Postgres, broker or worker.

    Args:
        tool: the tool's name or its decorated function.
        arguments: the call's arguments; checked against the tool's input schema first (a misfit
            ends as the server's ``isError`` result, and the tool does not run).
        answers: the client's answers to input requests, by input key (the tool's ``key=``; an
            automatic key looks like ``"1-3f2a…"`` and is named in the error below). Each answer
            is checked against its request as the server checks it. A request with no answer, or
            with one that does not fit, cancels the task and raises ``UnansweredInput``.
        cancel_after: the client cancels the task once the tool has made this many status
            reports (0: before the tool's first checkpoint); the tool sees ``TaskCancelled`` at
            its next ``ctx`` checkpoint and the run ends ``cancelled``.
        capabilities: what the client declares (default ``ALL_CAPABILITIES``); without
            ``elicitation``, ``ctx.elicit`` raises ``InputNotSupported`` as it would live.
        preflight: ``ctx.preflight`` as given, instead of asking the tool's ``ask_first``
            questions (by default they are asked before the job runs, as the server asks them,
            and answered from ``answers`` by their key).
        principal: who calls (``ctx.principal``; what ``ask_first`` functions see).
        synchronous: run as a plain ``tools/call`` would (``ctx.is_task`` is False).
        settings: the worker settings (default: from the environment, with every status report
            written and every cancel check reading the row, so a run is deterministic; a
            ``ctx.sleep`` then really sleeps, checking for a cancel all the while).

    A retry (``@tool(retry_on=…)``, ``ctx.retry_later``) runs the tool again at once, without
    waiting out its delay, up to the tool's ``max_attempts`` (``ctx.attempt`` counts them).

    Returns:
        A ``ToolRun``: the stored outcome and everything the tool reported, logged and asked.
    """
    spec = _spec(tool)
    settings = settings or Settings(report_min_interval_seconds=0.0, cancel_check_interval_seconds=0.0)
    declared = dict(ALL_CAPABILITIES if capabilities is None else capabilities)
    answers = answers or {}
    asked_first: list[InputRequest] = []
    try:
        checked = _check_arguments(spec, dict(arguments or {}), settings)
        if spec.mode == "required" and not declares_tasks(declared):
            raise MissingCapability()  # SEP-2663: a task-only tool refuses a non-task call
        if preflight is None:
            preflight = _ask_first(spec, checked, answers, declared, asked_first, principal)
    except InvalidArguments as exc:
        return ToolRun("completed", result=error_result(exc.message))
    except ProtocolError as exc:
        return ToolRun("failed", error=exc.to_error())
    store = _ClientStore(cancel_after)
    row = store.add(
        spec.name,
        checked,
        client_capabilities=declared,
        preflight=dict(preflight) or None,
        log_level="debug",
        max_attempts=spec.max_attempts or settings.max_attempts,
        owner=principal,
        synchronous=synchronous,
    )
    client = _Client(store, row, answers)
    inbox = MemoryInbox(client.on_wait)
    runner = JobRunner(store, settings, lambda: inbox, leases=_NoLeases(settings.lease_seconds))
    outcome = runner.run(row.job_id)
    while outcome.status in ("suspended", "backoff") and client.problem is None:
        if outcome.status == "backoff":
            row.retry_at = None  # due now: a test does not wait out the backoff
            outcome = runner.run(row.job_id)
            continue
        # The job gave its slot back waiting for input (``suspend_after``): the client answers,
        # and the job runs again from the top, as it would live (recorded answers replay).
        client.on_wait(row.task_id)
        if row.status == "input_required":
            break  # not answered: ``client.problem`` says why
        outcome = runner.run(row.job_id)
    if client.problem is not None:
        raise client.problem
    if row.status not in ("completed", "failed", "cancelled"):
        raise RuntimeError(f"the run of {spec.name!r} ended {outcome.status!r} with the task {row.status!r}")
    return ToolRun(
        row.status,
        result=row.result,
        error=row.error,
        reports=[Report(*report) for report in row.reports],
        logs=[LogEntry(*entry) for entry in row.logs],
        requests=[*asked_first, *client.requests()],
        artifacts={
            artifact_uri(artifact_id, name): data
            for artifact_id, (name, _, data) in store.durables.get(
                row.task_id, TaskDurables()
            ).artifacts.items()
        },
    )


def _spec(tool: str | Callable[..., Any]) -> ToolSpec:
    if isinstance(tool, str):
        spec = get_tool(tool)
    else:
        target = getattr(tool, "run", tool)  # a Celery task registered with ``tool(task)``
        spec = next((s for s in all_tools() if s.fn is tool or s.fn is target), None)
    if spec is None:
        raise LookupError(f"{tool!r} is not a registered tool: decorate it with @tool (or import its module)")
    return spec


def _check_arguments(spec: ToolSpec, arguments: Mapping[str, object], settings: Settings) -> JSONObject:
    """The server's checks of a call's arguments (``protocol.v2026_07_28.resolve_call``)."""
    limit = settings.max_arguments_bytes
    if arguments and len(json.dumps(arguments, separators=(",", ":"))) > limit:
        raise InvalidParams(f"arguments are larger than {limit} bytes")
    return spec.validate_arguments(arguments)


def _ask_first(
    spec: ToolSpec,
    arguments: JSONObject,
    answers: Mapping[str, Answer],
    declared: Mapping[str, object],
    asked: list[InputRequest],
    principal: str,
) -> JSONObject:
    """The ``ask_first`` answers as the server collects them (``protocol.rounds.preflight``)."""
    collected: JSONObject = {}
    for key, question in spec.questions_first(arguments, principal).items():
        if CAPABILITY_FOR[question.method] not in declared:
            needed = CAPABILITY_FOR[question.method]
            raise MissingCapability(f"The tool asks first and needs the {needed!r} capability", {needed: {}})
        request = InputRequest(key, question.method, question.params)
        answer = collected[key] = _answer(request, answers)
        asked.append(InputRequest(key, question.method, question.params, answer))
    return collected


def _answer(request: InputRequest, answers: Mapping[str, Answer]) -> JSONObject:
    """The answer ``answers`` gives ``request``, checked as the server checks it."""
    if request.key not in answers:
        keys = ", ".join(map(repr, answers)) or "none"
        raise UnansweredInput(
            f"the tool asked {request.key!r} ({_describe(request)}); answers has {keys}", request
        )
    given = answers[request.key]
    answer = given(request.params) if callable(given) else given
    try:
        return validate_response(request.key, request.method, request.params, _plain(answer))
    except InvalidParams as exc:
        message = f"the answer to {request.key!r} does not fit its request: {exc.message}"
        raise UnansweredInput(message, request) from None


class _NoLeases(LeaseKeeper):
    """No lease thread: no other worker could take the job, and with every report written at
    once there is nothing to flush, so the run stays in the test's thread (and in order)."""

    def watch(self, runtime: Runtime) -> None:
        pass

    def release(self, runtime: Runtime) -> None:
        pass


class _ClientStore(MemoryStore):
    """A ``MemoryStore`` whose client cancels the task after ``cancel_after`` status reports."""

    def __init__(self, cancel_after: int | None) -> None:
        super().__init__()
        self._cancel_after = cancel_after

    def claim(
        self, job_id: str, worker: str, lease_s: float, device: str | None = None
    ) -> ClaimedTask | None:
        job = super().claim(job_id, worker, lease_s, device)
        if job is not None and self._cancel_after == 0:
            self.cancel(job.task_id)
        return job

    def report(
        self,
        task_id: str,
        worker: str,
        message: str,
        progress: float | None = None,
        total: float | None = None,
    ) -> bool:
        written = super().report(task_id, worker, message, progress, total)
        if written and len(self.rows[task_id].reports) == self._cancel_after:
            self.cancel(task_id)
        return written


class _Client:
    """The client's part while the job waits: answer each outstanding request from ``answers``."""

    def __init__(self, store: MemoryStore, row: Row, answers: Mapping[str, Answer]) -> None:
        self._store = store
        self._row = row
        self._answers = answers
        self.problem: UnansweredInput | None = None

    def on_wait(self, task_id: str) -> None:
        for key in self._store.outstanding(task_id):
            record = self._row.inputs[key]
            asked = key.split("~", 1)[0]  # a re-asked key is stored as ``key~2``
            try:
                response = _answer(InputRequest(asked, record.method, record.params), self._answers)
            except UnansweredInput as problem:
                # Raised by ``run_tool`` once the run is over: the client gives up on the task.
                self.problem = problem
                self._store.cancel(task_id)
                return
            self._store.answer(task_id, key, response)

    def requests(self) -> list[InputRequest]:
        return [
            InputRequest(key.split("~", 1)[0], rec.method, rec.params, rec.response)
            for key, rec in self._row.inputs.items()
        ]


def _plain(answer: Mapping[str, object] | BaseModel) -> object:
    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(answer)


def _describe(request: InputRequest) -> str:
    message = (request.params or {}).get("message")
    return f"{request.method}: {message!r}" if message else request.method
