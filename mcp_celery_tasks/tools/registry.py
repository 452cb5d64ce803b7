"""The ``@tool`` decorator and the specs it records: schema, task mode, queue, timings.

The API imports tool modules to learn names, schemas and modes; only workers call the
functions. Arguments are validated against the schema before any row is written.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.json_types import JSONObject, as_object
from mcp_celery_tasks.tools.checks import (
    InputKind,
    Isolation,
    checked_inputs,
    checked_isolation,
    checked_scopes,
    checked_suspend_after,
    takes_principal,
)
from mcp_celery_tasks.tools.concurrency import (
    ConcurrencyKey,
    ConcurrencyLimit,
    KeyUnavailable,
    concurrency_limit,
)
from mcp_celery_tasks.tools.context import TaskContext
from mcp_celery_tasks.tools.inputs import Elicit
from mcp_celery_tasks.tools.retries import Backoff, RetryPolicy, retry_policy

__all__ = [
    "AskFirst",
    "InvalidArguments",
    "Mode",
    "ToolModuleError",
    "ToolSpec",
    "all_tools",
    "get_tool",
    "load_tool_modules",
    "tool",
]

Mode = Literal["forbidden", "optional", "required"]
"""How a tool runs: ``forbidden`` never as a task (the call waits for the job), ``optional``
as a task when the request declares the tasks extension, ``required`` only as a task
(non-declaring clients get -32021)."""

F = TypeVar("F", bound=Callable[..., Any])

AskFirst = Elicit | Callable[[JSONObject], Elicit | None] | Callable[[JSONObject, str], Elicit | None]
"""A pre-task question, or a function of the call's arguments (and, if it takes a second
parameter, of the calling principal: a question about one principal's files) that returns one
(or None)."""


@dataclass(frozen=True)
class ToolSpec:
    """Everything the server and the workers know about one tool."""

    name: str
    description: str | None
    fn: Callable[..., Any]
    arguments_model: type[BaseModel]
    context_param: str | None
    mode: Mode
    queue: str | None
    retention_seconds: float | None
    poll_interval_ms: int | None
    max_attempts: int | None
    input_timeout: float | None = None
    ask_first: dict[str, AskFirst] = field(default_factory=dict)
    input_schema: JSONObject = field(default_factory=dict)
    time_limit: float | None = None
    soft_time_limit: float | None = None
    memory_limit_mb: int | None = None
    gpu_memory_limit_mb: int | None = None
    """Most device memory a run may hold on its GPU (GPU workers with NVML)."""
    suspend_after: float | Literal["settings"] | None = "settings"
    """Seconds of waiting for input before the job gives its slot back; None: stay resident;
    ``"settings"``: ``Settings.suspend_after_seconds``."""
    needs_inputs: tuple[InputKind, ...] = ()
    """The kinds of input request the tool raises (``elicitation``, ``sampling``, ``roots``): a
    client that did not declare one of them gets -32021 at the call, before any job runs,
    instead of a task that ends ``isError`` when the tool asks."""
    scopes: tuple[str, ...] = ()
    """OAuth scopes a JWT caller's token must carry to call the tool (403 ``insufficient_scope``
    otherwise, naming them: a step-up); static tokens and embedding apps are not scope-checked."""
    retry: RetryPolicy | None = None
    """Which errors of the body end the attempt and run it again after a backoff (``retry_on``)."""
    concurrency: ConcurrencyLimit | None = None
    """At most this many runs at once, of the tool or per key (``tools.concurrency``)."""
    isolation: Isolation = "none"
    """``process``: the body runs in a fresh process without the worker's credentials."""

    def validate_arguments(self, arguments: Mapping[str, object]) -> JSONObject:
        """Validate against the input schema; return the JSON-ready arguments to store.

        Raises ``InvalidArguments`` naming each problem (an unknown name lists the valid ones).
        """
        try:
            model = self.arguments_model.model_validate(arguments)
        except ValidationError as exc:
            problems = []
            for err in exc.errors(include_url=False):
                where = ".".join(str(p) for p in err["loc"]) or "arguments"
                if err["type"] == "extra_forbidden":
                    valid = ", ".join(as_object(self.input_schema.get("properties"))) or "none"
                    problems.append(f"unknown argument {where!r} (this tool takes: {valid})")
                else:
                    problems.append(f"{where}: {err['msg']}")
            raise InvalidArguments(
                f"Invalid arguments for tool {self.name!r}: {'; '.join(problems)}"
            ) from exc
        validated = model.model_dump(mode="json", by_alias=True)
        if (
            self.concurrency is not None
            and callable(self.concurrency.key)
            and not self.concurrency.per_principal
        ):
            self.concurrency_group(validated)  # a key function failing here is the model's to fix
        return validated

    def concurrency_group(
        self, arguments: Mapping[str, object], principal: str = ""
    ) -> tuple[str, int] | tuple[None, None]:
        """The concurrency group and declared limit of a call with these validated arguments by
        ``principal`` (None, None: the tool has no limit). A key function that fails is invalid
        arguments."""
        if self.concurrency is None:
            return None, None
        try:
            return self.concurrency.group(arguments, principal), self.concurrency.limit
        except KeyUnavailable as exc:
            raise InvalidArguments(str(exc)) from exc

    def questions_first(self, arguments: JSONObject, principal: str = "") -> dict[str, Elicit]:
        """The ``ask_first`` questions that apply to these (validated) arguments of ``principal``."""
        questions: dict[str, Elicit] = {}
        for key, entry in self.ask_first.items():
            if isinstance(entry, Elicit):
                question: Elicit | None = entry
            elif takes_principal(entry):
                question = entry(arguments, principal)  # type: ignore[call-arg]  # checked just above
            else:
                question = entry(arguments)  # type: ignore[call-arg]  # the one-argument form
            if question is not None:
                questions[key] = question
        return questions

    def call_kwargs(self, arguments: Mapping[str, object]) -> dict[str, object]:
        """Python values for the stored arguments (re-validated in the worker)."""
        model = self.arguments_model.model_validate(arguments)
        fields = type(model).model_fields
        return {str(field.alias): getattr(model, attr) for attr, field in fields.items()}


