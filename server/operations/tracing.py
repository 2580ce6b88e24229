"""Optional OpenTelemetry traces.

A span per request continues the caller's trace (W3C ``traceparent`` in gRPC metadata or HTTP headers)
and carries the request ID; its children are each sentence's ``queue`` wait, ``encode`` (its batch's
encoder call and join) and ``decode`` (its decoder steps), recorded when the sentence finishes with the
times the scheduler noted, and the request's ``detokenize``. Traces are off unless an exporter is
configured: ``OTEL_EXPORTER_OTLP_ENDPOINT`` set and the ``tracing`` extra installed (the OpenTelemetry
SDK and its OTLP exporter; ``OTEL_SERVICE_NAME`` names the service). Otherwise the API's no-op tracer
makes every call here nearly free.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager

from opentelemetry import propagate, trace

log = logging.getLogger(__name__)
tracer = trace.get_tracer("translation-server")


def configure_from_environment() -> bool:
    """Send spans to the OTLP endpoint named by the environment, if any; whether traces are on."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the tracing extra is not installed: no traces")
        return False
    name = os.environ.get("OTEL_SERVICE_NAME", "translation-server")
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("traces go to %s as %s", os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], name)
    return True


def request_span(name: str, carrier: Mapping[str, str], request_id: str) -> trace.Span:
    """The request's span (the caller ends it), a child of the caller's span when ``carrier`` (metadata,
    headers) has one. Not made current: a streaming handler's context does not survive its yields."""
    context = propagate.extract(carrier)
    return tracer.start_span(name, context=context, kind=trace.SpanKind.SERVER, attributes={"request.id": request_id})


def child_span(parent: trace.Span, name: str) -> AbstractContextManager[trace.Span]:
    return tracer.start_as_current_span(name, context=trace.set_span_in_context(parent))


def _wall_ns(monotonic: float, now_monotonic: float, now_ns: int) -> int:
    return now_ns - int((now_monotonic - monotonic) * 1e9)


def record_sentences(parent: trace.Span, timings: Iterable[tuple[int, tuple[float, float, float, float]]]) -> None:
    """Child spans of ``parent`` for each sentence the engine translated: (index, (enqueued, joined, encoded,
    finished) as time.monotonic() instants)."""
    if not parent.is_recording():
        return
    context = trace.set_span_in_context(parent)
    now, now_ns = time.monotonic(), time.time_ns()
    for index, stamps in timings:
        enqueued, joined, encoded, finished = (_wall_ns(t, now, now_ns) for t in stamps)
        phases = (("queue", enqueued, joined), ("encode", joined, encoded), ("decode", encoded, finished))
        for name, start, end in phases:
            span = tracer.start_span(name, context=context, start_time=start, attributes={"sentence": index})
            span.end(end_time=end)
