"""Rerun metric translation: real SDK instruments → RerunMetricExporter → .rrd → read back."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import rerun as rr
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.columns import PROOF_TIME
from otel_proofscope.rerun.exporter import RerunMetricExporter, RerunSpanExporter
from otel_proofscope.semconv import SECONDS_BUCKETS, Attr, Metric

GIB = 1 << 30
DEV = {Attr.HW_ID: "gpu0", Attr.HW_TYPE: "gpu", Attr.GPU_BACKEND: "wgpu"}


@pytest.fixture(autouse=True)
def _strict_rerun() -> Iterator[None]:
    previous = rr.strict_mode()
    rr.set_strict_mode(True)
    yield
    rr.set_strict_mode(previous)


class Gpu:
    """Real SDK instruments, named and attributed as the GPU evidence module does."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter("otel_proofscope")
        self.util = 0.25
        self.used = 2 * GIB
        meter.create_observable_gauge(Metric.HW_GPU_UTILIZATION.name, [self._util])
        meter.create_observable_up_down_counter(Metric.HW_GPU_MEMORY_USAGE.name, [self._used])
        meter.create_observable_up_down_counter(Metric.HW_GPU_MEMORY_LIMIT.name, [self._limit])
        self.kernel = meter.create_histogram(Metric.GPU_KERNEL_DURATION.name, "s",
                                             explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.wait = meter.create_histogram(Metric.GPU_QUEUE_WAIT_DURATION.name, "s",
                                           explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.upload = meter.create_counter(Metric.GPU_UPLOAD_SIZE.name, "By")
        self.upload_s = meter.create_histogram(Metric.GPU_UPLOAD_DURATION.name, "s",
                                               explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.dispatch = meter.create_counter(Metric.GPU_DISPATCH_COUNT.name)
        self.gap = meter.create_counter(Metric.GPU_CAPABILITY_UNSUPPORTED.name)

    def _util(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.util, DEV)

    def _used(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.used, DEV)

    def _limit(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(8 * GIB, DEV)


def test_gpu_series_from_real_instruments(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    gpu = Gpu(provider)
    exporter = RerunMetricExporter(f"file:{tmp_path / 'm.rrd'}")
    gap = {Attr.GPU_BACKEND: "wgpu", Attr.GPU_CAPABILITY: "occupancy",
           Attr.GPU_CAPABILITY_REASON: "unsupported"}

    # Interval 1: kernels 1 ms and 3 ms, 4 MB uploaded in 2 ms.
    gpu.kernel.record(0.001, DEV)
    gpu.kernel.record(0.003, DEV)
    gpu.wait.record(0.0005, DEV)
    gpu.upload.add(4_000_000, DEV)
    gpu.upload_s.record(0.002, DEV)
    gpu.dispatch.add(2, DEV)
    gpu.gap.add(1, gap)
    first = reader.get_metrics_data()
    assert first is not None
    # The SDK default: cumulative points, which the translation differences itself.
    assert {m.data.aggregation_temporality for rm in first.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics
            if hasattr(m.data, "aggregation_temporality")} == {AggregationTemporality.CUMULATIVE}
    exporter.export(first)
    # Interval 2: one 10 ms kernel, 1 MB in 1 ms; the same gap again (no new row).
    gpu.util, gpu.used = 0.75, 3 * GIB
    gpu.kernel.record(0.010, DEV)
    gpu.upload.add(1_000_000, DEV)
    gpu.upload_s.record(0.001, DEV)
    gpu.gap.add(1, gap)
    second = reader.get_metrics_data()
    assert second is not None
    exporter.export(second)
    assert exporter.force_flush(30_000)
    exporter.shutdown()
    provider.shutdown()

    rec = readback.read(tmp_path / "m.rrd")
    dev = "/gpu/device_gpu0"

    def series(name: str) -> list[float]:
        return [r.values["Scalars:scalars"][0] for r in rec.rows(f"{dev}/{name}")]

    assert series("util") == pytest.approx([0.25, 0.75])
    assert series("memory_used_gib") == pytest.approx([2.0, 3.0])
    assert series("memory_limit_gib") == pytest.approx([8.0, 8.0])
    assert series("kernel_ms") == pytest.approx([2.0, 10.0])  # mean per interval
    assert series("queue_wait_ms") == pytest.approx([0.5])  # no waits in interval 2
    assert series("upload_gb_per_s") == pytest.approx([2.0, 1.0])  # bytes / transfer time
    rate = series("dispatches_per_s")
    assert rate[0] > 0 and rate[1] == 0.0  # 2 dispatches, then none
    # Rows carry the data points' own timestamps.
    points = {m.name: m.data.data_points[0].time_unix_nano
              for rm in second.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert rec.rows(f"{dev}/kernel_ms")[-1].times[PROOF_TIME] == \
        points[Metric.GPU_KERNEL_DURATION.name]
    assert rec.static(f"{dev}/util")["SeriesLines:names"] == ["device_gpu0 utilization (fraction)"]
    # The capability gap: a table row and one warning, not once per export.
    tables = rec.values("/gpu/capability_gaps", "TextDocument:text")
    assert len(tables) == 1
    assert "| wgpu | ? | occupancy | unsupported |" in tables[0][0]
    warnings = rec.rows("/logs/gpu")
    assert [r.values["TextLog:level"] for r in warnings] == [["WARN"]]
    assert DROPS.total() == 0


def test_spans_and_metrics_share_one_recording(tmp_path: Path) -> None:
    target = f"file:{tmp_path / 'shared.rrd'}"
    spans = RerunSpanExporter(target)
    metrics = RerunMetricExporter(target)
    assert spans.sink is metrics.sink  # one sink per target
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracer = ProofTracer(tracer_provider, meter_provider)
    with tracer.proof(system="gkr", layers=1), tracer.layer(index=0, kind="MatMul", rounds=1):
        tracer.sumcheck_round(0, [1, 2], 3)
    data = reader.get_metrics_data()
    assert data is not None
    metrics.export(data)
    spans.shutdown()  # the sink stays open for the metric exporter
    metrics.export(data)
    metrics.shutdown()
    assert readback.recording_count(tmp_path / "shared.rrd") == 1
    rec = readback.read(tmp_path / "shared.rrd")
    assert "/gkr/walk/nodes" in rec.paths()
    proof_series = [p for p in rec.paths() if p.startswith("/proof/layer_duration/")]
    assert proof_series == ["/proof/layer_duration/cpu_MatMul_gkr"]
    assert DROPS.total() == 0


def test_configure_pipeline_draws_spans_and_metrics(tmp_path: Path) -> None:
    """The lead's configure(): Rerun next to the file sinks, one recording, nothing lost."""
    from otel_proofscope.setup import configure

    out = tmp_path / "live.rrd"
    telemetry = configure(service_name="rerun-test", out_dir=tmp_path / "otlp",
                          rerun=f"file:{out}", set_global=False, handle_sigterm=False)
    tracer = telemetry.tracer
    with tracer.proof(system="gkr", layers=2) as proof:
        for i in (1, 0):
            with tracer.layer(index=i, kind="MatMul", rounds=2, claim_initial=(1, 2, 3, 4)):
                tracer.sumcheck_round(0, [(1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0)],
                                      (5, 0, 0, 0))
                tracer.sumcheck_round(1, [(2, 0, 0, 0), (3, 0, 0, 0), (4, 0, 0, 0)],
                                      (6, 0, 0, 0))
        proof.set_result(layer_proofs=2, verified=True)
    report = telemetry.shutdown()
    assert not report.timed_out
    assert DROPS.total(sink="rerun") == 0
    rec = readback.read(out)
    [key] = [p.rsplit("/", 1)[-1] for p in rec.paths() if p.startswith("/gkr/claim/")]
    assert len(rec.rows(f"/gkr/claim/{key}")) == 4
    assert rec.rows(f"/proof/progress/{key}")[-1].values["Scalars:scalars"] == [1.0]
    # The pipeline's own instruments arrive through the metric exporter.
    assert any(p.startswith("/proof/layer_duration/") for p in rec.paths())
