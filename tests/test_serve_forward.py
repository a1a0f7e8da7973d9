"""`proofscope serve --forward`: what serve receives goes on over OTLP to a real
receiver on 127.0.0.1, mapped (the original name kept), with the proof metrics the
mapped spans imply, so Grafana sees a foreign prover; forwarding to serve itself is
refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_helpers import read_until

from otel_proofscope.semconv import Attr, Metric

PROCESS_TIMEOUT_S = 60

RULES = """
[meta]
name = "toy"
system = "toyvm"

[[span]]
match = "toy_prove"
to = "proof"

[[span]]
match = "toy_sumcheck"
to = "layer"

[[span]]
match = "toy_round"
to = "round"
"""


class Collector(trace_service_pb2_grpc.TraceServiceServicer,  # type: ignore[misc]
                metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
    """A real OTLP/gRPC receiver for both signals; records what arrives."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            if isinstance(request, ExportTraceServiceRequest):
                self.traces.append(request)
                return ExportTraceServiceResponse()
            self.metrics.append(request)
            return ExportMetricsServiceResponse()

    def spans(self) -> list[Any]:
        return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans
                for s in ss.spans]

    def metric_names(self) -> set[str]:
        return {m.name for r in self.metrics for rm in r.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    c = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(c, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(c, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield c, port
    server.stop(0)


def _foreign_proof() -> list[Any]:
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource({"service.name": "toy-prover"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("toy")
    with tracer.start_as_current_span("toy_prove"):
        for _ in range(2):
            with tracer.start_as_current_span("toy_sumcheck"):
                for _ in range(3):
                    with tracer.start_as_current_span("toy_round"):
                        pass
        with tracer.start_as_current_span("unrelated"):
            pass
    tp.shutdown()
    return list(memory.get_finished_spans())


def _serve(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    return subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", "off", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_serve_forwards_mapped_spans_and_proof_metrics(
        tmp_path: Path, collector: tuple[Collector, int]) -> None:
    received, port = collector
    rules = tmp_path / "toy.toml"
    rules.write_text(RULES)
    proc = _serve(tmp_path, "--map", str(rules), "--forward", f"http://127.0.0.1:{port}")
    killer = threading.Timer(PROCESS_TIMEOUT_S, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        read_until(proc, "forwarding to", lines)
        exporter = GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
        assert exporter.export(_foreign_proof()).name == "SUCCESS"
        exporter.shutdown()
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None and proc.stderr is not None
        out = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(PROCESS_TIMEOUT_S)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    spans = received.spans()
    names = sorted(s.name for s in spans)
    # mapped names; the rounds are events of their layer too; the rest forwarded as is
    assert names == ["proof", "proof.layer", "proof.layer", *["toy_round"] * 6,
                     "unrelated"], (names, summary, err)
    source = {s.name: {kv.key: kv.value.string_value for kv in s.attributes}
              .get(Attr.MAPPING_SOURCE_NAME) for s in spans}
    assert source["proof"] == "toy_prove" and source["proof.layer"] == "toy_sumcheck"
    layers = [s for s in spans if s.name == "proof.layer"]
    assert all(sum(e.name == "proof.sumcheck.round" for e in s.events) == 3 for s in layers)
    metric_names = received.metric_names()
    assert {Metric.PROOF_DURATION.name, Metric.PROOF_LAYER_DURATION.name,
            Metric.PROOF_SUMCHECK_ROUND_COUNT.name} <= metric_names, metric_names
    rounds = [dp.as_int for r in received.metrics for rm in r.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics
              if m.name == Metric.PROOF_SUMCHECK_ROUND_COUNT.name
              for dp in m.sum.data_points]
    assert rounds and rounds[-1] == 6
    assert "forwarded to http://127.0.0.1:" in summary and ": 10 spans" in summary, summary


def test_serve_refuses_to_forward_to_itself(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "--forward", "http://127.0.0.1:4317", "--grpc-port", "4317")
    try:
        _, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert "--forward" in err and "loop" in err


def test_serve_counts_what_it_cannot_forward(tmp_path: Path) -> None:
    """A forward endpoint that is down: every span is counted, never lost silently."""
    import socket

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    proc = _serve(tmp_path, "--forward", f"http://127.0.0.1:{dead}")
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        exporter = GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
        assert exporter.export(_foreign_proof()).name == "SUCCESS"
        exporter.shutdown()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    assert ": 0 spans" in summary
    lost = sum(int(n) for n, reason in re.findall(
        r"(\d+) spans → forward \((\w+)\)", summary))
    assert lost == 10, summary
