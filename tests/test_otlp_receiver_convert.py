"""The pure OTLP → SDK translation: round trips through the official encoders."""

from __future__ import annotations

import math

import pytest
from opentelemetry.exporter.otlp.json.common.metrics_encoder import (
    encode_metrics as encode_metrics_json,
)
from opentelemetry.exporter.otlp.json.common.trace_encoder import (
    encode_spans as encode_spans_json,
)
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Gauge,
    Histogram,
    InMemoryMetricReader,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.integrations.otlp_receiver import codec
from otel_proofscope.otlp import decode as convert
from otel_proofscope.semconv import Attr, EventName, SpanName


@pytest.fixture()
def sdk_spans() -> list[ReadableSpan]:
    """A real proof (ProofTracer) plus a span with every OTLP feature: links, kinds,
    status, complex attributes, dropped counts."""
    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "prover", "k": 3}),
                        span_limits=SpanLimits(max_events=2, max_span_attributes=8))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    pt = ProofTracer(tracer_provider=tp)
    with pt.proof(system="gkr", layers=1, input_shape=[1, 4]) as proof:
        with pt.layer(index=0, kind="MatMul", rounds=2, claim_initial=(1, 2, 3, 4)):
            pt.sumcheck_round(0, [1, 2, 3], 7)
            pt.sumcheck_round(1, [4, 5, 6], 8)
        proof.set_result(verified=True, size=123)
    tracer = tp.get_tracer("feature.test", "1.2.3", schema_url="https://schema/1")
    with tracer.start_as_current_span("other", kind=SpanKind.CLIENT) as s:
        link_ctx = s.get_span_context()
    with tracer.start_as_current_span(
            "featureful", kind=SpanKind.PRODUCER, links=[Link(link_ctx, {"why": "retry"})],
            attributes={"b": True, "i": -5, "f": 2.5, "s": "x", "ai": [1, 2], "as": ["a"],
                        "by": b"\x00\xff", "kv": {"inner": 1, "deep": {"x": "y"}}}) as s:
        for i in range(4):  # two beyond the limit → dropped_events == 2
            s.add_event(f"e{i}", {"n": i})
        for i in range(6):
            s.set_attribute(f"extra{i}", i)  # beyond 8 attributes → dropped
        s.set_status(Status(StatusCode.ERROR, "boom"))
    tp.shutdown()
    return list(mem.get_finished_spans())


def _same_span(a: ReadableSpan, b: ReadableSpan) -> None:
    assert b.name == a.name
    assert b.context.trace_id == a.context.trace_id
    assert b.context.span_id == a.context.span_id
    # (the official encoder does not put W3C trace flags on the wire; see the flags test)
    assert (b.parent.span_id if b.parent else None) == (a.parent.span_id if a.parent else None)
    assert b.kind == a.kind
    assert b.start_time == a.start_time and b.end_time == a.end_time
    assert b.status.status_code == a.status.status_code
    assert b.status.description == a.status.description
    norm = {k: tuple(v) if isinstance(v, list) else v for k, v in (a.attributes or {}).items()}
    assert dict(b.attributes or {}) == norm
    assert b.dropped_attributes == a.dropped_attributes
    assert b.dropped_events == a.dropped_events
    assert [(e.name, e.timestamp, dict(e.attributes or {})) for e in b.events] == [
        (e.name, e.timestamp, {k: tuple(v) if isinstance(v, list) else v
                               for k, v in (e.attributes or {}).items()}) for e in a.events]
    assert [(lk.context.span_id, dict(lk.attributes or {})) for lk in b.links] == [
        (lk.context.span_id, dict(lk.attributes or {})) for lk in a.links]
    assert dict(b.resource.attributes) == dict(a.resource.attributes)
    assert b.instrumentation_scope is not None and a.instrumentation_scope is not None
    assert b.instrumentation_scope.name == a.instrumentation_scope.name
    assert b.instrumentation_scope.version == a.instrumentation_scope.version
    assert b.instrumentation_scope.schema_url == a.instrumentation_scope.schema_url


def test_protobuf_round_trip_preserves_every_field(sdk_spans: list[ReadableSpan]) -> None:
    request = encode_spans(sdk_spans)
    batch = convert.spans_from_request(request)
    assert batch.rejected == 0 and batch.error_message == ""
    by_id = {s.context.span_id: s for s in batch.spans}
    assert len(by_id) == len(sdk_spans) == 4
    for original in sdk_spans:
        _same_span(original, by_id[original.context.span_id])
    featureful = next(s for s in batch.spans if s.name == "featureful")
    assert featureful.attributes["kv"] == {"inner": 1, "deep": {"x": "y"}}
    assert featureful.attributes["by"] == b"\x00\xff"
    assert featureful.dropped_events == 2 and featureful.dropped_attributes > 0
    layer = next(s for s in batch.spans if s.name == SpanName.LAYER)
    assert layer.attributes[Attr.CLAIM_INITIAL] == "(1,2,3,4)"
    assert [e.attributes[Attr.CLAIM] for e in layer.events
            if e.name == EventName.SUMCHECK_ROUND] == ["7", "8"]


