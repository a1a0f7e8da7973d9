"""The bounded pipeline: exact drop accounting, bounded shutdown, fork safety."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.setup import configure

#: Slack for wall-clock bounds on a loaded machine (2 CPUs shared by parallel jobs);
#: well below every failure it must still catch (a 10 s or 30 s hang).
SCHEDULING_MARGIN_S = 2.0
SHUTDOWN_S = 2.0


class Gate(SpanExporter):
    """Blocks every export until released; counts what it received."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()  # set once a worker is blocked in export
        self.received = 0
        self.result = result

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        self.received += len(spans)
        return self.result

    def shutdown(self) -> None:
        self.release.set()


def make_spans(provider: TracerProvider, n: int, events: int = 0) -> None:
    tracer = provider.get_tracer("t")
    for _ in range(n):
        with tracer.start_as_current_span("s") as span:
            for i in range(events):
                span.add_event("e", {"i": i})


def test_queue_full_drops_are_exact() -> None:
    ledger = DropLedger()
    gate = Gate()
    proc = BoundedBatchSpanProcessor(gate, sink="gate", max_queue_size=10, max_batch_size=5,
                                     ledger=ledger)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    make_spans(provider, 1)  # starts the worker, which then blocks in export
    assert gate.entered.wait(10)  # (after the 0.5 s schedule delay) instead of a sleep
    make_spans(provider, 25, events=2)
    gate.release.set()
    assert proc.force_flush(5000)
    # 1 in the first batch, 10 queued, 15 dropped
    assert gate.received == 11
    assert ledger.total(signal="spans", reason="queue_full") == 15
    assert ledger.total(signal="span_events", reason="queue_full") == 30
    assert proc.stats.spans == 11
    proc.shutdown(1000)


def test_failed_exports_are_counted() -> None:
    ledger = DropLedger()
    gate = Gate(SpanExportResult.FAILURE)
    gate.release.set()
    proc = BoundedBatchSpanProcessor(gate, sink="bad", ledger=ledger)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    make_spans(provider, 7, events=3)
    proc.shutdown(2000)
    assert ledger.total(signal="spans", reason="export_failed") == 7
    assert ledger.total(signal="span_events", reason="export_failed") == 21


