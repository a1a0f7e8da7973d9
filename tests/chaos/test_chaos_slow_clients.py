"""Slow HTTP clients (headers, then a body that drips or stalls) hold no shared slot:
legitimate OTLP exporters on both protocols go through, the slow ones are closed at the
whole-request deadline and counted."""

from __future__ import annotations

import socket
import time

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.ledger import DROPS

pytestmark = pytest.mark.chaos

DEADLINE_S = 2.0
SLOW = 16


class Recording(SpanExporter):
    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.results: list[SpanExportResult] = []

    def export(self, spans):  # type: ignore[no-untyped-def]
        r = self.inner.export(spans)
        self.results.append(r)
        return r

    def shutdown(self) -> None:
        self.inner.shutdown()


def _spans(exporter: SpanExporter, n: int) -> Recording:
    rec = Recording(exporter)
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(rec))
    tracer = tp.get_tracer("legit")
    for i in range(n):
        with tracer.start_as_current_span(f"legit{i}"):
            pass
    tp.shutdown()
    return rec


def _slow_client(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
              b"Content-Length: 1000\r\n\r\n\x0a")  # 1 of 1000 bytes, then silence
    return s


def test_sixteen_slow_clients_do_not_lock_out_exporters() -> None:
    memory = InMemorySpanExporter()
    receiver = OtlpReceiver([memory], [], grpc_port=0, http_port=0,
                            request_deadline_s=DEADLINE_S)
    receiver.start()
    slow: list[socket.socket] = []
    try:
        assert receiver.http_port is not None
        slow = [_slow_client(receiver.http_port) for _ in range(SLOW)]
        time.sleep(0.3)  # every slow request is inside its handler now
        start = time.monotonic()
        grpc = _spans(GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                                       timeout=5), 3)
        http = _spans(HttpSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces",
                                       timeout=5), 3)
        took = time.monotonic() - start
        # the legit exports finished while all 16 slow clients were still connected
        assert took < DEADLINE_S, took
        assert grpc.results == [SpanExportResult.SUCCESS] * 3
        assert http.results == [SpanExportResult.SUCCESS] * 3
        assert len(memory.get_finished_spans()) == 6
        # past the deadline every slow connection is closed by the server...
        time.sleep(DEADLINE_S + 0.5)
        for s in slow:
            s.settimeout(2)
            assert s.recv(1024) == b""
        # ...and counted, once each
        assert DROPS.total(signal="otlp_traces_requests", reason="timeout") == SLOW
        assert receiver.stats()["requests.traces.timeout"] == SLOW
        assert DROPS.total(reason="queue_full") == 0
    finally:
        for s in slow:
            s.close()
        receiver.stop()


def test_a_dripped_request_line_is_closed_at_the_deadline_and_counted() -> None:
    receiver = OtlpReceiver([InMemorySpanExporter()], [], grpc_port=None, http_port=0,
                            request_deadline_s=1.0)
    receiver.start()
    try:
        assert receiver.http_port is not None
        s = socket.create_connection(("127.0.0.1", receiver.http_port))
        s.settimeout(0.2)
        closed = False
        start = time.monotonic()
        for ch in b"POST /v1/traces HTTP/1.1\r\n":  # one byte every 0.2 s
            try:
                s.sendall(bytes([ch]))
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        took = time.monotonic() - start
        s.close()
        assert closed and took < 4.0, took
        assert DROPS.total(reason="timeout") == 1
    finally:
        receiver.stop()
