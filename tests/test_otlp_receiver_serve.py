"""`proofscope serve` end to end: official OTLP exporters → receiver → Rerun .rrd."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from serve_helpers import read_until

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.semconv import Attr, Metric

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")
from rerun.chunk import RrdReader

from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.rerun.exporter import (
    RerunMetricExporter,
    RerunSpanExporter,
)

TOKEN = "serve-token"
#: Bound on the whole `proofscope serve` subprocess run.
PROCESS_TIMEOUT_S = 60


def _prove(span_exporter: SpanExporter, metric_exporter: MetricExporter,
           service: str) -> int:
    """One two-layer proof plus one GPU gauge through the given exporters; its trace id."""
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(SimpleSpanProcessor(span_exporter))
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=60_000)
    mp = MeterProvider(metric_readers=[reader])
    pt = ProofTracer(tracer_provider=tp, meter_provider=mp)
    gauge = mp.get_meter("otel_proofscope").create_gauge(
        Metric.HW_GPU_UTILIZATION.name, unit=Metric.HW_GPU_UTILIZATION.unit)
    with pt.proof(system="gkr", layers=2, model_name=service) as proof:
        for i in range(2):
            with pt.layer(index=i, kind="MatMul" if i == 0 else "Activation", rounds=3,
                          claim_initial=9):
                for r in range(3):
                    pt.sumcheck_round(r, [r, r + 1, r + 2], 40 + r)
        gauge.set(0.5, {Attr.HW_ID: "0", Attr.HW_TYPE: "gpu"})
        with pt.verify() as v:
            v.set_verified(True)
        trace_id: int = proof.span.get_span_context().trace_id
    tp.shutdown()
    mp.shutdown()
    return trace_id


def _entities(rrd: Path) -> set[str]:
    store = RrdReader(str(rrd)).stream().collect()
    return {str(p) for p in store.schema().entity_paths()}


def _expected(trace_id: int) -> set[str]:
    """Per-proof entities of the Rerun translation ({p}: first 8 hex digits of the trace
    id); one layer-time series per layer kind shows that both layers arrived."""
    p = f"{trace_id:032x}"[:8]
    return {f"/gkr/claim/{p}", f"/gkr/remaining/{p}", f"/proof/progress/{p}",
            f"/logs/proof/{p}", f"/proof/layer_seconds/{p}/MatMul",
            f"/proof/layer_seconds/{p}/Activation"}


def test_grpc_and_http_exporters_feed_one_recording(tmp_path: Path) -> None:
    rrd = tmp_path / "serve.rrd"
    target = f"file:{rrd}"
    with OtlpReceiver([RerunSpanExporter(target)], [RerunMetricExporter(target)],
                      grpc_port=0, http_port=0, token=TOKEN) as rx:
        auth = f"Bearer {TOKEN}"
        via_grpc = _prove(
            GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True,
                             headers=(("authorization", auth),), timeout=5),
            GrpcMetricExporter(endpoint=rx.grpc_endpoint, insecure=True,
                               headers=(("authorization", auth),), timeout=5), "grpc")
        via_http = _prove(
            HttpSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces",
                             headers={"Authorization": auth}, timeout=5),
            HttpMetricExporter(endpoint=f"{rx.http_endpoint}/v1/metrics",
                               headers={"Authorization": auth}, timeout=5), "http")
        stats = rx.stats()
    assert stats["spans_accepted"] == 8 and stats["metric_points_accepted"] >= 2
    entities = _entities(rrd)
    assert _expected(via_grpc) <= entities
    assert _expected(via_http) <= entities
    assert "/gpu/device_0/util" in entities


class _Refused(SpanExporter):
    """Records what the official exporter says when the token is wrong."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.results: list[SpanExportResult] = []

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.results.append(self.inner.export(spans))
        return self.results[-1]

    def shutdown(self) -> None:
        self.inner.shutdown()


def test_proofscope_serve_subprocess(tmp_path: Path) -> None:
    rrd = tmp_path / "sub.rrd"
    env = {**os.environ, "PROOFSCOPE_SERVE_TOKEN": TOKEN, "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "0", "--rerun", f"file:{rrd}", "--max-message-bytes", "1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(PROCESS_TIMEOUT_S, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        grpc_endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        http_endpoint = read_until(proc, "OTLP/HTTP listening on", lines)
        auth = f"Bearer {TOKEN}"
        trace_id = _prove(
            GrpcSpanExporter(endpoint=grpc_endpoint, insecure=True,
                             headers=(("authorization", auth),), timeout=5),
            HttpMetricExporter(endpoint=f"{http_endpoint}/v1/metrics",
                               headers={"Authorization": auth}, timeout=5), "sub")
        refused = _Refused(HttpSpanExporter(endpoint=f"{http_endpoint}/v1/traces",
                                            headers={"Authorization": "Bearer wrong"},
                                            timeout=5))
        _prove(refused, HttpMetricExporter(endpoint=f"{http_endpoint}/v1/metrics",
                                           timeout=5), "refused")
        assert refused.results and set(refused.results) == {SpanExportResult.FAILURE}
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    assert "spans_accepted=4" in summary
    assert "dropped by the senders before sending (their dropped_*_count): none declared" \
        in summary
    # every refused request is in the exit summary: one per span export, plus the
    # metrics export that carried no token at all
    assert f"{len(refused.results)} otlp_traces_requests → otlp_receiver (unauthenticated)" \
        in summary
    assert "1 otlp_metrics_requests → otlp_receiver (unauthenticated)" in summary
    assert _expected(trace_id) <= _entities(rrd)


def test_serve_refuses_to_run_with_nothing_to_serve(capsys: pytest.CaptureFixture[str]) -> None:
    from otel_proofscope.cli import main

    assert main(["serve", "--grpc-port", "off", "--http-port", "off", "--rerun", "off"]) == 2
    assert "both transports are off" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--grpc-port", "70000"])
    with pytest.raises(SystemExit):
        main(["serve", "--max-message-bytes", "0"])


def test_senders_declared_drops_are_reported(tmp_path: Path) -> None:
    """A sender whose SDK dropped span events (its own event limit) says so in OTLP's
    dropped_events_count; serve counts what the senders declare, apart from its own drops."""
    from opentelemetry.sdk.trace import SpanLimits

    with OtlpReceiver([], [], grpc_port=0, http_port=None) as rx:
        tp = TracerProvider(span_limits=SpanLimits(max_events=2, max_span_attributes=1))
        tp.add_span_processor(SimpleSpanProcessor(
            GrpcSpanExporter(endpoint=rx.grpc_endpoint, insecure=True, timeout=5)))
        with tp.get_tracer("t").start_as_current_span("s", attributes={"a": 1, "b": 2}) as s:
            for i in range(5):
                s.add_event(f"e{i}")
        tp.shutdown()
        stats = rx.stats()
    assert stats["spans_accepted"] == 1
    assert stats["sender_dropped.span_events"] == 3
    assert stats["sender_dropped.span_attributes"] == 1
    assert "sender_dropped.span_links" not in stats
