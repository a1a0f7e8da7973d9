"""Hypothesis throws random bytes and protobuf-ish OTLP at both endpoints.

Whatever arrives, the receiver answers (no crash, no hang), with an OTLP status that fits,
and every rejection shows up in the drop ledger: a refused request as one
``otlp_*_requests`` drop, a partially accepted one as exactly the rejected item count.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.integrations.otlp_receiver.core import LEDGER_SINK as SINK
from otel_proofscope.ledger import DROPS

CAP = 16 * 1024
SERVICES = {
    "traces": ("/v1/traces", "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
               ExportTraceServiceResponse, "spans"),
    "metrics": ("/v1/metrics",
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                ExportMetricsServiceResponse, "metric_points"),
}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver([InMemorySpanExporter()], grpc_port=0, http_port=0,
                      max_message_bytes=CAP) as rx:
        yield rx


@pytest.fixture(scope="module")
def channel(receiver: OtlpReceiver) -> Iterator[grpc.Channel]:
    assert receiver.grpc_endpoint is not None
    with grpc.insecure_channel(receiver.grpc_endpoint) as ch:
        yield ch


# ── protobuf-ish payloads ────────────────────────────────────────────────────────────

# Mostly well-formed ids (so spans get through and the rest of the span is exercised),
# sometimes wrong lengths or all zeros.
trace_ids = st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=17),
                      st.just(b"\x00" * 16))
span_ids = st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=9),
                     st.just(b"\x00" * 8), st.just(b""))
scalars = st.one_of(
    st.builds(lambda s: AnyValue(string_value=s), st.text(max_size=8)),
    st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda f: AnyValue(double_value=f), st.floats()),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=8)),
    st.just(AnyValue()),
)
any_values = st.recursive(scalars, lambda inner: st.one_of(
    st.builds(lambda vs: AnyValue(array_value={"values": vs}), st.lists(inner, max_size=3)),
    st.builds(lambda kvs: AnyValue(kvlist_value={"values": [KeyValue(key=k, value=v)
                                                            for k, v in kvs]}),
              st.lists(st.tuples(st.text(max_size=4), inner), max_size=3))), max_leaves=6)
key_values = st.lists(st.builds(KeyValue, key=st.text(max_size=6), value=any_values),
                      max_size=3)
spans = st.builds(
    trace_pb2.Span, trace_id=trace_ids, span_id=span_ids, parent_span_id=span_ids,
    name=st.text(max_size=8),
    kind=st.integers(0, 7), flags=st.integers(0, 2**32 - 1), attributes=key_values,
    start_time_unix_nano=st.integers(0, 2**64 - 1), end_time_unix_nano=st.integers(0, 2**64 - 1),
    trace_state=st.text(max_size=12),
    events=st.lists(st.builds(trace_pb2.Span.Event, name=st.text(max_size=4),
                              attributes=key_values), max_size=2),
    links=st.lists(st.builds(trace_pb2.Span.Link, trace_id=trace_ids, span_id=span_ids),
                   max_size=2),
    status=st.builds(trace_pb2.Status, code=st.integers(0, 4), message=st.text(max_size=4)))


@st.composite
def trace_requests(draw: st.DrawFn) -> bytes:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(draw(key_values))
        for _ in range(draw(st.integers(0, 2))):
            rs.scope_spans.add(spans=draw(st.lists(spans, max_size=3)))
    data: bytes = req.SerializeToString()
    return data


numbers = st.builds(lambda v, which: metrics_pb2.NumberDataPoint(**{which: v}) if which
                    else metrics_pb2.NumberDataPoint(),
                    st.integers(-(2**31), 2**31), st.sampled_from(["as_int", "as_double", ""]))
histos = st.builds(metrics_pb2.HistogramDataPoint, count=st.integers(0, 10),
                   bucket_counts=st.lists(st.integers(0, 5), max_size=4),
                   explicit_bounds=st.lists(st.floats(allow_nan=True), max_size=4))


@st.composite
def metric_requests(draw: st.DrawFn) -> bytes:
    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    for i in range(draw(st.integers(0, 4))):
        m = sm.metrics.add(name=f"m{i}")
        kind = draw(st.sampled_from(["gauge", "sum", "histogram", "summary", "exp", "none"]))
        if kind == "gauge":
            m.gauge.data_points.extend(draw(st.lists(numbers, max_size=3)))
        elif kind == "sum":
            m.sum.aggregation_temporality = draw(st.integers(0, 4))
            m.sum.data_points.extend(draw(st.lists(numbers, max_size=3)))
        elif kind == "histogram":
            m.histogram.aggregation_temporality = draw(st.integers(0, 4))
            m.histogram.data_points.extend(draw(st.lists(histos, max_size=3)))
        elif kind == "summary":
            for _ in range(draw(st.integers(0, 2))):
                m.summary.data_points.add(count=1)
        elif kind == "exp":
            m.exponential_histogram.aggregation_temporality = draw(st.integers(0, 4))
            m.exponential_histogram.data_points.add(scale=draw(st.integers(-10, 20)))
    data: bytes = req.SerializeToString()
    return data


@st.composite
def mutated(draw: st.DrawFn, payloads: st.SearchStrategy[bytes]) -> bytes:
    data = draw(payloads)
    how = draw(st.sampled_from(["none", "truncate", "flip", "splice"]))
    if how == "truncate" and data:
        return data[:draw(st.integers(0, len(data) - 1))]
    if how == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    if how == "splice":
        i = draw(st.integers(0, len(data)))
        return data[:i] + draw(st.binary(max_size=16)) + data[i:]
    return data


def _hex_ids(node: object) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def _as_otlp_json(kind: str, data: bytes) -> bytes:
    msg = (ExportTraceServiceRequest if kind == "traces" else ExportMetricsServiceRequest)()
    msg.ParseFromString(data)
    doc = json_format.MessageToDict(msg)
    _hex_ids(doc)
    return json.dumps(doc).encode()


def payloads(kind: str, content_type: str = "application/x-protobuf"
             ) -> st.SearchStrategy[bytes]:
    structured = trace_requests() if kind == "traces" else metric_requests()
    if content_type == "application/json":
        structured = structured.map(lambda data: _as_otlp_json(kind, data))
    return st.one_of(st.binary(max_size=256), structured, mutated(structured),
                     st.binary(min_size=CAP + 1, max_size=CAP + 64))


# ── accounting ───────────────────────────────────────────────────────────────────────


def _requests_dropped(kind: str) -> int:
    return DROPS.total(sink=SINK, signal=f"otlp_{kind}_requests")


def _items_dropped(kind: str) -> int:
    return DROPS.total(sink=SINK, signal=SERVICES[kind][3])


def _rejected(response: ExportTraceServiceResponse | ExportMetricsServiceResponse) -> int:
    ps = response.partial_success
    n: int = ps.rejected_spans if hasattr(ps, "rejected_spans") else ps.rejected_data_points
    return n


FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("kind", ["traces", "metrics"])
@pytest.mark.parametrize("content_type", ["application/x-protobuf", "application/json"])
def test_http_survives_and_counts_every_rejection(receiver: OtlpReceiver, kind: str,
                                                  content_type: str) -> None:
    path, _, response_type, _ = SERVICES[kind]
    assert receiver.http_port is not None

    @FUZZ
    @given(body=payloads(kind, content_type))
    def check(body: bytes) -> None:
        before_req, before_items = _requests_dropped(kind), _items_dropped(kind)
        conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=10)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": content_type})
            resp = conn.getresponse()
            reply = resp.read()
        finally:
            conn.close()
        if resp.status == 200:
            if content_type == "application/json":
                doc = json.loads(reply)
                ps = doc.get("partialSuccess", {})
                rejected = int(ps.get("rejectedSpans", ps.get("rejectedDataPoints", 0)))
            else:
                rejected = _rejected(response_type.FromString(reply))
            assert _requests_dropped(kind) == before_req
            assert _items_dropped(kind) == before_items + rejected
        else:
            assert resp.status in (400, 413), resp.status
            assert resp.status == 413 or len(body) <= CAP
            assert _requests_dropped(kind) == before_req + 1
            assert _items_dropped(kind) == before_items

    check()


@pytest.mark.parametrize("kind", ["traces", "metrics"])
def test_grpc_survives_and_counts_every_rejection(receiver: OtlpReceiver,
                                                  channel: grpc.Channel, kind: str) -> None:
    _, method, response_type, _ = SERVICES[kind]
    call = channel.unary_unary(method)

    @FUZZ
    @given(body=payloads(kind))
    def check(body: bytes) -> None:
        before_req, before_items = _requests_dropped(kind), _items_dropped(kind)
        try:
            reply = call(body, timeout=10)
        except grpc.RpcError as err:
            assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED), err
            assert _requests_dropped(kind) == before_req + 1
            assert _items_dropped(kind) == before_items
            return
        assert _requests_dropped(kind) == before_req
        assert _items_dropped(kind) == before_items + _rejected(response_type.FromString(reply))

    check()
    # still serving after all of that
    assert not response_type.FromString(call(b"", timeout=10)).HasField("partial_success")
