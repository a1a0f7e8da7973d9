"""`OtlpReceiver` on 127.0.0.1: the official OTLP exporters in, SDK exporters out, and
every rejection answered with the proper OTLP error and counted in the drop ledger."""

from __future__ import annotations

import gzip
import http.client
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest
from google.rpc.status_pb2 import Status as RpcStatus
from grpc import Compression
from opentelemetry.exporter.otlp.json.common.trace_encoder import (
    encode_spans as encode_spans_json,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.integrations.otlp_receiver.core import LEDGER_SINK as SINK
from otel_proofscope.ledger import DROPS
from otel_proofscope.semconv import Attr, SpanName

TOKEN = "s3cret-token"
TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
METRICS = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
CAP = 64 * 1024


class CollectingMetricExporter(MetricExporter):
    """A real SDK MetricExporter that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass

    def names(self) -> set[str]:
        return {m.name for d in self.batches for rm in d.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture()
def sinks() -> tuple[InMemorySpanExporter, CollectingMetricExporter]:
    return InMemorySpanExporter(), CollectingMetricExporter()


@pytest.fixture()
def receiver(sinks: tuple[InMemorySpanExporter, CollectingMetricExporter]
             ) -> Iterator[OtlpReceiver]:
    with OtlpReceiver([sinks[0]], [sinks[1]], grpc_port=0, http_port=0, token=TOKEN,
                      max_message_bytes=CAP) as rx:
        yield rx


def _prove(exporter: SpanExporter, name: str) -> None:
    tp = TracerProvider(resource=Resource.create({"service.name": name}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    pt = ProofTracer(tracer_provider=tp)
    with pt.proof(system="gkr", layers=2, model_name=name) as proof:
        for i in range(2):
            with pt.layer(index=i, kind="MatMul", rounds=3, claim_initial=11):
                for r in range(3):
                    pt.sumcheck_round(r, [r, r + 1, r + 2], 100 + r)
        with pt.verify() as v:
            v.set_verified(True)
        proof.set_result(size=4096)
    tp.shutdown()


def _check_proof(spans: Sequence[ReadableSpan], service: str) -> None:
    mine = [s for s in spans if s.resource.attributes.get("service.name") == service]
    names = sorted(s.name for s in mine)
    assert names == sorted([SpanName.PROOF, SpanName.LAYER, SpanName.LAYER, SpanName.VERIFY])
    (root,) = [s for s in mine if s.name == SpanName.PROOF]
    assert root.parent is None
    assert root.attributes[Attr.PROOF_VERIFIED] is True
    assert root.attributes[Attr.PROOF_SIZE] == 4096
    for s in mine:
        assert s.context.trace_id == root.context.trace_id
        if s is not root:
            assert s.parent is not None and s.parent.span_id == root.context.span_id
    layers = [s for s in mine if s.name == SpanName.LAYER]
    assert all(len(s.events) == 3 for s in layers)
    assert all(s.end_time > s.start_time for s in mine)


def _drops(reason: str | None = None, signal: str | None = None) -> int:
    return DROPS.total(sink=SINK, reason=reason, signal=signal)


def test_official_grpc_and_http_exporters_deliver_a_proof(
        receiver: OtlpReceiver,
        sinks: tuple[InMemorySpanExporter, CollectingMetricExporter]) -> None:
    auth = f"Bearer {TOKEN}"
    _prove(GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                            headers=(("authorization", auth),), timeout=5), "via-grpc")
    _prove(HttpSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces",
                            headers={"Authorization": auth}, timeout=5), "via-http")
    _prove(GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                            headers=(("authorization", auth),), timeout=5,
                            compression=Compression.Gzip), "via-grpc-gzip")
    _prove(HttpSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces",
                            headers={"Authorization": auth}, timeout=5,
                            compression=HttpCompression.Gzip), "via-http-gzip")
    spans = sinks[0].get_finished_spans()
    for service in ("via-grpc", "via-http", "via-grpc-gzip", "via-http-gzip"):
        _check_proof(spans, service)
    stats = receiver.stats()
    assert stats["spans_accepted"] == 16 and stats["spans_rejected"] == 0


def test_official_metric_exporters_deliver_proof_metrics(
        receiver: OtlpReceiver,
        sinks: tuple[InMemorySpanExporter, CollectingMetricExporter]) -> None:
    auth = f"Bearer {TOKEN}"
    for exporter in (GrpcMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                                        headers=(("authorization", auth),), timeout=5),
                     HttpMetricExporter(endpoint=f"{receiver.http_endpoint}/v1/metrics",
                                        headers={"Authorization": auth}, timeout=5)):
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
        provider = MeterProvider(metric_readers=[reader])
        pt = ProofTracer(tracer_provider=TracerProvider(), meter_provider=provider)
        with pt.proof(system="gkr"), pt.layer(index=0, kind="Add", rounds=1):
            pt.sumcheck_round(0, [1, 2], 3)
        provider.shutdown()  # collects and exports once
    assert {"proof.duration", "proof.layer.duration",
            "proof.sumcheck.round.count"} <= sinks[1].names()
    assert len(sinks[1].batches) == 2
    assert receiver.stats()["metric_points_accepted"] >= 6


def test_official_json_encoding_over_http(
        receiver: OtlpReceiver,
        sinks: tuple[InMemorySpanExporter, CollectingMetricExporter]) -> None:
    collected = InMemorySpanExporter()
    _prove(collected, "json")
    body = encode_spans_json(collected.get_finished_spans()).to_json().encode()
    status, headers, reply = _post(receiver, "/v1/traces", body, "application/json")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(reply) == {}
    _check_proof(sinks[0].get_finished_spans(), "json")


# ── rejections over HTTP ─────────────────────────────────────────────────────────────


def _post(rx: OtlpReceiver, path: str, body: bytes, content_type: str | None,
          token: str | None = TOKEN, headers: dict[str, str] | None = None
          ) -> tuple[int, dict[str, str], bytes]:
    assert rx.http_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
    h = dict(headers or {})
    if content_type:
        h["Content-Type"] = content_type
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=body, headers=h)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _proof_request() -> bytes:
    collected = InMemorySpanExporter()
    _prove(collected, "raw")
    data: bytes = encode_spans(collected.get_finished_spans()).SerializeToString()
    return data


PB = "application/x-protobuf"


@pytest.mark.parametrize(("case", "status", "grpc_code", "reason"), [
    ("garbage", 400, 3, "invalid"),
    ("wrong_content_type", 415, 3, "invalid"),
    ("oversized", 413, 8, "size_cap"),
    ("gzip_bomb", 413, 8, "size_cap"),
    ("bad_gzip", 400, 3, "invalid"),
    ("no_token", 401, 16, "unauthenticated"),
    ("wrong_token", 401, 16, "unauthenticated"),
])
def test_http_rejections_get_the_otlp_error_and_are_counted(
        receiver: OtlpReceiver, case: str, status: int, grpc_code: int, reason: str) -> None:
    body, ctype, token, headers = b"\x0a\xff\xff\xff\xff\x0f", PB, TOKEN, {}
    if case == "wrong_content_type":
        body, ctype = _proof_request(), "text/plain"
    elif case == "oversized":
        body = b"\x00" * (CAP + 1)
    elif case == "gzip_bomb":
        body, headers = gzip.compress(b"\x00" * (CAP * 8)), {"Content-Encoding": "gzip"}
    elif case == "bad_gzip":
        body, headers = b"not gzip at all", {"Content-Encoding": "gzip"}
    elif case == "no_token":
        body, token = _proof_request(), None
    elif case == "wrong_token":
        body, token = _proof_request(), "guess"
    before = _drops(reason, "otlp_traces_requests")
    got, resp_headers, reply = _post(receiver, "/v1/traces", body, ctype, token, headers)
    assert got == status
    rpc = RpcStatus()
    if resp_headers["content-type"] == PB:
        rpc.ParseFromString(reply)
    else:
        rpc.code = json.loads(reply)["code"]
    assert rpc.code == grpc_code
    assert _drops(reason, "otlp_traces_requests") == before + 1
    if case.endswith("token"):
        assert resp_headers["www-authenticate"].startswith("Bearer")
    # the connection-level state survived: a good request still goes through
    assert _post(receiver, "/v1/traces", _proof_request(), PB)[0] == 200


def test_http_partial_success_counts_rejected_spans(
        receiver: OtlpReceiver,
        sinks: tuple[InMemorySpanExporter, CollectingMetricExporter]) -> None:
    request = ExportTraceServiceRequest()
    request.ParseFromString(_proof_request())
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].span_id = b"\x01\x02"  # broken id: this one span is rejected
    before = _drops("invalid", "spans")
    status, _, reply = _post(receiver, "/v1/traces", request.SerializeToString(), PB)
    assert status == 200
    response = ExportTraceServiceResponse.FromString(reply)
    assert response.partial_success.rejected_spans == 1
    assert "span_id must be 8 bytes" in response.partial_success.error_message
    assert _drops("invalid", "spans") == before + 1
    assert len(sinks[0].get_finished_spans()) == len(spans) - 1


def test_http_unknown_path_and_method(receiver: OtlpReceiver) -> None:
    assert _post(receiver, "/v1/logs", b"", PB)[0] == 404
    assert receiver.http_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=10)
    conn.request("GET", "/v1/traces")
    resp = conn.getresponse()
    assert resp.status == 405 and resp.getheader("Allow") == "POST"
    conn.close()


# ── rejections over gRPC ─────────────────────────────────────────────────────────────


def _grpc_call(rx: OtlpReceiver, body: bytes, token: str | None = TOKEN,
               method: str = TRACES) -> bytes:
    assert rx.grpc_endpoint is not None
    with grpc.insecure_channel(rx.grpc_endpoint, options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024)]) as channel:
        call = channel.unary_unary(method)
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
        reply: bytes = call(body, timeout=10, metadata=metadata)
        return reply


@pytest.mark.parametrize(("case", "code", "reason"), [
    ("garbage", grpc.StatusCode.INVALID_ARGUMENT, "invalid"),
    ("oversized", grpc.StatusCode.RESOURCE_EXHAUSTED, "size_cap"),
    ("no_token", grpc.StatusCode.UNAUTHENTICATED, "unauthenticated"),
    ("wrong_token", grpc.StatusCode.UNAUTHENTICATED, "unauthenticated"),
])
def test_grpc_rejections_get_the_otlp_error_and_are_counted(
        receiver: OtlpReceiver, case: str, code: grpc.StatusCode, reason: str) -> None:
    body, token = b"\x0a\xff\xff\xff\xff\x0f", TOKEN
    if case == "oversized":
        body = b"\x00" * (CAP * 2)  # above the cap, below gRPC core's ceiling
    elif case == "no_token":
        body, token = _proof_request(), None
    elif case == "wrong_token":
        body, token = _proof_request(), "guess"
    for method, signal in ((TRACES, "otlp_traces_requests"),
                           (METRICS, "otlp_metrics_requests")):
        before = _drops(reason, signal)
        with pytest.raises(grpc.RpcError) as err:
            _grpc_call(receiver, body, token, method)
        assert err.value.code() == code
        assert _drops(reason, signal) == before + 1
    ok = ExportTraceServiceResponse.FromString(_grpc_call(receiver, _proof_request()))
    assert not ok.HasField("partial_success")


def test_official_grpc_exporter_with_wrong_token_fails_fast(receiver: OtlpReceiver) -> None:
    before = _drops("unauthenticated")
    exporter = GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                                headers=(("authorization", "Bearer nope"),), timeout=5)
    collected = InMemorySpanExporter()
    _prove(collected, "unauth")
    assert exporter.export(collected.get_finished_spans()) is SpanExportResult.FAILURE
    exporter.shutdown()
    assert _drops("unauthenticated") == before + 1


# ── sinks and load ───────────────────────────────────────────────────────────────────


class _FailingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise RuntimeError("viewer went away")

    def shutdown(self) -> None:
        pass


def test_a_failing_sink_is_reported_and_counted() -> None:
    with OtlpReceiver([_FailingExporter()], grpc_port=None, http_port=0) as rx:
        before = DROPS.total(sink=f"{SINK}:_FailingExporter", reason="export_failed")
        status, _, reply = _post(rx, "/v1/traces", _proof_request(), PB, token=None)
        assert status == 200
        response = ExportTraceServiceResponse.FromString(reply)
        assert response.partial_success.rejected_spans == 4
        assert "viewer went away" in response.partial_success.error_message
        assert DROPS.total(sink=f"{SINK}:_FailingExporter",
                           reason="export_failed") == before + 4


class _BlockingExporter(SpanExporter):
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(10)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_busy_receiver_turns_requests_away_with_a_retryable_code() -> None:
    blocking = _BlockingExporter()
    with OtlpReceiver([blocking], grpc_port=0, http_port=0, max_concurrent=1,
                      admission_timeout_s=0.2) as rx:
        body = _proof_request()
        first = threading.Thread(target=_post, args=(rx, "/v1/traces", body, PB, None))
        first.start()
        try:
            assert blocking.entered.wait(10)
            before = _drops("queue_full")
            status, headers, _ = _post(rx, "/v1/traces", body, PB, token=None)
            assert status == 503 and headers["retry-after"] == "1"
            with pytest.raises(grpc.RpcError) as err:
                _grpc_call(rx, body, token=None)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert _drops("queue_full") == before + 2
        finally:
            blocking.release.set()
            first.join(10)


def test_stop_closes_both_ports() -> None:
    rx = OtlpReceiver(grpc_port=0, http_port=0).start()
    port = rx.http_port
    rx.stop()
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    with pytest.raises(OSError):
        conn.request("POST", "/v1/traces", body=b"")
        conn.getresponse()
    conn.close()


def test_port_in_use_is_an_error() -> None:
    with OtlpReceiver(grpc_port=0, http_port=0) as rx, pytest.raises(OSError):
        OtlpReceiver(grpc_port=rx.grpc_port, http_port=None)
    with OtlpReceiver(grpc_port=None, http_port=0) as rx, pytest.raises(OSError):
        OtlpReceiver(grpc_port=None, http_port=rx.http_port)