_REGISTRY: dict[str, ToolSpec] = {}


def _build(fn: Callable[..., Any], name: str) -> tuple[type[BaseModel], str | None]:
    # include_extras: Annotated[float, Field(le=…)] keeps its bounds (else they vanish silently).
    hints = typing.get_type_hints(fn, include_extras=True)
    # What create_model's ``**field_definitions`` takes (its keyword names are typed too).
    fields: dict[str, Any] = {}
    context_param = None
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs are not supported")
        annotation = hints.get(param.name, Any)
        if annotation is TaskContext:
            context_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        # Internal field names are neutral so that any parameter name works (``_token``,
        # ``schema``, ``model_config`` would otherwise clash with pydantic); the alias is
        # the name clients see.
        fields[f"p{index}"] = (annotation, Field(default, alias=param.name))
    model = create_model(
        f"{name}_arguments",
        # Unknown argument names are refused: a typo must not silently run with the default.
        __config__=ConfigDict(extra="forbid", populate_by_name=False, serialize_by_alias=True),
        **fields,
    )
    return model, context_param


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    mode: Mode = "optional",
    queue: str | None = None,
    retention_seconds: float | None = None,
    poll_interval_ms: int | None = None,
    max_attempts: int | None = None,
    input_timeout: float | None = None,
    ask_first: dict[str, AskFirst] | None = None,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    memory_limit_mb: int | None = None,
    gpu_memory_limit_mb: int | None = None,
    suspend_after: float | Literal["settings"] | None = "settings",
    schema_extra: Mapping[str, object] | None = None,
    scopes: Sequence[str] = (),
    needs_inputs: Sequence[InputKind] = (),
    retry_on: type[Exception] | tuple[type[Exception], ...] = (),
    backoff: Backoff | None = None,
    concurrency: int | None = None,
    concurrency_key: ConcurrencyKey | None = None,
    isolation: Isolation = "none",
) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    mode: Mode = "optional",
    queue: str | None = None,
    retention_seconds: float | None = None,
    poll_interval_ms: int | None = None,
    max_attempts: int | None = None,
    input_timeout: float | None = None,
    ask_first: dict[str, AskFirst] | None = None,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    memory_limit_mb: int | None = None,
    gpu_memory_limit_mb: int | None = None,
    suspend_after: float | Literal["settings"] | None = "settings",
    schema_extra: Mapping[str, object] | None = None,
    scopes: Sequence[str] = (),
    needs_inputs: Sequence[InputKind] = (),
    retry_on: type[Exception] | tuple[type[Exception], ...] = (),
    backoff: Backoff | None = None,
    concurrency: int | None = None,
    concurrency_key: ConcurrencyKey | None = None,
    isolation: Isolation = "none",
) -> F | Callable[[F], F]:
    """Register a function as an MCP tool that runs as a Celery job.

    The input schema comes from the type hints; a parameter annotated ``TaskContext``
    receives the context (code without one calls ``get_current_context()``). ``fn`` may be an
    existing Celery task: ``tool(resize_images)`` exposes it without rewriting it. ``queue``
    routes the job (e.g. ``"gpu"``); ``retention_seconds`` is how long a finished task stays
    readable; ``input_timeout`` how long the tool waits for an
    answer to an input request; ``ask_first`` questions are asked before the task exists (no
    worker slot is held while a human thinks) and their answers land in ``ctx.preflight`` (a
    question may be a function of the validated arguments returning an ``Elicit`` or None);
    unset values come from Settings. ``time_limit`` (seconds of running, input waits not
    counted), ``soft_time_limit`` (``SoftTimeLimitExceeded`` raised in the tool first) and
    ``memory_limit_mb`` (resident memory; ``gpu_memory_limit_mb``: device memory on a GPU worker
    with NVML) bound one run; past a hard limit the process is killed and the call ends
    with ``isError`` (prefork workers). ``suspend_after`` is how long the job waits for input
    holding its worker slot before it gives the slot back and runs again from the top once
    answered (0: at once; None: never; default ``Settings.suspend_after_seconds``): put work
    that comes before a question in ``ctx.step`` so a re-run does not redo it. ``schema_extra``
    adds JSON Schema keywords to the advertised input schema (``$schema``, ``$defs``, ``allOf``,
    ``if``/``then``/``else``, or a property's ``x-mcp-header``: each of its ``properties``
    replaces the generated one); the signature still validates the arguments, so keep the two
    consistent. ``scopes``: the OAuth scopes a JWT caller needs for this tool (step-up: a token
    without them gets 403 ``insufficient_scope`` naming them). ``needs_inputs``: the input
    requests the tool makes (``"elicitation"``, ``"sampling"``, ``"roots"``); a client that cannot
    answer one gets -32021 naming the capability before the job runs.
    ``retry_on`` (exception types) makes a matching error of the body end the
    attempt and schedule the next after ``backoff`` (``exponential(…)`` or ``fixed(…)``; default
    ``exponential(1, 300)``), up to ``max_attempts`` runs; the job waits in the backlog, not in a
    worker. Any other exception ends the call at once, as without a policy.
    ``concurrency`` caps the runs in flight at once across every worker: of the whole tool, or
    with ``concurrency_key`` (an argument's name, or a function of the arguments, and of the
    principal if it takes a second parameter) per key value;
    a call over the limit waits in the fair backlog holding no slot (``tools.concurrency``).
    ``isolation="process"`` runs the body in a fresh process holding no database or broker
    credentials, its context forwarded over a pipe (``worker.isolation``; ~0.2 s more per run).
    """

    def register(target: F) -> F:
        func = _function_of(target)
        tool_name = name or func.__name__
        if tool_name in _REGISTRY and _REGISTRY[tool_name].fn is not func:
            raise ValueError(f"a tool named {tool_name!r} is already registered")
        retry = retry_policy(tool_name, retry_on, backoff, max_attempts)
        model, context_param = _build(func, tool_name)
        aliases = [str(f.alias) for f in model.model_fields.values()]
        limit = concurrency_limit(tool_name, concurrency, concurrency_key, aliases)
        schema = model.model_json_schema(by_alias=True)
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        if schema_extra:
            extra = dict(schema_extra)
            properties = {**schema.get("properties", {})}
            added = extra.pop("properties", None) or {}
            if not isinstance(added, Mapping):
                raise TypeError(f"tool {tool_name!r}: schema_extra's properties must be an object")
            properties.update(added)
            schema.update(extra)
            if properties:
                schema["properties"] = properties
        doc = inspect.getdoc(func)
        _REGISTRY[tool_name] = ToolSpec(
            name=tool_name,
            description=description or (doc.split("\n\n")[0] if doc else None),
            fn=func,
            arguments_model=model,
            context_param=context_param,
            mode=mode,
            queue=queue,
            retention_seconds=retention_seconds,
            poll_interval_ms=poll_interval_ms,
            max_attempts=max_attempts,
            input_timeout=input_timeout,
            ask_first=dict(ask_first or {}),
            input_schema=schema,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            memory_limit_mb=memory_limit_mb,
            gpu_memory_limit_mb=gpu_memory_limit_mb,
            suspend_after=checked_suspend_after(suspend_after),
            scopes=checked_scopes(tool_name, scopes),
            needs_inputs=checked_inputs(tool_name, needs_inputs),
            retry=retry,
            concurrency=limit,
            isolation=checked_isolation(tool_name, isolation),
        )
        return target

    if fn is not None:
        return register(fn)
    return register


