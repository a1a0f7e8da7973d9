"""Keeps witness data (activations, attention scores) out of OTLP unless opted in.

The filter wraps the network/file span exporters. Witness events are a prover's
secret, so they are removed before encoding; the local Rerun exporter is not wrapped
and may show them when capture is enabled.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.semconv import WITNESS_EVENTS


def strip_witness(span: ReadableSpan) -> ReadableSpan:
    """The span without witness events (the same object when it has none)."""
    events = span.events
    if not events or not any(e.name in WITNESS_EVENTS for e in events):
        return span
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes,
        events=tuple(e for e in events if e.name not in WITNESS_EVENTS),
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class WitnessFilter(SpanExporter):
    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.withheld_events = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        out = [strip_witness(s) for s in spans]
        withheld = sum(len(a.events) - len(b.events) for a, b in zip(spans, out, strict=True))
        if withheld:
            with self._lock:
                self.withheld_events += withheld
        return self.inner.export(out)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)
