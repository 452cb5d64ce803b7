"""OpenTelemetry traces (the home of ``opentelemetry``, with ``semconv``): a ``tools/call``
request's span (``semconv``) continues in the Celery job through the message headers (W3C
``traceparent``) as ``execute_tool <tool>``, with spans for the claim, each input wait and the
outcome write. Without a configured exporter every call is a no-op.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context

from mcp_celery_tasks.settings import Settings

__all__ = ["configure", "extract", "inject", "trace", "tracer"]

logger = logging.getLogger("mcp_celery_tasks.tracing")

tracer = trace.get_tracer("mcp_celery_tasks")


def inject() -> dict[str, str]:
    """The current trace context as headers for a Celery message."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract(headers: Mapping[str, Any] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def configure(settings: Settings, service: str) -> None:
    """Install an SDK tracer provider when an exporter is configured (optional dependency)."""
    if not (settings.trace_file or settings.otlp_endpoint):
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        logger.warning("tracing is configured but opentelemetry-sdk is not installed")
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if settings.trace_file:
        provider.add_span_processor(SimpleSpanProcessor(_FileExporter(settings.trace_file)))  # type: ignore[arg-type]
    if settings.otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            logger.warning("MCP_TASKS_OTLP_ENDPOINT needs opentelemetry-exporter-otlp-proto-http")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    trace.set_tracer_provider(provider)


class _FileExporter:
    """Spans as JSON lines appended to a file (any number of processes may share it)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = []
        for span in spans:
            parent = span.parent
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": f"{span.context.trace_id:032x}",
                        "span_id": f"{span.context.span_id:016x}",
                        "parent_id": f"{parent.span_id:016x}" if parent else None,
                        "service": span.resource.attributes.get("service.name"),
                        "kind": span.kind.name,
                        "links": [f"{link.context.span_id:016x}" for link in span.links],
                        "status": span.status.status_code.name,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "attributes": dict(span.attributes or {}),
                    }
                )
            )
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
