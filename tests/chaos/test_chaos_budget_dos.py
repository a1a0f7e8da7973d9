"""Issue 28 item 1: clients that declare a 4 MiB gzip body and drip one byte a second
(reconnecting when cut off) must not hold serve's byte budget: the budget is taken on
bytes actually read, and the body's deadline measures the client's own progress. The
official OTLP exporters (HTTP and gRPC) export while the attack runs; every export
succeeds. Attack traffic goes to 127.0.0.1 only, 4 clients, bounded in time."""

from __future__ import annotations

import contextlib
import socket
import threading
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

ATTACKERS = 4
DEADLINE_S = 3.0
ATTACK_S = 14.0
HEADERS = (b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\n"
           b"Content-Length: 4194304\r\n\r\n")


class Attack:
    """Staggered clients: headers, then one byte a second; reconnect when cut off."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.connections = 0
        self.cut_off = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(ATTACKERS)]

    def __enter__(self) -> Attack:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _client(self, i: int) -> None:
        if self.stop.wait(i * DEADLINE_S / ATTACKERS):  # staggered
            return
        deadline = time.monotonic() + ATTACK_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(OSError), \
                    socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                with self._lock:
                    self.connections += 1
                s.sendall(HEADERS + b"\x1f")
                s.settimeout(1.0)
                while not self.stop.is_set() and time.monotonic() < deadline:
                    try:
                        if s.recv(4096) == b"":
                            break  # cut off: reconnect
                    except TimeoutError:
                        s.sendall(b"\x8b")  # one more byte, a second later
                        continue
                    except OSError:
                        break
                with self._lock:
                    self.cut_off += 1


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


def _export(exporter: SpanExporter, label: str) -> Recording:
    rec = Recording(exporter)
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(rec))
    with tp.get_tracer("legit").start_as_current_span(label):
        pass
    tp.shutdown()
    return rec


def test_drip_feeding_gzip_clients_do_not_lock_out_the_official_exporters() -> None:
    memory = InMemorySpanExporter()
    receiver = OtlpReceiver([memory], [], grpc_port=0, http_port=0,
                            request_deadline_s=DEADLINE_S)
    receiver.start()
    results: list[tuple[str, list[SpanExportResult]]] = []
    try:
        assert receiver.http_port is not None
        with Attack(receiver.http_port) as attack:
            time.sleep(DEADLINE_S + 0.5)  # every attacker connected, some reconnected
            # what the attackers hold: the bytes they sent, not the length they declared
            assert receiver.ingest.budget.used < 64 * 1024, receiver.ingest.budget.used
            for i in range(3):
                results.append(("grpc", _export(GrpcSpanExporter(
                    endpoint=receiver.grpc_endpoint, insecure=True, timeout=4), f"g{i}"
                ).results))
                results.append(("http", _export(HttpSpanExporter(
                    endpoint=f"{receiver.http_endpoint}/v1/traces", timeout=4), f"h{i}"
                ).results))
                time.sleep(1.0)
        assert attack.connections > ATTACKERS  # they were cut off and came back
    finally:
        receiver.stop()
    assert results == [(kind, [SpanExportResult.SUCCESS]) for kind in ("grpc", "http")] * 3
    assert len(memory.get_finished_spans()) == 6
    # each dripping request was closed at its deadline and counted
    assert DROPS.total(signal="otlp_traces_requests", reason="timeout") >= ATTACKERS
    assert DROPS.total(signal="otlp_traces_requests", reason="queue_full") == 0