def _function_of(target: Callable[..., Any]) -> Callable[..., Any]:
    """The function behind ``target``: an existing Celery task (``@app.task``) becomes a tool
    through its ``run`` function, so its type hints give the schema; the task itself is returned
    unchanged and ``.delay()`` keeps working. As a tool it runs inside MCP's own job (lease,
    cancel, inputs), and ``get_current_context()`` gives it the task context."""
    run = getattr(target, "run", None)
    if callable(run) and callable(getattr(target, "apply_async", None)):
        return run  # type: ignore[no-any-return]
    return target


def get_tool(name: str) -> ToolSpec | None:
    return _REGISTRY.get(name)


def all_tools() -> list[ToolSpec]:
    """Every tool, in registration order."""
    return list(_REGISTRY.values())


class InvalidArguments(InvalidParams):
    """Arguments that do not fit the tool's input schema. Answered as a tool execution error
    (``isError: true``) the model can correct, not a protocol error (MCP tools: "Tool Execution
    Errors" include invalid input)."""


class ToolModuleError(Exception):
    """A configured tool module could not be imported (the message says which and why)."""


def load_tool_modules(modules: Iterable[str]) -> None:
    """Import the modules whose ``@tool`` functions make up the server.

    The current directory is searched too (as ``celery -A`` does), so a project's own modules
    load when the command runs from the project's root.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ToolModuleError(f"cannot import the tool module {module!r}: {exc}") from exc
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)
