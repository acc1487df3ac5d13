"""OpenTelemetry spans for every stage, carrying IDs, ranks, scores and timings only.

The only module importing the OpenTelemetry SDK. Attributes go through `_clean`, which
accepts numbers, booleans and identifier strings and refuses anything longer or with
spaces, so a query or a passage cannot slip into a span by mistake: an attribute that
looks like prose is replaced by a marker and counted, never exported.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.export import SpanExporter as SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode
from opentelemetry.trace import Span as Span

from gateway.settings import Settings
from gateway.telemetry.audit import note
from gateway.telemetry.stages import StageClock

# IDs may hold letters, digits and -_.:@/+=% (chunk IDs, URL-encoded names), nothing else.
_ID = re.compile(r"^[\w\-.:@/+=%]{0,200}$")
REDACTED = "<redacted>"
INHERITED = frozenset({"gateway.policy_version"})  # request attributes every stage repeats
AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


def _clean_one(value: Any) -> Any:
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if _ID.match(value) else REDACTED
    return REDACTED


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, list | tuple):
            out[key] = [_clean_one(v) for v in value]
        else:
            out[key] = _clean_one(value)
    return out


class Tracing:
    """A tracer provider owned by one app; `exporter` overrides the settings (tests)."""

    def __init__(self, settings: Settings, exporter: SpanExporter | None = None) -> None:
        resource = Resource.create({"service.name": settings.otel_service_name})
        self.provider = TracerProvider(resource=resource)
        processors: list[SpanProcessor] = (
            [SimpleSpanProcessor(exporter)]
            if exporter is not None
            else [BatchSpanProcessor(e) for e in _exporters_from(settings)]
        )
        for processor in processors:
            self.provider.add_span_processor(processor)
        # With nowhere to send spans, a request gets a span that records nothing: it still
        # names a fresh trace ID for the response and the logs, without the ten stage spans
        # and their attributes that nobody would receive (0.2-0.3 ms a request).
        self.exporting = bool(processors)
        self._ids = RandomIdGenerator()
        self.tracer = self.provider.get_tracer("gateway")

    @contextmanager
    def request(self, name: str, clock: StageClock, **attributes: Any) -> Iterator[Span]:
        """The request span, opened back at the clock's start (before authentication), with
        every stage on the clock as a child, recorded even when the request fails. Children
        repeat the policy version, so any one span says which policy decided.

        The span is never made "current": its children name it as parent explicitly, so a
        streamed answer may end it in the task that sends the stream's last event."""
        if not self.exporting:
            context = SpanContext(
                self._ids.generate_trace_id(), self._ids.generate_span_id(), is_remote=False
            )
            unrecorded = NonRecordingSpan(context)
            note(trace_id=self.trace_id(unrecorded))
            yield unrecorded
            return
        inherited = {k: v for k, v in attributes.items() if k in INHERITED}
        span = self.tracer.start_span(
            name,
            attributes=_clean(attributes),
            start_time=clock.started_ns,
            record_exception=False,
            set_status_on_exception=False,
        )
        parent = trace.set_span_in_context(span)
        note(trace_id=self.trace_id(span))
        try:
            yield span
        except Exception as exc:
            # No exception text (messages may quote input): its type and code only.
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute("gateway.error", type(exc).__name__)
            code = getattr(exc, "code", None)
            if isinstance(code, str):
                span.set_attribute("gateway.error_code", code)
            raise
        finally:
            for stage, when in clock.stages.items():
                own = clock.attributes.get(stage, {})
                child = self.tracer.start_span(
                    stage,
                    context=parent,
                    attributes=_clean({**inherited, **own}),
                    start_time=when.start_ns,
                )
                child.end(end_time=when.end_ns)
            span.end()

    @staticmethod
    def set(span: Span, **attributes: Any) -> None:
        span.set_attributes(_clean(attributes))

    @staticmethod
    def trace_id(span: Span) -> str:
        return format(span.get_span_context().trace_id, "032x")

    def shutdown(self) -> None:
        self.provider.shutdown()


def _exporters_from(settings: Settings) -> list[SpanExporter]:
    """The exporters OTEL_TRACES_EXPORTER names (validated by Settings)."""
    kinds = settings.trace_exporters
    exporters: list[SpanExporter] = []
    if "console" in kinds:
        exporters.append(ConsoleSpanExporter())
    if "otlp" in kinds:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otel_exporter_otlp_traces_endpoint or (
            settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
        )
        exporters.append(OTLPSpanExporter(endpoint=endpoint))
    return exporters