def test_shutdown_is_bounded_when_the_exporter_hangs() -> None:
    ledger = DropLedger()
    gate = Gate()  # never released by the test
    proc = BoundedBatchSpanProcessor(gate, sink="hang", ledger=ledger, max_batch_size=4)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    make_spans(provider, 10)
    assert gate.entered.wait(10)  # the worker really is stuck in the exporter
    start = time.monotonic()
    proc.shutdown(500)
    # Bounded by the 0.5 s deadline plus scheduling slack; the hang would be 30 s.
    assert time.monotonic() - start < 0.5 + SCHEDULING_MARGIN_S
    assert ledger.total(signal="spans", reason="shutdown") == 10
    make_spans(provider, 2)  # after shutdown: counted, not queued
    assert ledger.total(signal="spans", reason="shutdown") == 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("encoder", ["fast", "sdk"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("endpoint_kind", ["closed", "blackhole"])
def test_dead_collector_exit_is_bounded_and_losses_exact(
        monkeypatch: pytest.MonkeyPatch, black_hole: int, protocol: str,
        endpoint_kind: str, encoder: str) -> None:
    monkeypatch.setenv("PROOFSCOPE_OTLP_ENCODER", encoder)
    port = black_hole if endpoint_kind == "blackhole" else free_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    telemetry = configure(set_global=False, rerun="off", shutdown_timeout_s=SHUTDOWN_S)
    tracer = telemetry.tracer
    spans = events = 0
    for p in range(3):
        with tracer.proof(system="gkr"):
            spans += 1
            for i in range(4):
                with tracer.layer(index=i, kind="MatMul", rounds=3):
                    spans += 1
                    for r in range(3):
                        tracer.sumcheck_round(r, poly=[1, 2], claim=p)
                        events += 1
    start = time.monotonic()
    report = telemetry.shutdown()
    elapsed = time.monotonic() - start
    # The shutdown bound plus scheduling slack; unbounded, the exporters' own 10 s
    # timeout (and retries) would show.
    assert elapsed < SHUTDOWN_S + SCHEDULING_MARGIN_S, elapsed
    assert report.spans_exported == {"otlp": 0}
    assert DROPS.total(signal="spans", sink="otlp") == spans
    assert DROPS.total(signal="span_events", sink="otlp") == events
    assert any("otlp" in line for line in report.lines())


def test_forked_child_does_not_reexport_parent_spans(tmp_path: Path) -> None:
    from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor as BBSP

    received: list[str] = []
    r, w = os.pipe()

    class Recorder(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for s in spans:
                os.write(w, f"{os.getpid()}:{s.name}\n".encode())
            return SpanExportResult.SUCCESS

    gate = threading.Event()

    class Slow(Recorder):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            gate.wait(5)
            return super().export(spans)

    proc = BBSP(Slow(), sink="rec", schedule_delay_s=0.05)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    make_spans(provider, 1)  # worker blocks on the gate; nothing else exported yet
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent-queued"):
        pass
    pid = os.fork()
    if pid == 0:  # child: its own span only
        gate.set()
        with tracer.start_as_current_span("child-span"):
            pass
        proc.shutdown(3000)
        os._exit(0)
    os.waitpid(pid, 0)
    gate.set()
    proc.shutdown(3000)
    os.close(w)
    with os.fdopen(r) as f:
        received = f.read().splitlines()
    child = [x.split(":")[1] for x in received if x.startswith(f"{pid}:")]
    parent = [x.split(":")[1] for x in received if x.startswith(f"{os.getpid()}:")]
    assert child == ["child-span"]
    assert sorted(parent) == ["parent-queued", "s"]


class _Collector:
    """A real OTLP gRPC trace receiver on a fixed loopback port that can go down and up."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.span_ids: list[bytes] = []
        self.server = None

    def up(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import (
            trace_service_pb2,
            trace_service_pb2_grpc,
        )

        outer = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request, context):  # type: ignore[no-untyped-def]
                outer.span_ids += [s.span_id for rs in request.resource_spans
                                   for ss in rs.scope_spans for s in ss.spans]
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def down(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(5)
            self.server = None


@pytest.mark.parametrize("encoder", ["fast", "sdk"])
def test_collector_flapping_recovers_without_duplicates(monkeypatch: pytest.MonkeyPatch,
                                                        encoder: str) -> None:
    monkeypatch.setenv("PROOFSCOPE_OTLP_ENCODER", encoder)
    collector = _Collector(free_port())
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    telemetry = configure(set_global=False, rerun="off", shutdown_timeout_s=3.0)
    tracer = telemetry.tracer
    sent = 0

    def prove(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            with tracer.proof(system="flap"):
                sent += 1
        assert telemetry.force_flush(10)

    collector.up()
    prove(5)
    collector.down()
    prove(7)  # collector down: these fail and are counted
    collector.up()
    # gRPC reconnects with backoff: probe until the pipeline delivers again (bounded)
    deadline = time.monotonic() + 20
    before = len(collector.span_ids)
    while len(collector.span_ids) == before and time.monotonic() < deadline:
        prove(1)
    assert len(collector.span_ids) > before, "never recovered"
    recovered_at = len(collector.span_ids)
    prove(9)  # recovered: all of these arrive
    assert len(collector.span_ids) == recovered_at + 9
    collector.down()
    prove(3)
    telemetry.shutdown()
    received = len(collector.span_ids)
    assert received == len(set(collector.span_ids)), "a span was exported twice"
    assert received >= 15  # 5 before, >= 1 probe, 9 after recovery
    assert received + DROPS.total(signal="spans", sink="otlp") == sent


def test_exporter_selection_follows_otel_variables(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    rrd = tmp_path / "x.rrd"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "rerun,file")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("PROOFSCOPE_RERUN", f"file:{rrd}")
    telemetry = configure(out_dir=tmp_path, set_global=False)
    assert [p.sink for p in telemetry.span_processors] == ["rerun", "file"]
    assert telemetry.metric_exporters == []
    with telemetry.tracer.proof(system="gkr"):
        pass
    report = telemetry.shutdown()
    assert report.spans_exported == {"rerun": 1, "file": 1}
    assert rrd.stat().st_size > 0 and (tmp_path / "traces.jsonl").stat().st_size > 0


def test_unknown_exporter_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-over-carrier-pigeon")
    with pytest.raises(ValueError, match="zipkin-over-carrier-pigeon"):
        configure(out_dir=tmp_path, set_global=False)
