"""The one object tool authors see while their tool runs as a task.

No Celery, SQL or broker in sight: the worker binds a ``TaskContext`` per job (a ContextVar)
and gives it a small runtime (``TaskRuntime``) that writes status messages, knows whether the
task is still ours to run, and waits for input. The context holds what is the tool author's:
capability checks and input keys; the runtime never refers back to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, Protocol, get_args

from mcp_types import (
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitResult,
    ListRootsResult,
    LoggingLevel,
)

from mcp_celery_tasks.errors import InputNotSupported, InvalidParams, TaskCancelled
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.tools import inputs, retries
from mcp_celery_tasks.tools.artifacts import NO_ARTIFACTS, ArtifactData, ResourceLink, TaskArtifacts
from mcp_celery_tasks.tools.steps import NO_STEPS, Checkpoints, TaskSteps

__all__ = ["LOG_LEVELS", "Ask", "TaskContext", "TaskRuntime", "current_context", "get_current_context"]

LOG_LEVELS: tuple[str, ...] = get_args(LoggingLevel)
"""MCP's log levels (syslog severities, RFC 5424), least severe first."""
MAX_LOG_BYTES = 16 * 1024
"""A log entry sent to a caller is at most this large (the worker log keeps the whole line)."""
_PYTHON_LEVEL = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO + 5,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "alert": logging.CRITICAL + 5,
    "emergency": logging.CRITICAL + 9,
}

P = ParamSpec("P")

Ask = tuple[str, Mapping[str, object] | None]
"""One input request: ``(method, params)``, e.g. ``("roots/list", None)``; params are JSON."""
Prepared = dict[str, tuple[str, Mapping[str, object] | None, str]]
"""``{key: (method, params, params hash)}``: the input requests of one ask."""


class TaskRuntime(Protocol):
    """What a context needs from the worker that runs it (``runtime.Runtime``)."""

    def report(self, message: str, progress: float | None = None, total: float | None = None) -> None:
        """Set the status message and numeric progress (coalesced; the latest always lands)."""
        ...

    def log(self, level: str, logger: str | None, data: JSONValue) -> None:
        """Record a log message for the task's synchronous caller."""
        ...

    def flush(self) -> None:
        """Write a pending status message now."""
        ...

    @property
    def cancelled(self) -> bool:
        """True once the task was cancelled or taken from this worker (cheap: cached briefly)."""
        ...

    def check_soft_limit(self) -> None:
        """Raise ``SoftTimeLimitExceeded`` (once) when the job ran past its soft time limit."""
        ...

    def ask(self, requests: Prepared, timeout_s: float) -> dict[str, JSONObject]:
        """Make ``{key: (method, params, hash)}`` outstanding and block until all are answered.

        Answers recorded by an earlier run of the same job are returned at once.
        """
        ...


