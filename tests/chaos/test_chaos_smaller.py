"""The smaller faults of round 2, one test each: real sockets, real exporters."""

from __future__ import annotations

import gzip
import http.client
import logging
import threading
from collections.abc import Iterator, Sequence

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import semconv
from otel_proofscope.cli.serve_cmd import _shown
from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.integrations.otlp_receiver.core import Ingest
from otel_proofscope.ledger import DROPS
from otel_proofscope.pipeline.deadline import parse_timeout
from otel_proofscope.pipeline.privacy import strip_witness
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.setup import configure

pytestmark = pytest.mark.chaos

CAP = 64 * 1024


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpReceiver, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    r = OtlpReceiver([memory], [], grpc_port=0, http_port=0, max_message_bytes=CAP,
                     token="secret")
    r.start()
    yield r, memory
    r.stop()


def _request(n: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(n):
        s = ss.spans.add()
        s.trace_id = bytes(15) + b"\x01"
        s.span_id = bytes(7) + bytes([i + 1])
        s.name = f"s{i}"
        s.start_time_unix_nano, s.end_time_unix_nano = 1, 2
    return bytes(req.SerializeToString())


def _conn(r: OtlpReceiver) -> http.client.HTTPConnection:
    assert r.http_port is not None
    return http.client.HTTPConnection("127.0.0.1", r.http_port, timeout=10)


def test_privacy_filter_keeps_dropped_events_count() -> None:
    memory = InMemorySpanExporter()
    tp = TracerProvider(span_limits=SpanLimits(max_events=8))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    with tp.get_tracer("t").start_as_current_span("s") as span:
        for i in range(79):
            span.add_event(sorted(semconv.WITNESS_EVENTS)[0] if i == 78 else "e")
    (original,) = memory.get_finished_spans()
    stripped = strip_witness(original)
    assert original.dropped_events == 71
    assert stripped.dropped_events == 71  # was reset to 0
    assert len(stripped.events) == 7


@pytest.mark.parametrize("raw", ["inf", "nan", "-inf", "0", "-1", "abc", "1e300"])
def test_shutdown_timeout_is_validated(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="PROOFSCOPE_SHUTDOWN_TIMEOUT"):
        parse_timeout(raw)
    monkeypatch.setenv("PROOFSCOPE_SHUTDOWN_TIMEOUT", raw)
    with pytest.raises(ValueError, match="PROOFSCOPE_SHUTDOWN_TIMEOUT"):
        configure(set_global=False, rerun="off")
    if raw == "0":
        return  # as an argument, 0 means "not given" (configure()'s contract)
    monkeypatch.delenv("PROOFSCOPE_SHUTDOWN_TIMEOUT")
    with pytest.raises(ValueError, match="shutdown_timeout_s"):
        configure(set_global=False, rerun="off", shutdown_timeout_s=float(raw)
                  if raw != "abc" else float("nan"))


def test_drop_log_names_the_time_left_not_a_zero_bound(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    release = threading.Event()

    class Stuck(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            release.wait(10)
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    proc = BoundedBatchSpanProcessor(Stuck(), sink="stuck", schedule_delay_s=0.01)
    tp.add_span_processor(proc)
    for _ in range(3):
        with tp.get_tracer("t").start_as_current_span("s"):
            pass
    caplog.set_level(logging.WARNING)
    proc.shutdown(0)
    release.set()
    (line,) = [r.getMessage() for r in caplog.records if "not exported" in r.getMessage()]
    assert "0.0 s shutdown deadline" not in line
    assert "left for this sink" in line


def test_oversized_chunked_body_is_drained_answered_and_counted_once(receiver) -> None:  # type: ignore[no-untyped-def]
    r, _ = receiver
    conn = _conn(r)
    body = [b"x" * 16384] * (2 * CAP // 16384)  # twice the cap, within the drain bound
    conn.request("POST", "/v1/traces", body=iter(body), encode_chunked=True,
                 headers={"Content-Type": "application/x-protobuf",
                          "Authorization": "Bearer secret", "Transfer-Encoding": "chunked"})
    resp = conn.getresponse()
    assert resp.status == 413
    resp.read()
    # the connection is still in step: a good request on it succeeds
    conn.request("POST", "/v1/traces", body=_request(2), headers={
        "Content-Type": "application/x-protobuf", "Authorization": "Bearer secret"})
    assert conn.getresponse().status == 200
    assert DROPS.total(signal="otlp_traces_requests", reason="size_cap") == 1


def test_second_gzip_member_is_not_ignored(receiver) -> None:  # type: ignore[no-untyped-def]
    r, memory = receiver
    raw = _request(6)
    half = len(raw) // 2
    body = gzip.compress(raw[:half]) + gzip.compress(raw[half:])
    conn = _conn(r)
    conn.request("POST", "/v1/traces", body=body, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip",
        "Authorization": "Bearer secret"})
    assert conn.getresponse().status == 200
    assert len(memory.get_finished_spans()) == 6


def test_whitespace_token_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="whitespace"):
        Ingest([], token="   ")
    from otel_proofscope.cli import main

    assert main(["serve", "--token", " \t", "--rerun", "off"]) == 2


def test_several_authorization_headers_are_refused_on_both_transports(receiver) -> None:  # type: ignore[no-untyped-def]
    r, memory = receiver
    conn = _conn(r)
    conn.putrequest("POST", "/v1/traces")
    body = _request(1)
    for h, v in (("Content-Type", "application/x-protobuf"), ("Content-Length", str(len(body))),
                 ("Authorization", "Bearer secret"), ("Authorization", "Bearer wrong")):
        conn.putheader(h, v)
    conn.endheaders()
    conn.send(body)
    assert conn.getresponse().status == 401
    with grpc.insecure_channel(r.grpc_endpoint or "") as ch:
        export = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            export(body, timeout=5, metadata=(("authorization", "Bearer wrong"),
                                              ("authorization", "Bearer secret")))
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        export(body, timeout=5, metadata=(("authorization", "Bearer secret"),))
    assert len(memory.get_finished_spans()) == 1


def test_all_interfaces_are_named() -> None:
    assert "all interfaces" in _shown("http://:4318", "")
    assert "all interfaces" in _shown("0.0.0.0:4317", "0.0.0.0")
    assert _shown("http://127.0.0.1:4318", "127.0.0.1") == "http://127.0.0.1:4318"


def test_bad_json_span_costs_only_itself(receiver) -> None:  # type: ignore[no-untyped-def]
    import json

    r, memory = receiver

    def span(name: str, trace: str = "0" * 31 + "1", kind: str = "SPAN_KIND_INTERNAL"
             ) -> dict[str, object]:
        return {"traceId": trace, "spanId": "00000000000000" + f"{len(name):02x}",
                "name": name, "kind": kind, "startTimeUnixNano": "1", "endTimeUnixNano": "2"}

    body = {"resourceSpans": [{"scopeSpans": [{"spans": [
        span("good"), span("oddhex", trace="abc"), span("bogus-kind", kind="SPAN_KIND_BOGUS")]}]}]}
    conn = _conn(r)
    conn.request("POST", "/v1/traces", body=json.dumps(body), headers={
        "Content-Type": "application/json", "Authorization": "Bearer secret"})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    assert resp.status == 200, answer
    assert int(answer["partialSuccess"]["rejectedSpans"]) == 2, answer
    assert [s.name for s in memory.get_finished_spans()] == ["good"]
    assert DROPS.total(signal="spans", reason="invalid") == 2