def test_official_otlp_json_decodes_to_the_same_spans(sdk_spans: list[ReadableSpan]) -> None:
    body = encode_spans_json(sdk_spans).to_json().encode()
    request = codec.decode(codec.Signal.TRACES, body, codec.Encoding.JSON)
    from_json = convert.spans_from_request(request).spans
    from_proto = convert.spans_from_request(encode_spans(sdk_spans)).spans
    assert len(from_json) == len(from_proto) == len(sdk_spans)
    for a, b in zip(from_proto, from_json, strict=True):
        _same_span(a, b)


def _span_pb(**overrides: object) -> trace_pb2.Span:
    fields: dict[str, object] = {"trace_id": b"\x01" * 16, "span_id": b"\x02" * 8,
                                 "name": "ok", "start_time_unix_nano": 1,
                                 "end_time_unix_nano": 2}
    fields.update(overrides)
    return trace_pb2.Span(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bad", "reason"), [
    ({"trace_id": b"\x01" * 15}, "trace_id must be 16 bytes"),
    ({"trace_id": b"\x00" * 16}, "trace_id is all zeros"),
    ({"span_id": b""}, "span_id must be 8 bytes"),
    ({"span_id": b"\x00" * 8}, "span_id is all zeros"),
    ({"parent_span_id": b"\x03" * 7}, "parent_span_id must be 8 bytes"),
    ({"kind": 42}, "unknown span kind 42"),
    ({"links": [trace_pb2.Span.Link(trace_id=b"\x01" * 16, span_id=b"\x01")]},
     "links[0].span_id must be 8 bytes"),
])
def test_malformed_spans_are_rejected_one_by_one(bad: dict[str, object], reason: str) -> None:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.append(_span_pb())
    spans.append(_span_pb(**bad))
    spans.append(_span_pb(span_id=b"\x04" * 8))
    batch = convert.spans_from_request(request)
    assert [s.context.span_id for s in batch.spans] == [0x0202020202020202, 0x0404040404040404]
    assert batch.rejected == 1
    assert reason in batch.error_message


def test_remote_parent_flag_and_trace_state() -> None:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.append(_span_pb(parent_span_id=b"\x05" * 8, flags=0x301, trace_state="a=1,b=2"))
    (span,) = convert.spans_from_request(request).spans
    assert span.parent is not None and span.parent.is_remote
    assert int(span.context.trace_flags) == 1
    assert dict(span.context.trace_state) == {"a": "1", "b": "2"}