class TaskContext:
    """Per-job handle: report progress, notice cancellation, read pre-task answers.

    Attributes:
        task_id: the MCP task id (a bearer-like handle: do not log it).
        job_id: the Celery job id; safe to log, shown in Flower.
        tool_name: the tool being run.
        attempt: 1 on the first run, more when the job was redelivered after a crash.
        preflight: answers collected before the task existed (``ask_first``).
        principal: who created the task (``token:<name>``, ``jwt:<issuer>#<sub>``, ``anon``): keep
            one principal's files apart from another's (``FileRoot.for_principal``).
        device: on a GPU worker (``worker --gpus``), the GPU this job's process is pinned to, as
            the worker names it (``"2"``); the process sees only that device, as ``cuda:0``.
            None on a worker without GPUs.
    """

    def __init__(
        self,
        *,
        task_id: str,
        job_id: str,
        tool_name: str,
        attempt: int,
        preflight: Mapping[str, object] | None,
        runtime: TaskRuntime,
        client_capabilities: Mapping[str, object] | None = None,
        strict_capabilities: bool = True,
        input_timeout_s: float = 1500.0,
        max_outstanding_inputs: int = 16,
        sleep_slice_s: float = 0.2,
        log_level: str | None = None,
        steps: TaskSteps = NO_STEPS,
        artifacts: TaskArtifacts = NO_ARTIFACTS,
        principal: str = "",
        device: str | None = None,
        is_task: bool = True,
        max_retry_delay_s: float = 3600.0,
    ) -> None:
        self.task_id = task_id
        self.is_task = is_task
        """Whether the client holds a task handle for this run (it polls, and may come back
        later); False for a plain ``tools/call`` that waits for the result (keep it short, or
        tell the caller to use a task)."""
        self._max_retry_delay_s = max_retry_delay_s
        self.principal = principal
        self.device = device
        self.job_id = job_id
        self.tool_name = tool_name
        self.attempt = attempt
        self.preflight: dict[str, Any] = dict(preflight or {})
        # Answers the request offered up front; used when the tool asks under that key.
        given = self.preflight.pop(inputs.GIVEN_KEY, None)
        self._given: dict[str, object] = dict(given) if isinstance(given, dict) else {}
        self._runtime = runtime
        self._sleep_slice = sleep_slice_s
        self._capabilities: dict[str, object] = dict(client_capabilities or {})
        self._strict = strict_capabilities
        self._input_timeout_s = input_timeout_s
        self._max_outstanding = max_outstanding_inputs
        self._ordinal = 0
        self._asked: dict[str, str] = {}
        # The lowest level the synchronous caller asked to receive (None: it asked for none).
        self._log_from = LOG_LEVELS.index(log_level) if log_level in LOG_LEVELS else None
        self._logger = logging.getLogger(f"mcp_celery_tasks.tool.{tool_name}")
        self._steps = steps
        self._artifacts = artifacts

    @property
    def client_capabilities(self) -> dict[str, object]:
        """What the calling client declared (``elicitation``, ``sampling``, ``roots`` …): a tool
        asks only for input kinds found here (SEP-2322)."""
        return dict(self._capabilities)

    # ---- progress ----------------------------------------------------------------------

    def report(self, message: str, progress: float | None = None, total: float | None = None) -> None:
        """Set the task's ``statusMessage``; ``progress`` (and ``total``, if known) also reach a
        synchronous caller that sent a ``progressToken``, as ``notifications/progress``.

        Writes are coalesced to one per ``report_interval``; the latest message always lands
        (the worker flushes it in the background and before the outcome is recorded).
        Progress should only increase: a lower value than one already sent is not forwarded.
        """
        for number in (progress, total):
            if number is not None and not math.isfinite(number):
                raise ValueError("progress and total must be finite numbers")
        if progress is None and total is None:
            self._runtime.report(message)
        else:
            self._runtime.report(message, progress, total)

    def log(self, level: str, message: str, data: Any = None) -> None:
        """Log a message: always to the worker log, and to a synchronous caller that asked for
        this level or a lower one, as ``notifications/message`` (never to a task's client: the
        tasks extension carries no logs).

        Args:
            level: one of MCP's levels: debug, info, notice, warning, error, critical, alert,
                emergency.
            message: the text.
            data: any JSON value sent along (the notification's ``data`` is then
                ``{"message": message, "data": data}``; without it, the message alone).
        """
        if level not in LOG_LEVELS:
            raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LOG_LEVELS)}")
        self._logger.log(_PYTHON_LEVEL[level], message, extra={"job_id": self.job_id, "tool": self.tool_name})
        if self._log_from is not None and LOG_LEVELS.index(level) >= self._log_from:
            payload: JSONValue = message if data is None else {"message": message, "data": data}
            try:
                size = len(json.dumps(payload, allow_nan=False))
            except (TypeError, ValueError):
                payload, size = message, len(message)  # data that is not JSON stays in the worker log
            if size > MAX_LOG_BYTES:
                payload = message[:MAX_LOG_BYTES] + " [cut: the log entry was too large]"
            self._runtime.log(level, self.tool_name, payload)

    def flush(self) -> None:
        """Write a pending status message now (called by the worker; harmless for tools)."""
        self._runtime.flush()

    # ---- cancellation ------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether the task was cancelled (or taken from this worker). Cheap: cached briefly."""
        return self._runtime.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise ``TaskCancelled`` if the task was cancelled: call it between steps. Past the
        tool's soft time limit it raises ``SoftTimeLimitExceeded`` (once) instead."""
        if self.cancelled:
            raise TaskCancelled("the task was cancelled")
        self._runtime.check_soft_limit()

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early (with ``TaskCancelled``) if the task is cancelled."""
        deadline = time.monotonic() + seconds
        while True:
            self.raise_if_cancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, self._sleep_slice))

    def retry_later(self, seconds: float, reason: str = "") -> None:
        """End this attempt and run the tool again after ``seconds`` (a downstream said 429 with
        ``Retry-After``). Counts as an attempt: past the tool's ``max_attempts`` the call ends
        with a tool error naming ``reason``. The job waits in the backlog, holding no worker
        slot; steps already done (``step``) are not redone. ``seconds`` must be finite, from 0 to
        ``retry_max_delay_seconds`` (else ``ToolError``)."""
        raise retries.retry_later(seconds, reason, self._max_retry_delay_s)

    # ---- durable steps and checkpoints (``tools.steps``) ---------------------------------------

    def step(self, name: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run ``fn(*args, **kwargs)`` once per task: its result (JSON) is recorded before this
        returns, and every later run of the task (after a crash, a redelivery, a resume) returns
        the recorded result without calling ``fn``. The result is returned as JSON decodes it, on
        the first run too (a tuple comes back a list).

        Steps must run in the same order on every run (else ``StepOrderError``), their side
        effects must be idempotent (a run killed before the record runs the step again), and a
        result is at most ``max_step_result_bytes`` as JSON (else ``StepResultError``).
        """
        return self._steps.step(name, fn, args, kwargs)

    @property
    def checkpoint(self) -> Checkpoints:
        """The task's checkpoints: ``save(name, data)``, ``load(name)``, ``load_to(name, path)``,
        ``info(name)``, ``delete(name)``; the latest save of a name wins, and a re-run of the task
        loads what the last run saved."""
        return self._steps.checkpoint

    def artifact(self, name: str, data: ArtifactData, mime_type: str | None = None) -> ResourceLink:
        """Publish ``data`` (bytes, text, or a binary file object, streamed in 1 MiB chunks) as
        artifact ``name`` of this task and return the ``resource_link`` block to put in the
        result; the client reads it with ``resources/read`` while the task exists. ``name`` is a
        plain file name (``ToolError`` otherwise); ``mime_type`` defaults to a guess from it."""
        return self._artifacts.publish(name, data, mime_type)

    # ---- input requests --------------------------------------------------------------------

    def elicit(self, message: str, schema: Mapping[str, object], *, key: str | None = None) -> ElicitResult:
        """Ask the user to fill a form; blocks until answered (or cancelled, or timed out).

        Returns the ``ElicitResult``: check ``action`` (accept / decline / cancel); ``content``
        holds the validated answer on accept.
        """
        answer = self._ask_one(key, inputs.ELICIT, inputs.elicit_params(message, schema))
        return ElicitResult.model_validate(answer)

    def sample(
        self,
        messages: Sequence[Mapping[str, object]],
        max_tokens: int,
        *,
        system_prompt: str | None = None,
        key: str | None = None,
        **params: object,
    ) -> CreateMessageResult | CreateMessageResultWithTools:
        """Ask the client's LLM for a message (``sampling/createMessage``)."""
        request: dict[str, object] = {"messages": messages, "maxTokens": max_tokens, **params}
        if system_prompt is not None:
            request["systemPrompt"] = system_prompt
        answer = self._ask_one(key, inputs.SAMPLE, request)
        if isinstance(answer.get("content"), list):
            return CreateMessageResultWithTools.model_validate(answer)
        return CreateMessageResult.model_validate(answer)

    def list_roots(self, *, key: str | None = None) -> ListRootsResult:
        """Ask the client for its roots (``roots/list``)."""
        return ListRootsResult.model_validate(self._ask_one(key, inputs.ROOTS, None))

    def ask(self, key: str | None, method: str, params: Mapping[str, object] | None) -> JSONObject:
        """Any input request (``params``: JSON); returns the raw answer (already validated by the
        server)."""
        return self._ask_one(key, method, params)

    def ask_many(self, requests: Mapping[str, Ask]) -> dict[str, JSONObject]:
        """Several input requests outstanding at once; returns every answer by key."""
        return self._ask(list(requests.items()))

    def _ask_one(self, key: str | None, method: str, params: Mapping[str, object] | None) -> JSONObject:
        return next(iter(self._ask([(key, (method, params))]).values()))

    def _ask(self, items: list[tuple[str | None, Ask]]) -> dict[str, JSONObject]:
        prepared: Prepared = {}
        order: list[str] = []
        for explicit, (method, params) in items:
            capability = inputs.CAPABILITY_FOR.get(method)
            if capability is None:
                raise ValueError(f"unknown input request method {method!r}")
            if self._strict and capability not in self._capabilities:
                raise InputNotSupported(
                    f"The client did not declare the {capability!r} capability on this call, "
                    f"so the tool cannot ask for {method}",
                    capability,
                )
            digest = inputs.params_hash(method, params)
            self._ordinal += 1
            key = explicit if explicit is not None else f"{self._ordinal}-{digest}"
            previous = self._asked.get(key)
            if previous is not None and previous != digest:
                # S-26: a key never names two requests.
                raise ValueError(f"input key {key!r} was already used for a different request")
            self._asked[key] = digest
            prepared[key] = (method, params, digest)
            order.append(key)
        if len(prepared) > self._max_outstanding:
            raise ValueError(f"at most {self._max_outstanding} input requests may be outstanding at once")
        self.raise_if_cancelled()
        answers = self._offered(prepared)
        missing = {key: ask for key, ask in prepared.items() if key not in answers}
        if missing:
            answers.update(self._runtime.ask(missing, self._input_timeout_s))
        return {key: answers[key] for key in order}

    def _offered(self, prepared: Prepared) -> dict[str, JSONObject]:
        """Answers the request offered before it was asked, where they fit the question (each
        used once; one that does not fit is ignored and the question asked as usual)."""
        found: dict[str, JSONObject] = {}
        for key, (method, params, _) in prepared.items():
            if key in self._given:
                with contextlib.suppress(InvalidParams):
                    found[key] = inputs.validate_response(key, method, params, self._given.pop(key))
        return found


_current: ContextVar[TaskContext | None] = ContextVar("mcp_task_context", default=None)


def current_context() -> TaskContext:
    """The context of the task running in this thread; raises outside a task."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("no MCP task is running in this context")
    return ctx


def get_current_context() -> TaskContext | None:
    """The context of the MCP task running in this thread, or None when the code runs some other
    way (called from Python, or as a plain Celery task). For code that cannot take a ``ctx``
    parameter, as dramatiq's ``CurrentMessage``::

        ctx = get_current_context()
        if ctx is not None:
            ctx.report("resizing 3/10")
    """
    return _current.get()


@contextmanager
def bind(ctx: TaskContext) -> Iterator[TaskContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
