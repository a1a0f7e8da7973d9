"""Keeps witness data (activations, attention scores) out of OTLP unless opted in.

The filter wraps every span exporter that ``configure()`` builds or is given, so that
witness events (a prover's secret) are removed before encoding, whatever the sink. Only
the Rerun exporter ``configure()`` builds itself, and exporters the caller marks with
:func:`local` (an explicit opt-in: the exporter keeps data in this process), see them
unfiltered. Each filter counts what it withheld for its own sink; those events are
never counted as exported.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList

from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.sdk_fields import (
    event_count,
    event_names,
    span_events,
    span_events_unread,
)
from otel_proofscope.semconv import WITNESS_EVENTS


def strip_witness(span: ReadableSpan) -> ReadableSpan:
    """The span without witness events (the same object when it has none)."""
    # Every span of the OTLP route passes here, on an export thread that shares the GIL
    # with the prover: the names are read without copying the events (or building a
    # round's), and tested at once.
    events = span_events_unread(span)
    if not event_count(span) or WITNESS_EVENTS.isdisjoint(event_names(events)):
        return span
    # The copy carries the original drop count: it must still say how many events the
    # SDK's limit dropped (droppedEventsCount); the attribute container is passed as is
    # for the same reason. A layer's round records stay records, their fields shared
    # with the original's other readers (capture_witness puts witness events in every
    # layer: building all its rounds here would be paid again by the Rerun view).
    kept: Any = events.without(WITNESS_EVENTS) if type(events) is DeferredEvents else None
    if kept is None:
        kept = BoundedList(None)
        kept.extend([e for e in span_events(span) if e.name not in WITNESS_EVENTS])
        kept.dropped = span.dropped_events
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=getattr(span, "_attributes", span.attributes),
        events=kept,  # type: ignore[arg-type]
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class Local(SpanExporter):
    """An exporter the caller declared local (see :func:`local`); delegates everything."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def local(exporter: SpanExporter) -> Local:
    """Mark ``exporter`` as keeping spans inside this process (an in-memory exporter in a
    test, a local view): ``configure(span_exporters=[(name, local(exp))])`` then hands it
    witness events when they are captured. Anything else passed to ``configure`` is
    filtered, since it may leave the process."""
    return exporter if isinstance(exporter, Local) else Local(exporter)


class WitnessFilter(SpanExporter):
    def __init__(self, inner: SpanExporter, sink: str = "") -> None:
        self.inner = inner
        self.sink = sink
        self.withheld_events = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        out = [strip_witness(s) for s in spans]
        withheld = sum(event_count(a) - event_count(b)
                       for a, b in zip(spans, out, strict=True) if a is not b)
        if withheld:
            with self._lock:
                self.withheld_events += withheld
        return self.inner.export(out)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)
