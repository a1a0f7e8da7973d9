"""GPU cost per proof phase, measured on this machine's real wgpu adapter (Mesa lavapipe).

The demo's reference prover runs its M31 matmuls on wgpu; every phase span that ran a
dispatch must carry kernel time from real timestamp queries, the dispatch count and the
bytes moved, and these must agree with the dispatch metrics the same dispatches fed
(an independent path: histogram and counters). The proof's figures are the sums of its
phases'. wgpu has no energy: the span carries none (never 0) and the evidence says why.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from metric_helpers import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

wgpu = pytest.importorskip("wgpu")

from otel_proofscope.demo.circuit import build_network  # noqa: E402
from otel_proofscope.demo.gpu_kernels import WgpuMatmul  # noqa: E402
from otel_proofscope.demo.prover import ProveResult, prove  # noqa: E402
from otel_proofscope.gpu.evidence import EvidenceDedup  # noqa: E402
from otel_proofscope.gpu.wgpu_backend import WgpuDevice  # noqa: E402
from otel_proofscope.instrumentation import ProofTracer  # noqa: E402
from otel_proofscope.semconv import Attr, EventName, Metric, SpanName  # noqa: E402

COST_INTS = (Attr.GPU_DISPATCH_COUNT, Attr.GPU_UPLOAD_SIZE, Attr.GPU_READBACK_SIZE,
             Attr.GPU_KERNEL_TIMED_DISPATCHES)


@pytest.fixture(scope="module")
def adapter() -> Any:
    try:
        return wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except RuntimeError as exc:
        pytest.skip(f"no wgpu adapter: {exc}")


class Run:
    def __init__(self, adapter: Any, *, timestamps: bool = True) -> None:
        self.spans = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        mp = MeterProvider(metric_readers=[self.reader])
        device = WgpuDevice(adapter, meter_provider=mp, claims=EvidenceDedup(),
                            timestamps=timestamps)
        self.matmul = WgpuMatmul(device, meter_provider=mp)
        self.result: ProveResult = prove(build_network(4, 16, None, 0),
                                         tracer=ProofTracer(tp, mp), backend="wgpu",
                                         matmul=self.matmul.matmul_m31,
                                         hw_id=device.identity.hw_id)
        self.finished: list[ReadableSpan] = list(self.spans.get_finished_spans())

    def by_name(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished if s.name == name]

    def proof(self) -> ReadableSpan:
        (p,) = self.by_name(SpanName.PROOF)
        return p

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        assert parent.context is not None
        return [s for s in self.finished
                if s.parent is not None and s.parent.span_id == parent.context.span_id]


@pytest.fixture(scope="module")
def run(adapter: Any) -> Run:
    return Run(adapter)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_the_proof_ran_gpu_work_and_verified(run: Run) -> None:
    assert run.result.verified
    assert run.matmul.runtime.dispatches > 0
    gpu_spans = [s for s in run.finished if Attr.GPU_DISPATCH_COUNT in _attrs(s)]
    # The forward pass and the matmul layers dispatch; CPU-only phases carry nothing.
    assert {s.name for s in gpu_spans} >= {SpanName.PROOF, SpanName.WITNESS, SpanName.LAYER}
    for s in run.finished:
        if s not in gpu_spans:
            assert not any(k.startswith("gpu.") for k in _attrs(s)), s.name


def test_every_gpu_span_carries_measured_kernel_time_and_busy_ratio(run: Run) -> None:
    for s in run.finished:
        a = _attrs(s)
        if Attr.GPU_DISPATCH_COUNT not in a:
            continue
        assert a[Attr.GPU_DISPATCH_COUNT] > 0
        # lavapipe has timestamp-query: every dispatch was timed.
        assert a[Attr.GPU_KERNEL_TIMED_DISPATCHES] == a[Attr.GPU_DISPATCH_COUNT]
        assert a[Attr.GPU_KERNEL_TIME] > 0
        assert a[Attr.GPU_UPLOAD_SIZE] > 0 and a[Attr.GPU_READBACK_SIZE] > 0
        assert s.start_time is not None and s.end_time is not None
        span_s = (s.end_time - s.start_time) / 1e9
        # ratio = kernel / duration, the duration measured inside the span (just after it
        # started, just before it ended): at most the span's, and close to it.
        assert 0 < a[Attr.GPU_BUSY_RATIO] <= 1.0
        phase_s = a[Attr.GPU_KERNEL_TIME] / a[Attr.GPU_BUSY_RATIO]
        assert span_s - max(0.05 * span_s, 0.02) <= phase_s <= span_s + 1e-6
        assert Attr.GPU_ENERGY not in a  # wgpu has none, and never a 0 in its place


def test_proof_totals_are_the_sums_over_its_phases(run: Run) -> None:
    proof = run.proof()
    pa = _attrs(proof)
    phases = run.children(proof)
    for key in COST_INTS:
        assert pa[key] == sum(_attrs(c).get(key, 0) for c in phases), key
    assert pa[Attr.GPU_KERNEL_TIME] == pytest.approx(
        sum(_attrs(c).get(Attr.GPU_KERNEL_TIME, 0.0) for c in phases), rel=1e-12)
    # And each layer's figures include its weight opening's (inclusive, like duration).
    for layer in run.by_name(SpanName.LAYER):
        la = _attrs(layer)
        below = sum(_attrs(c).get(Attr.GPU_DISPATCH_COUNT, 0) for c in run.children(layer))
        assert la.get(Attr.GPU_DISPATCH_COUNT, 0) >= below


def test_span_figures_agree_with_the_dispatch_metrics(run: Run) -> None:
    """Two independent paths from the same dispatches: span attributes and metrics."""
    pa = _attrs(run.proof())
    points = metric_points(run.reader)
    assert pa[Attr.GPU_DISPATCH_COUNT] == run.matmul.runtime.dispatches == sum(
        p.value for p in points[Metric.GPU_DISPATCH_COUNT.name])
    assert pa[Attr.GPU_UPLOAD_SIZE] == sum(p.value for p in points[Metric.GPU_UPLOAD_SIZE.name])
    assert pa[Attr.GPU_READBACK_SIZE] == sum(
        p.value for p in points[Metric.GPU_READBACK_SIZE.name])
    (kernel,) = points[Metric.GPU_KERNEL_DURATION.name]
    assert kernel.count == pa[Attr.GPU_KERNEL_TIMED_DISPATCHES]
    assert math.isclose(kernel.sum, pa[Attr.GPU_KERNEL_TIME], rel_tol=1e-9)


def test_per_phase_metrics_count_each_phase_once(run: Run) -> None:
    """gpu.phase.* count a phase's own work, so summing over phases gives the proof's."""
    pa = _attrs(run.proof())
    points = metric_points(run.reader)
    kernel = points[Metric.GPU_PHASE_KERNEL_TIME.name]
    assert math.isclose(sum(p.value for p in kernel), pa[Attr.GPU_KERNEL_TIME], rel_tol=1e-9)
    phases = {dict(p.attributes)[Attr.PROOF_PHASE] for p in kernel}
    assert SpanName.WITNESS in phases and SpanName.LAYER in phases
    assert all(dict(p.attributes)[Attr.PROOF_BACKEND] == "wgpu" for p in kernel)
    transfer = points[Metric.GPU_PHASE_TRANSFER_SIZE.name]
    by_dir: dict[str, int] = {}
    for p in transfer:
        d = dict(p.attributes)[Attr.NETWORK_IO_DIRECTION]
        by_dir[d] = by_dir.get(d, 0) + p.value
    assert by_dir == {"transmit": pa[Attr.GPU_UPLOAD_SIZE],
                      "receive": pa[Attr.GPU_READBACK_SIZE]}
    assert Metric.GPU_PHASE_ENERGY.name not in points  # nothing measured, nothing counted


def test_result_and_energy_gap_are_reported(run: Run) -> None:
    cost = run.result.gpu_cost
    assert cost is not None
    assert cost.dispatches == _attrs(run.proof())[Attr.GPU_DISPATCH_COUNT]
    assert cost.energy is None and cost.energy_gap is not None
    assert cost.energy_gap.reason.value == "unsupported"
    # The runtime's evidence says why on the first GPU span: energy unsupported on wgpu.
    energy_events = [e for s in run.finished for e in s.events
                     if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED
                     and (e.attributes or {}).get(Attr.GPU_CAPABILITY) == "energy"]
    assert energy_events
    assert all((e.attributes or {})[Attr.GPU_CAPABILITY_REASON] == "unsupported"
               for e in energy_events)


def test_without_timestamps_there_is_no_kernel_time_and_no_busy_ratio(adapter: Any) -> None:
    r = Run(adapter, timestamps=False)
    pa = _attrs(r.proof())
    assert pa[Attr.GPU_DISPATCH_COUNT] > 0 and pa[Attr.GPU_UPLOAD_SIZE] > 0
    for s in r.finished:
        a = _attrs(s)
        assert Attr.GPU_KERNEL_TIME not in a and Attr.GPU_BUSY_RATIO not in a, s.name
    cost = r.result.gpu_cost
    assert cost is not None and cost.kernel_time is None and cost.busy_ratio is None
