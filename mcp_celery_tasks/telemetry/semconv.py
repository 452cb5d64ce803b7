"""The OpenTelemetry MCP semantic conventions for the server side (Development status,
open-telemetry/semantic-conventions-genai ``docs/gen-ai/mcp.md``): one SERVER span per request,
named ``{mcp.method.name} {target}`` (``tools/call train_model``), and the
``mcp.server.operation.duration`` histogram (Prometheus: ``mcp_server_operation_duration_seconds``).

Attributes: ``mcp.method.name``, ``jsonrpc.request.id``, ``mcp.protocol.version``,
``mcp.session.id`` (2025-11-25 sessions), ``network.transport``/``network.protocol.name``, and for
``tools/call`` ``gen_ai.tool.name`` and ``gen_ai.operation.name = execute_tool``. A JSON-RPC error
sets ``error.type`` and ``rpc.response.status_code`` to its code; a tool result with ``isError``
sets ``error.type = tool_error`` (a failed tool answers a successful JSON-RPC response, which would
otherwise look healthy). The trace context comes from ``params._meta`` (``traceparent``,
``tracestate``: the conventions say servers SHOULD take it from there); the HTTP request's own
context, if any, becomes a link. Task ids never become attributes (bearer-like); job ids do, in
the worker.

Only names of registered tools go into span names and metric labels: a client's unknown name
would otherwise mint a new series per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from mcp_celery_tasks.telemetry import metrics
from mcp_celery_tasks.telemetry.tracing import tracer

__all__ = ["Operation", "current", "end", "failed", "start"]


@dataclass(slots=True)
class Operation:
    """One request's span, with what its duration metric is labelled by."""

    span: Span
    method: str
    tool: str | None


def start(
    method: str,
    params: Mapping[str, Any],
    *,
    tool: str | None,
    request_id: object,
    protocol_version: str | None,
    session_id: str | None,
) -> Operation:
    """The request's SERVER span, started (the caller makes it current while the handler runs).
    ``tool``: the registered tool a ``tools/call`` names (None for another method or an unknown
    name)."""
    attributes: dict[str, Any] = {
        "mcp.method.name": method,
        "network.transport": "tcp",
        "network.protocol.name": "http",
    }
    if request_id is not None:
        attributes["jsonrpc.request.id"] = str(request_id)
    if protocol_version:
        attributes["mcp.protocol.version"] = protocol_version
    if session_id:
        attributes["mcp.session.id"] = session_id
    if tool is not None:
        attributes["gen_ai.tool.name"] = tool
        attributes["gen_ai.operation.name"] = "execute_tool"
    meta = params.get("_meta")
    carrier = {
        key: value
        for key in ("traceparent", "tracestate")
        if isinstance(meta, dict) and isinstance(value := meta.get(key), str) and len(value) <= 512
    }
    context, links = None, []
    if "traceparent" in carrier:
        context = propagate.extract(carrier)
        outer = trace.get_current_span().get_span_context()
        if outer.is_valid:
            links.append(Link(outer))  # the HTTP server span of the same request
    name = f"{method} {tool}" if tool is not None else method
    span = tracer.start_span(name, context=context, kind=SpanKind.SERVER, attributes=attributes, links=links)
    return Operation(span, method, tool)


def current(operation: Operation) -> AbstractContextManager[Span]:
    """The span as the current one (a task created meanwhile carries it to its job), not ended."""
    return trace.use_span(operation.span, end_on_exit=False)


def failed(span: Span, code: int) -> None:
    """The request ended in a JSON-RPC error."""
    span.set_attribute("error.type", str(code))
    span.set_attribute("rpc.response.status_code", str(code))
    span.set_status(Status(StatusCode.ERROR))


def end(operation: Operation, body: Mapping[str, Any] | None, elapsed_s: float, *, counted: bool) -> None:
    """End the span from the response body, and observe the operation's duration."""
    span = operation.span
    error_type = ""
    error = body.get("error") if body is not None else None
    result = body.get("result") if body is not None else None
    if isinstance(error, Mapping):
        code = error.get("code")
        error_type = str(code)
        failed(span, code if isinstance(code, int) else 0)
    elif isinstance(result, Mapping) and result.get("isError") is True:
        error_type = "tool_error"
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, "the tool reported an error"))
    if counted:
        _series(operation.method, operation.tool or "", error_type).observe(elapsed_s)
    span.end()


_SERIES: dict[tuple[str, str, str], Any] = {}
_SERIES_CACHED = 1024


def _series(method: str, tool: str, error_type: str) -> Any:
    """The histogram of one method, tool and error (``labels()`` takes a lock each call)."""
    key = (method, tool, error_type)
    series = _SERIES.get(key)
    if series is None:
        series = metrics.operation_seconds.labels(method, tool, error_type)
        if len(_SERIES) < _SERIES_CACHED:
            _SERIES[key] = series
    return series
