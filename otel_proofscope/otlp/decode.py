"""Pure translation of decoded OTLP requests into the OpenTelemetry SDK's data model.

Received spans become :class:`opentelemetry.sdk.trace.ReadableSpan` and received metrics
an SDK :class:`MetricsData`, so any SDK exporter (the Rerun exporters, an OTLP exporter, an
in-memory exporter in a test) consumes them unchanged. No I/O happens here.

A span's events are not converted here: they become a
:class:`~otel_proofscope.otlp.received_events.ReceivedEvents`, read from the protobuf
only as far as a reader asks (issue 29: building an SDK ``Event`` and reading every
attribute of every received round event was half of ``proofscope serve``'s CPU). Span
attributes are a plain dict unless something was dropped.

Items that cannot be represented faithfully (a span whose ids have the wrong length, a
histogram whose bucket counts do not match its bounds, a Summary metric, which the SDK has
no type for) are rejected one by one and reported back as OTLP partial success, never
guessed at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope as SdkScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState, _is_valid_pair

from otel_proofscope.otlp.pb_values import attributes, attributes_counted
from otel_proofscope.otlp.received_events import ReceivedEvents
from otel_proofscope.otlp.sdk_fields import bounded_attributes

#: How many distinct rejection messages a batch keeps (the partial-success message).
MAX_ERROR_MESSAGES = 5

# OTLP SpanKind (0 = unspecified) → SDK SpanKind (no "unspecified": INTERNAL, as the SDK does)
_SPAN_KIND = {
    trace_pb2.Span.SPAN_KIND_UNSPECIFIED: SpanKind.INTERNAL,
    trace_pb2.Span.SPAN_KIND_INTERNAL: SpanKind.INTERNAL,
    trace_pb2.Span.SPAN_KIND_SERVER: SpanKind.SERVER,
    trace_pb2.Span.SPAN_KIND_CLIENT: SpanKind.CLIENT,
    trace_pb2.Span.SPAN_KIND_PRODUCER: SpanKind.PRODUCER,
    trace_pb2.Span.SPAN_KIND_CONSUMER: SpanKind.CONSUMER,
}
_STATUS = {
    trace_pb2.Status.STATUS_CODE_UNSET: StatusCode.UNSET,
    trace_pb2.Status.STATUS_CODE_OK: StatusCode.OK,
    trace_pb2.Status.STATUS_CODE_ERROR: StatusCode.ERROR,
}
_TEMPORALITY = {t.value: t for t in AggregationTemporality}
_MAX_TRACESTATE_MEMBERS = 32
_NO_TRACE_STATE = TraceState()
# Shared, as the SDK shares its own default Status: a Status is never changed once made.
_PLAIN_STATUS = {c: Status(c) for c in (StatusCode.UNSET, StatusCode.OK)}

# Span.flags / Link.flags: bits 0-7 W3C trace flags, bit 8 "remote known", bit 9 "remote".
_FLAG_REMOTE_KNOWN = 0x100
_FLAG_REMOTE = 0x200


class Rejected(ValueError):
    """One item that cannot be converted; the message says why."""


@dataclass
class _Tally:
    rejected: int = 0
    messages: list[str] = field(default_factory=list)

    def reject(self, n: int, message: str) -> None:
        self.rejected += n
        if message not in self.messages and len(self.messages) < MAX_ERROR_MESSAGES:
            self.messages.append(message)

    @property
    def error_message(self) -> str:
        return "; ".join(self.messages)


@dataclass(frozen=True)
class SpanBatch:
    """Result of :func:`spans_from_request`."""

    spans: list[ReadableSpan]
    rejected: int
    error_message: str


@dataclass(frozen=True)
class MetricBatch:
    """Result of :func:`metrics_from_request`; ``points`` counts accepted data points."""

    data: MetricsData
    points: int
    rejected: int
    error_message: str


# ── attributes ───────────────────────────────────────────────────────────────────────


def _bounded(kvs: Sequence[KeyValue], dropped: int) -> BoundedAttributes:
    # BoundedAttributes carries the sender's dropped count through to SDK exporters; keys
    # that OTel forbids (empty) are added to it rather than lost without a trace.
    # Values read by pb_values are valid attribute values by construction.
    values, empty = attributes_counted(kvs)
    return bounded_attributes(values, int(dropped) + empty)


def _span_attributes(kvs: Sequence[KeyValue], dropped: int) -> dict[str, Any] | BoundedAttributes:
    # A plain dict when nothing was dropped (ReadableSpan.dropped_attributes is then 0
    # either way): a BoundedAttributes per span was ~2 µs, a twentieth of a foreign span.
    values, empty = attributes_counted(kvs)
    if not dropped and not empty:
        return values
    return bounded_attributes(values, int(dropped) + empty)


def resource(pb: PbResource, schema_url: str) -> Resource:
    return Resource(attributes(pb.attributes), schema_url or None)


def scope(pb: InstrumentationScope, schema_url: str) -> SdkScope:
    return SdkScope(pb.name, pb.version or None, schema_url or None,
                    attributes(pb.attributes) or None)


# ── ids ──────────────────────────────────────────────────────────────────────────────


def _trace_id(raw: bytes, what: str) -> int:
    if len(raw) != 16:
        raise Rejected(f"{what} must be 16 bytes, got {len(raw)}")
    value = int.from_bytes(raw, "big")
    if value == 0:
        raise Rejected(f"{what} is all zeros")
    return value


def _span_id(raw: bytes, what: str) -> int:
    if len(raw) != 8:
        raise Rejected(f"{what} must be 8 bytes, got {len(raw)}")
    value = int.from_bytes(raw, "big")
    if value == 0:
        raise Rejected(f"{what} is all zeros")
    return value


def _trace_state(header: str) -> TraceState:
    if not header:  # most spans: one shared empty state (a TraceState is immutable)
        return _NO_TRACE_STATE
    # Parsed here rather than by TraceState.from_header, which logs a warning per bad
    # member: a sender must not be able to flood our log. An invalid header is dropped
    # whole, as W3C Trace Context asks.
    entries: dict[str, str] = {}
    for member in header.split(","):
        member = member.strip()
        if not member:
            continue
        key, sep, value = member.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key in entries or not _is_valid_pair(key, value):
            return TraceState()
        entries[key] = value
    if len(entries) > _MAX_TRACESTATE_MEMBERS:
        return TraceState()
    return TraceState(list(entries.items()))


def _is_remote(flags: int) -> bool:
    return bool(flags & _FLAG_REMOTE_KNOWN) and bool(flags & _FLAG_REMOTE)


# ── spans ────────────────────────────────────────────────────────────────────────────


def span(pb: trace_pb2.Span, res: Resource, sc: SdkScope) -> ReadableSpan:
    """One OTLP span as a ReadableSpan; raises :class:`Rejected` for malformed ids."""
    trace_id = _trace_id(pb.trace_id, "trace_id")
    ctx = SpanContext(trace_id, _span_id(pb.span_id, "span_id"), is_remote=False,
                      trace_flags=TraceFlags(pb.flags & 0xFF),
                      trace_state=_trace_state(pb.trace_state))
    parent = None
    if pb.parent_span_id:
        parent = SpanContext(trace_id, _span_id(pb.parent_span_id, "parent_span_id"),
                             is_remote=_is_remote(pb.flags),
                             trace_flags=TraceFlags(pb.flags & 0xFF))
    # An empty tuple where there is nothing (nor a drop count) to hold: a BoundedList
    # makes a deque and a lock, ~1 µs each, twice a span (events, links).
    links: Sequence[Link] = ()
    if pb.links or pb.dropped_links_count:
        bounded: BoundedList[Link] = BoundedList(None)
        for i, link in enumerate(pb.links):
            link_ctx = SpanContext(_trace_id(link.trace_id, f"links[{i}].trace_id"),
                                   _span_id(link.span_id, f"links[{i}].span_id"),
                                   is_remote=_is_remote(link.flags),
                                   trace_flags=TraceFlags(link.flags & 0xFF),
                                   trace_state=_trace_state(link.trace_state))
            bounded.append(Link(link_ctx, _bounded(link.attributes,
                                                   link.dropped_attributes_count)))
        bounded.dropped = int(pb.dropped_links_count)
        links = bounded
    code = _STATUS.get(pb.status.code)
    if code is None:
        raise Rejected(f"unknown status code {pb.status.code}")
    status = _PLAIN_STATUS.get(code) if code is not StatusCode.ERROR else None
    if status is None:
        status = Status(code, pb.status.message if code is StatusCode.ERROR else None)
    kind = _SPAN_KIND.get(pb.kind)
    if kind is None:
        raise Rejected(f"unknown span kind {pb.kind}")
    # Events are read when a reader asks, and only as far as it asks (received_events);
    # copied out of the request only once the span is known to be accepted.
    events: Sequence[Event] = ()
    if pb.events:
        events = ReceivedEvents.of_span(pb)
    elif pb.dropped_events_count:
        empty: BoundedList[Event] = BoundedList(None)
        empty.dropped = int(pb.dropped_events_count)
        events = empty
    return ReadableSpan(
        name=pb.name, context=ctx, parent=parent, resource=res,
        attributes=_span_attributes(pb.attributes, pb.dropped_attributes_count),
        events=events, links=links, kind=kind, status=status,
        start_time=pb.start_time_unix_nano, end_time=pb.end_time_unix_nano,
        instrumentation_scope=sc)


def spans_from_request(request: ExportTraceServiceRequest) -> SpanBatch:
    """Every span of an OTLP trace export request, with a count of those rejected."""
    out: list[ReadableSpan] = []
    tally = _Tally()
    for rs in request.resource_spans:
        res = resource(rs.resource, rs.schema_url)
        for ss in rs.scope_spans:
            sc = scope(ss.scope, ss.schema_url)
            for pb in ss.spans:
                try:
                    out.append(span(pb, res, sc))
                except Rejected as exc:
                    tally.reject(1, f"span rejected: {exc}")
    return SpanBatch(out, tally.rejected, tally.error_message)


# ── metrics ──────────────────────────────────────────────────────────────────────────


def _exemplars(pbs: Sequence[metrics_pb2.Exemplar]) -> list[Exemplar]:
    out: list[Exemplar] = []
    for ex in pbs:
        value = _number(ex, "exemplar")
        out.append(Exemplar(
            attributes(ex.filtered_attributes), value, ex.time_unix_nano,
            span_id=_span_id(ex.span_id, "exemplar span_id") if ex.span_id else None,
            trace_id=_trace_id(ex.trace_id, "exemplar trace_id") if ex.trace_id else None))
    return out


def _number(pb: metrics_pb2.NumberDataPoint | metrics_pb2.Exemplar, what: str) -> int | float:
    which = pb.WhichOneof("value")
    if which == "as_int":
        return int(pb.as_int)
    if which == "as_double":
        return float(pb.as_double)
    raise Rejected(f"{what} has no value")


def _optional(pb: Any, name: str) -> float:
    # Optional sum/min/max the sender left out: NaN, never an invented 0.
    return float(getattr(pb, name)) if pb.HasField(name) else math.nan


def _number_point(pb: metrics_pb2.NumberDataPoint) -> NumberDataPoint:
    return NumberDataPoint(attributes(pb.attributes), pb.start_time_unix_nano,
                           pb.time_unix_nano, _number(pb, "data point"), _exemplars(pb.exemplars))


def _histogram_point(pb: metrics_pb2.HistogramDataPoint) -> HistogramDataPoint:
    counts, bounds = list(pb.bucket_counts), list(pb.explicit_bounds)
    if counts and len(counts) != len(bounds) + 1:
        raise Rejected(f"histogram has {len(counts)} bucket counts for {len(bounds)} bounds")
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise Rejected("histogram bounds are not strictly increasing")
    return HistogramDataPoint(attributes(pb.attributes), pb.start_time_unix_nano,
                              pb.time_unix_nano, pb.count, _optional(pb, "sum"), counts, bounds,
                              _optional(pb, "min"), _optional(pb, "max"),
                              _exemplars(pb.exemplars))


def _exp_point(pb: metrics_pb2.ExponentialHistogramDataPoint) -> ExponentialHistogramDataPoint:
    return ExponentialHistogramDataPoint(
        attributes(pb.attributes), pb.start_time_unix_nano, pb.time_unix_nano, pb.count,
        _optional(pb, "sum"), pb.scale, pb.zero_count,
        Buckets(pb.positive.offset, list(pb.positive.bucket_counts)),
        Buckets(pb.negative.offset, list(pb.negative.bucket_counts)),
        pb.flags, _optional(pb, "min"), _optional(pb, "max"), _exemplars(pb.exemplars))


def _temporality(value: int) -> AggregationTemporality:
    try:
        return _TEMPORALITY[value]
    except KeyError:
        raise Rejected(f"unknown aggregation temporality {value}") from None


def _points(pbs: Sequence[Any], convert: Any, tally: _Tally, name: str) -> list[Any]:
    out = []
    for pb in pbs:
        try:
            out.append(convert(pb))
        except Rejected as exc:
            tally.reject(1, f"metric {name!r}: {exc}")
    return out


def metric(pb: metrics_pb2.Metric, tally: _Tally) -> Metric | None:
    """One OTLP metric (its valid points); ``None`` when nothing of it survives."""
    kind = pb.WhichOneof("data")
    data: Gauge | Sum | Histogram | ExponentialHistogram
    try:
        if kind == "gauge":
            data = Gauge(_points(pb.gauge.data_points, _number_point, tally, pb.name))
        elif kind == "sum":
            temporality = _temporality(pb.sum.aggregation_temporality)
            data = Sum(_points(pb.sum.data_points, _number_point, tally, pb.name),
                       temporality, pb.sum.is_monotonic)
        elif kind == "histogram":
            temporality = _temporality(pb.histogram.aggregation_temporality)
            data = Histogram(_points(pb.histogram.data_points, _histogram_point, tally, pb.name),
                             temporality)
        elif kind == "exponential_histogram":
            eh = pb.exponential_histogram
            temporality = _temporality(eh.aggregation_temporality)
            data = ExponentialHistogram(_points(eh.data_points, _exp_point, tally, pb.name),
                                        temporality)
        elif kind == "summary":
            tally.reject(len(pb.summary.data_points),
                         "Summary metrics are not supported (the SDK has no Summary type)")
            return None
        else:
            return None
    except Rejected as exc:
        tally.reject(len(_all_points(pb)), f"metric {pb.name!r}: {exc}")
        return None
    if not data.data_points:
        return None
    return Metric(pb.name, pb.description or None, pb.unit or None, data)


def _all_points(pb: metrics_pb2.Metric) -> Sequence[Any]:
    kind = pb.WhichOneof("data")
    return getattr(pb, kind).data_points if kind else ()


def metrics_from_request(request: ExportMetricsServiceRequest) -> MetricBatch:
    """Every metric of an OTLP metrics export request as SDK MetricsData."""
    tally = _Tally()
    points = 0
    resource_metrics: list[ResourceMetrics] = []
    for rm in request.resource_metrics:
        scope_metrics: list[ScopeMetrics] = []
        for sm in rm.scope_metrics:
            converted = [m for m in (metric(pb, tally) for pb in sm.metrics) if m is not None]
            if converted:
                points += sum(len(m.data.data_points) for m in converted)
                scope_metrics.append(ScopeMetrics(scope(sm.scope, sm.schema_url), converted,
                                                  sm.schema_url))
        if scope_metrics:
            resource_metrics.append(ResourceMetrics(resource(rm.resource, rm.schema_url),
                                                    scope_metrics, rm.schema_url))
    return MetricBatch(MetricsData(resource_metrics), points, tally.rejected, tally.error_message)