def _metrics_data() -> MetricsData:
    reader = InMemoryMetricReader(preferred_temporality={
        # a delta histogram and a cumulative counter: both temporalities must survive
        HistogramInstrument: AggregationTemporality.DELTA})
    provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": "prover"}),
        views=[View(instrument_name="exp.latency",
                    aggregation=ExponentialBucketHistogramAggregation(max_size=20))])
    meter = provider.get_meter("otel_proofscope", "0.1")
    meter.create_counter("gpu.dispatch.count").add(3, {"gpu.backend": "cuda", "hw.id": "0"})
    meter.create_up_down_counter("gpu.memory.resident", unit="By").add(-7, {"hw.id": "0"})
    meter.create_histogram("proof.duration", unit="s",
                           explicit_bucket_boundaries_advisory=[0.1, 1.0, 10.0]).record(
        2.5, {"proof.system": "gkr"})
    meter.create_histogram("exp.latency").record(0.3)
    meter.create_gauge("hw.gpu.utilization", unit="1").set(0.75, {"hw.id": "0"})
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def _points(data: MetricsData) -> dict[str, tuple[type, list[object]]]:
    out: dict[str, tuple[type, list[object]]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = (type(m.data), list(m.data.data_points))
    return out


def test_metrics_round_trip_through_protobuf_and_json() -> None:
    data = _metrics_data()
    original = _points(data)
    for request in (encode_metrics(data),
                    codec.decode(codec.Signal.METRICS,
                                 encode_metrics_json(data).to_json().encode(),
                                 codec.Encoding.JSON)):
        batch = convert.metrics_from_request(request)
        assert batch.rejected == 0
        got = _points(batch.data)
        assert set(got) == set(original)
        assert batch.points == sum(len(p) for _, p in original.values())
        for name, (kind, points) in original.items():
            assert got[name][0] is kind
            for a, b in zip(points, got[name][1], strict=True):
                assert dict(b.attributes or {}) == dict(a.attributes or {})  # type: ignore[attr-defined]
                assert b.time_unix_nano == a.time_unix_nano  # type: ignore[attr-defined]
                if kind in (Sum, Gauge):
                    assert b.value == a.value  # type: ignore[attr-defined]
                elif kind is Histogram:
                    assert (b.count, b.sum, list(b.bucket_counts), list(b.explicit_bounds),  # type: ignore[attr-defined]
                            b.min, b.max) == (a.count, a.sum, list(a.bucket_counts),  # type: ignore[attr-defined]
                                              list(a.explicit_bounds), a.min, a.max)  # type: ignore[attr-defined]
                elif kind is ExponentialHistogram:
                    assert (b.scale, b.count, list(b.positive.bucket_counts),  # type: ignore[attr-defined]
                            b.positive.offset) == (a.scale, a.count,  # type: ignore[attr-defined]
                                                   list(a.positive.bucket_counts),  # type: ignore[attr-defined]
                                                   a.positive.offset)  # type: ignore[attr-defined]
        sums = {m.name: m.data for rm in batch.data.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}
        assert sums["gpu.dispatch.count"].is_monotonic is True  # type: ignore[union-attr]
        assert sums["gpu.memory.resident"].is_monotonic is False  # type: ignore[union-attr]
        assert sums["proof.duration"].aggregation_temporality is AggregationTemporality.DELTA  # type: ignore[union-attr]
        assert (sums["gpu.dispatch.count"].aggregation_temporality  # type: ignore[union-attr]
                is AggregationTemporality.CUMULATIVE)


def test_unrepresentable_metric_points_are_rejected_and_counted() -> None:
    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    good = metrics.add(name="good")
    good.gauge.data_points.add(as_double=1.0, time_unix_nano=5)
    good.gauge.data_points.add(time_unix_nano=6)  # no value at all
    summary = metrics.add(name="latency.summary")
    summary.summary.data_points.add(count=1, sum=2.0)
    summary.summary.data_points.add(count=1, sum=2.0)
    hist = metrics.add(name="bad.hist")
    hist.histogram.aggregation_temporality = 2
    hist.histogram.data_points.add(count=1, bucket_counts=[1, 0], explicit_bounds=[1.0, 2.0])
    weird = metrics.add(name="weird.temporality")
    weird.sum.aggregation_temporality = 9
    weird.sum.data_points.add(as_int=1)
    batch = convert.metrics_from_request(request)
    assert batch.points == 1
    assert batch.rejected == 1 + 2 + 1 + 1
    assert "Summary" in batch.error_message and "no value" in batch.error_message
    (metric,) = [m for rm in batch.data.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics]
    assert metric.name == "good" and metric.data.data_points[0].value == 1.0


def test_missing_optional_histogram_fields_are_nan_not_zero() -> None:
    request = ExportMetricsServiceRequest()
    m = request.resource_metrics.add().scope_metrics.add().metrics.add(name="h")
    m.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    m.histogram.data_points.add(count=2, bucket_counts=[1, 1], explicit_bounds=[1.0])
    (point,) = convert.metrics_from_request(request).data.resource_metrics[0] \
        .scope_metrics[0].metrics[0].data.data_points
    assert point.count == 2  # type: ignore[union-attr]
    assert math.isnan(point.sum) and math.isnan(point.min) and math.isnan(point.max)  # type: ignore[union-attr]


@pytest.mark.parametrize(("body", "fragment"), [
    (b"\xff\xfe not json", "not valid JSON"),
    (b"[1, 2]", "must be an object"),
    (b'{"resourceSpans": 7}', "not a valid OTLP/JSON"),
])
def test_bad_json_bodies(body: bytes, fragment: str) -> None:
    with pytest.raises(codec.BadRequest, match=fragment):
        codec.decode(codec.Signal.TRACES, body, codec.Encoding.JSON)


def test_non_hex_id_rejects_only_its_span() -> None:
    # It used to refuse the whole request; now the span is refused (partial success).
    body = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}'
    request = codec.decode(codec.Signal.TRACES, body, codec.Encoding.JSON)
    batch = convert.spans_from_request(request)
    assert batch.spans == [] and batch.rejected == 1
    assert "trace_id" in batch.error_message


def test_json_ignores_unknown_fields() -> None:
    body = (b'{"resourceSpans": [{"futureField": 1, "scopeSpans": [{"spans": [{"traceId": '
            b'"0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "name": "n", '
            b'"kind": 2, "newThing": {"a": 1}}]}]}]}')
    request = codec.decode(codec.Signal.TRACES, body, codec.Encoding.JSON)
    (span,) = convert.spans_from_request(request).spans
    assert span.name == "n" and span.kind is SpanKind.SERVER
    assert span.context.trace_id == 0x0102030405060708090A0B0C0D0E0F10


def test_garbage_protobuf_is_a_bad_request() -> None:
    with pytest.raises(codec.BadRequest):
        codec.decode(codec.Signal.TRACES, b"\x0a\xff\xff\xff\xff\x0f", codec.Encoding.PROTOBUF)


def test_partial_success_response_in_both_encodings() -> None:
    msg = codec.response(codec.Signal.TRACES, 3, "3 spans had bad ids")
    assert msg.partial_success.rejected_spans == 3
    assert b"rejectedSpans" in codec.encode(msg, codec.Encoding.JSON)
    clean = codec.response(codec.Signal.METRICS)
    assert not clean.HasField("partial_success")
