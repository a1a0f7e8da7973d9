"""Dispatch accounting (GpuRuntime) through a real SDK pipeline, backend-independent.

Values here are given to the API explicitly so every metric can be checked exactly;
tests/test_gpu_wgpu.py checks the same API against real wgpu measurements.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from metric_helpers import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.gpu import evidence
from otel_proofscope.gpu.backend import DeviceIdentity, Gap, HwState
from otel_proofscope.gpu.dispatch import (
    FAULT_DEVICE_LOST,
    FAULT_OUT_OF_MEMORY,
    GpuRuntime,
    default_fault_kind,
)
from otel_proofscope.gpu.evidence import EvidenceDedup
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import REJECTIONS
from otel_proofscope.semconv import Attr, EventName, GapReason, GpuCapability, Metric

IDENT = DeviceIdentity(backend="cuda", hw_id="GPU-test-0", name="Test GPU", vendor="NVIDIA",
                       driver_version="550.1", pci_vendor_id=0x10DE, pci_device_id=0x2330)
GAPS = [Gap(GpuCapability.OCCUPANCY, GapReason.UNSUPPORTED, "no profiler"),
        Gap(GpuCapability.STALL_COUNTERS, GapReason.PERMISSION_DENIED, "profiling restricted")]


class Env:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tp = TracerProvider()
        self.tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])
        self.tracer = ProofTracer(self.tp, self.mp)
        self.claims = EvidenceDedup()

    def runtime(self, **kw: Any) -> GpuRuntime:
        return GpuRuntime(IDENT, gaps=kw.pop("gaps", GAPS), meter_provider=self.mp,
                          claims=self.claims, **kw)

    def points(self) -> dict[str, list[Any]]:
        return metric_points(self.reader)

    def one(self, name: str) -> Any:
        pts = self.points()[name]
        assert len(pts) == 1, pts
        return pts[0]


@pytest.fixture
def env() -> Iterator[Env]:
    evidence.reset_dispatch_state()
    e = Env()
    yield e
    e.mp.shutdown()
    e.tp.shutdown()
    evidence.reset_dispatch_state()


def test_every_dispatch_metric_recorded_exactly(env: Env) -> None:
    rt = env.runtime()
    with rt.dispatch() as d:
        d.record_upload(4096, 0.002)
        d.record_upload(1024, 0.001)
        d.record_submit(0.010)
        d.record_kernel(0.0075)
        d.record_readback(2048, 0.003)
    with rt.dispatch() as d:
        d.record_kernel_timestamps(1_000, 5_000, period_ns=2.0)  # 8 µs
        d.record_submit(0.000020)
    attrs = {Attr.GPU_BACKEND: "cuda", Attr.HW_ID: "GPU-test-0"}
    assert env.one(Metric.GPU_DISPATCH_COUNT.name).value == 2
    assert dict(env.one(Metric.GPU_DISPATCH_COUNT.name).attributes) == attrs
    assert env.one(Metric.GPU_UPLOAD_SIZE.name).value == 5120
    up = env.one(Metric.GPU_UPLOAD_DURATION.name)
    assert (up.count, up.sum) == (2, pytest.approx(0.003))
    assert list(up.explicit_bounds) == list(Metric.GPU_UPLOAD_DURATION.buckets or ())
    assert env.one(Metric.GPU_READBACK_SIZE.name).value == 2048
    assert env.one(Metric.GPU_READBACK_DURATION.name).sum == pytest.approx(0.003)
    sub = env.one(Metric.GPU_SUBMIT_DURATION.name)
    assert (sub.count, sub.sum) == (2, pytest.approx(0.010020))
    ker = env.one(Metric.GPU_KERNEL_DURATION.name)
    assert (ker.count, ker.sum) == (2, pytest.approx(0.0075 + 8e-6))
    wait = env.one(Metric.GPU_QUEUE_WAIT_DURATION.name)
    assert (wait.count, wait.sum) == (2, pytest.approx(0.0025 + 12e-6))
    assert rt.dispatches == 2


def test_context_managers_time_their_block(env: Env) -> None:
    rt = env.runtime()
    with rt.dispatch() as d:
        with d.upload(10):
            sum(range(1000))
        with d.submit():
            sum(range(1000))
        with d.readback(20):
            pass
    assert d.submit_s is not None and d.submit_s > 0
    assert env.one(Metric.GPU_UPLOAD_SIZE.name).value == 10
    assert env.one(Metric.GPU_READBACK_SIZE.name).value == 20
    assert env.one(Metric.GPU_UPLOAD_DURATION.name).count == 1
    # No kernel time was measured, so no queue wait can be derived.
    assert Metric.GPU_QUEUE_WAIT_DURATION.name not in env.points()


def test_kernel_longer_than_submit_is_rejected_not_recorded_negative(env: Env) -> None:
    rt = env.runtime()
    before = REJECTIONS.total()
    with rt.dispatch() as d:
        d.record_submit(0.001)
        d.record_kernel(0.002)
    assert Metric.GPU_QUEUE_WAIT_DURATION.name not in env.points()
    assert REJECTIONS.snapshot()[("gpu.queue.wait.duration", "kernel_exceeds_submit")] >= 1
    assert REJECTIONS.total() == before + 1


def test_reversed_timestamps_rejected(env: Env) -> None:
    rt = env.runtime()
    with rt.dispatch() as d:
        d.record_kernel_timestamps(10, 5, 1.0)
    assert d.kernel_s is None
    assert Metric.GPU_KERNEL_DURATION.name not in env.points()


def test_alloc_free_resident_and_peak_exact(env: Env) -> None:
    rt = env.runtime()
    sizes = [1 << 20, 3, 4096, (1 << 33) + 7]
    for s in sizes:
        rt.alloc(s)
    rt.free(4096)
    rt.alloc(10)
    rt.free(3)
    assert rt.resident_bytes == (1 << 20) + (1 << 33) + 7 + 10
    assert rt.peak_resident_bytes == sum(sizes)
    assert env.one(Metric.GPU_ALLOC_COUNT.name).value == 5
    assert env.one(Metric.GPU_ALLOC_SIZE.name).value == sum(sizes) + 10
    assert env.one(Metric.GPU_FREE_SIZE.name).value == 4099
    assert env.one(Metric.GPU_MEMORY_RESIDENT.name).value == rt.resident_bytes
    assert env.one(Metric.GPU_MEMORY_RESIDENT_PEAK.name).value == sum(sizes)


def test_free_beyond_resident_clamps_and_is_rejected(env: Env) -> None:
    rt = env.runtime()
    rt.alloc(100)
    rt.free(250)
    assert rt.resident_bytes == 0
    assert env.one(Metric.GPU_FREE_SIZE.name).value == 100
    assert REJECTIONS.snapshot()[("gpu.free", "exceeds_resident")] == 1


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_byte_counts_raise(env: Env, bad: Any) -> None:
    rt = env.runtime()
    with pytest.raises(ValueError, match="byte count"):
        rt.alloc(bad)


def test_first_dispatch_emits_identity_and_gaps_on_active_span_once(env: Env) -> None:
    rt = env.runtime()
    rt.alloc(64)  # acquisition and allocation alone stay silent
    assert Metric.GPU_CAPABILITY_UNSUPPORTED.name not in env.points()
    with env.tracer.proof(system="gkr", backend="cuda"):
        with rt.dispatch():
            pass
        with rt.dispatch():
            pass
    (proof,) = env.spans.get_finished_spans()
    names = [e.name for e in proof.events]
    assert names.count(EventName.GPU_ADAPTER_ACQUIRED) == 1
    assert names.count(EventName.GPU_CAPABILITY_UNSUPPORTED) == 2
    ident = next(e for e in proof.events if e.name == EventName.GPU_ADAPTER_ACQUIRED)
    assert ident.attributes is not None
    assert ident.attributes[Attr.GPU_PCI_VENDOR_ID] == 0x10DE
    assert ident.attributes[Attr.GPU_PCI_DEVICE_ID] == 0x2330
    assert ident.attributes[Attr.HW_NAME] == "Test GPU"
    gaps = {e.attributes[Attr.GPU_CAPABILITY]: e.attributes[Attr.GPU_CAPABILITY_REASON]
            for e in proof.events if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED
            and e.attributes is not None}
    assert gaps == {"occupancy": "unsupported", "stall_counters": "permission-denied"}
    counts = {(dict(p.attributes)[Attr.GPU_CAPABILITY], p.value)
              for p in env.points()[Metric.GPU_CAPABILITY_UNSUPPORTED.name]}
    assert counts == {("occupancy", 1), ("stall_counters", 1)}


def test_gaps_logged_once_each(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    rt = env.runtime()
    with caplog.at_level(logging.INFO, logger="otel_proofscope.gpu"):
        for _ in range(3):
            with rt.dispatch():
                pass
    gap_lines = [r for r in caplog.records if "capability unsupported" in r.getMessage()]
    assert len(gap_lines) == 2


def test_a_second_runtime_reports_its_own_evidence(env: Env) -> None:
    with env.tracer.proof(system="gkr", backend="cuda"):
        for rt in (env.runtime(), env.runtime()):
            with rt.dispatch():
                pass
    (proof,) = env.spans.get_finished_spans()
    assert [e.name for e in proof.events].count(EventName.GPU_ADAPTER_ACQUIRED) == 2


def test_gap_found_after_first_dispatch_is_reported_at_once(env: Env) -> None:
    rt = env.runtime(gaps=[])
    with env.tracer.proof(system="gkr", backend="cuda"):
        with rt.dispatch():
            pass
        assert rt.report_gap(Gap(GpuCapability.KERNEL_TIMESTAMPS, GapReason.DRIVER_ERROR,
                                 "query set creation failed"))
        assert not rt.report_gap(Gap(GpuCapability.KERNEL_TIMESTAMPS, GapReason.DRIVER_ERROR))
    assert not rt.measures(GpuCapability.KERNEL_TIMESTAMPS)
    (proof,) = env.spans.get_finished_spans()
    assert [e.name for e in proof.events].count(EventName.GPU_CAPABILITY_UNSUPPORTED) == 1


def test_exception_in_dispatch_is_a_fault_and_reraised(env: Env) -> None:
    rt = env.runtime()
    with (env.tracer.proof(system="gkr", backend="cuda"),
          pytest.raises(RuntimeError, match="device lost"), rt.dispatch()):
        raise RuntimeError("device lost while waiting")
    fault = env.one(Metric.GPU_FAULT_COUNT.name)
    assert fault.value == 1
    assert dict(fault.attributes)[Attr.GPU_FAULT_KIND] == FAULT_DEVICE_LOST
    assert env.one(Metric.GPU_DISPATCH_COUNT.name).value == 1
    assert rt.state is HwState.FAILED
    (proof,) = env.spans.get_finished_spans()
    ev = [e for e in proof.events if e.name == EventName.GPU_FAULT]
    assert len(ev) == 1 and ev[0].attributes is not None
    assert ev[0].attributes[Attr.GPU_FAULT_KIND] == FAULT_DEVICE_LOST
    status = {dict(p.attributes)[Attr.HW_STATE]: p.value
              for p in env.points()[Metric.HW_STATUS.name]}
    assert status == {"ok": 0, "degraded": 0, "failed": 1}


def test_retry_recovery_residual(env: Env) -> None:
    rt = env.runtime()
    with env.tracer.proof(system="gkr", backend="cuda"):
        rt.fault(FAULT_OUT_OF_MEMORY)
        rt.retry(1)
        rt.retry(2)
        rt.recovery("cpu")
        rt.residual_batch(3)
    assert rt.state is HwState.OK  # out of memory is not fatal
    assert env.one(Metric.GPU_RETRY_COUNT.name).value == 2
    assert env.one(Metric.GPU_RECOVERY_COUNT.name).value == 1
    assert env.one(Metric.GPU_RESIDUAL_BATCH_COUNT.name).value == 3
    (proof,) = env.spans.get_finished_spans()
    retries = [e.attributes[Attr.GPU_RETRY_ATTEMPT] for e in proof.events
               if e.name == EventName.GPU_RETRY and e.attributes is not None]
    assert retries == [1, 2]
    rec = [e for e in proof.events if e.name == EventName.GPU_RECOVERY]
    assert rec[0].attributes is not None and rec[0].attributes[Attr.GPU_RECOVERY_ROUTE] == "cpu"


def test_unused_runtime_and_cpu_proof_emit_no_gpu_telemetry(env: Env) -> None:
    env.runtime()  # a runtime that is never dispatched on
    with env.tracer.proof(system="gkr", backend="cpu"), env.tracer.layer(index=0,
                                                                         kind="MatMul"):
        pass
    names = set(env.points())
    assert not {n for n in names if n.startswith(("gpu.", "hw."))}, names
    for span in env.spans.get_finished_spans():
        assert not [e for e in span.events if e.name.startswith("gpu.")]


@pytest.mark.parametrize(("exc", "kind"), [
    (RuntimeError("Parent device is lost"), "device_lost"),
    (MemoryError(), "out_of_memory"),
    (type("GPUOutOfMemoryError", (Exception,), {})("x"), "out_of_memory"),
    (TimeoutError(), "timeout"),
    (type("GPUValidationError", (Exception,), {})("bad bind group"), "validation"),
    (ValueError("whatever"), "dispatch"),
])
def test_default_fault_kind(exc: BaseException, kind: str) -> None:
    assert default_fault_kind(exc) == kind
