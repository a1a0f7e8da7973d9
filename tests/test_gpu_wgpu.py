"""Real wgpu on this machine's adapter (Mesa lavapipe in CI): the M31 matmul kernel,
its dispatch accounting from real measurements, timestamps, the expected gaps, faults.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from metric_helpers import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

wgpu = pytest.importorskip("wgpu")

from otel_proofscope.demo.gpu_kernels import (  # noqa: E402
    P,
    WgpuMatmul,
    matmul_m31_reference,
)
from otel_proofscope.gpu import evidence  # noqa: E402
from otel_proofscope.gpu.backend import HwState  # noqa: E402
from otel_proofscope.gpu.evidence import EvidenceDedup  # noqa: E402
from otel_proofscope.gpu.wgpu_backend import (  # noqa: E402
    WgpuBackend,
    WgpuDevice,
    adapter_gaps,
    adapter_identity,
    backend_name,
)
from otel_proofscope.instrumentation import ProofTracer  # noqa: E402
from otel_proofscope.ledger import REJECTIONS  # noqa: E402
from otel_proofscope.semconv import Attr, EventName, GapReason, GpuCapability, Metric  # noqa: E402

WGPU_GAPS = {"utilization", "occupancy", "stall_counters", "memory_usage", "memory_limit",
             "pcie_io", "errors", "power", "energy", "temperature", "clocks"}


@pytest.fixture(scope="module")
def adapter() -> Any:
    try:
        return wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except RuntimeError as exc:
        pytest.skip(f"no wgpu adapter: {exc}")


class Env:
    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.spans = InMemorySpanExporter()
        self.tp = TracerProvider()
        self.tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])
        self.tracer = ProofTracer(self.tp, self.mp)
        self.claims = EvidenceDedup()

    def matmul(self, **kw: Any) -> WgpuMatmul:
        timestamps = kw.pop("timestamps", True)
        dev = WgpuDevice(self.adapter, meter_provider=self.mp, claims=self.claims,
                         timestamps=timestamps)
        return WgpuMatmul(dev, **kw)

    def points(self) -> dict[str, list[Any]]:
        return metric_points(self.reader)


@pytest.fixture
def env(adapter: Any) -> Iterator[Env]:
    evidence.reset_dispatch_state()
    e = Env(adapter)
    yield e
    e.mp.shutdown()
    e.tp.shutdown()
    evidence.reset_dispatch_state()


def rand(rng: np.random.Generator, shape: tuple[int, int], near_p: bool = False) -> np.ndarray:
    if near_p:
        return rng.integers(P - 1000, P, size=shape, dtype=np.int64)
    return rng.integers(0, P, size=shape, dtype=np.int64)


def python_matmul(a: np.ndarray, b: np.ndarray) -> list[list[int]]:
    """Independent reference in arbitrary-precision Python ints."""
    al, bl = a.tolist(), b.tolist()
    return [[sum(al[i][x] * bl[x][j] for x in range(len(bl))) % P
             for j in range(len(bl[0]))] for i in range(len(al))]


# ── correctness ──────────────────────────────────────────────────────────────────────


def test_matmul_m31_equals_reference(env: Env) -> None:
    mm = env.matmul(fallback_to_cpu=False)
    rng = np.random.default_rng(20240531)
    cases = [((1, 1, 1), False), ((3, 5, 7), False), ((33, 100, 17), False),
             ((64, 64, 64), False), ((9, 257, 8), True), ((16, 40, 24), True)]
    for (n, k, m), near in cases:
        a, b = rand(rng, (n, k), near), rand(rng, (k, m), near)
        got = mm.matmul_m31(a, b)
        assert got.dtype == np.uint64 and got.shape == (n, m)
        assert np.array_equal(got, matmul_m31_reference(a, b)), (n, k, m, near)
    # Extremes: all p-1 (largest products), zeros, and a tiny case against Python ints.
    full = np.full((8, 300), P - 1, dtype=np.int64)
    assert np.array_equal(mm.matmul_m31(full, full.T.copy()),
                          matmul_m31_reference(full, full.T))
    assert not mm.matmul_m31(np.zeros((4, 4), np.int64), full[:4, :4]).any()
    a, b = rand(rng, (5, 6), True), rand(rng, (6, 3))
    assert mm.matmul_m31(a, b).tolist() == python_matmul(a, b)
    assert mm.runtime.resident_bytes == 0


def test_input_validation(env: Env) -> None:
    mm = env.matmul()
    ok = np.ones((2, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="2-D"):
        mm.matmul_m31(np.ones(3, np.int64), ok)
    with pytest.raises(ValueError, match="integers"):
        mm.matmul_m31(ok.astype(float), ok)
    with pytest.raises(ValueError, match=r"\[0, 2\^31 - 1\)"):
        mm.matmul_m31(ok * P, ok)
    with pytest.raises(ValueError, match=r"\[0, 2\^31 - 1\)"):
        mm.matmul_m31(-ok, ok)
    with pytest.raises(ValueError, match="inner dimensions"):
        mm.matmul_m31(np.ones((2, 3), np.int64), ok)
    empty = mm.matmul_m31(np.ones((3, 0), np.int64), np.ones((0, 4), np.int64))
    assert empty.shape == (3, 4) and not empty.any()
    assert mm.runtime.dispatches == 0  # validation and empty products dispatch nothing


# ── dispatch accounting from real measurements ───────────────────────────────────────


def test_every_dispatch_metric_from_a_real_dispatch(env: Env) -> None:
    mm = env.matmul(fallback_to_cpu=False)
    assert mm.device.timestamps, "lavapipe and llvmpipe both support timestamp-query"
    n, k, m = 20, 33, 17
    rng = np.random.default_rng(1)
    mm.matmul_m31(rand(rng, (n, k)), rand(rng, (k, m)))
    pts = env.points()

    def one(metric: Any) -> Any:
        (p,) = pts[metric.name]
        assert dict(p.attributes) == {Attr.GPU_BACKEND: mm.device.identity.backend,
                                      Attr.HW_ID: mm.device.identity.hw_id}
        return p

    a_b, b_b, c_b, dims_b, ts_b = n * k * 4, k * m * 4, n * m * 4, 16, 16
    staging = (c_b + 7) // 8 * 8 + ts_b
    allocs = [a_b, b_b, c_b, dims_b, staging, ts_b]
    assert one(Metric.GPU_DISPATCH_COUNT).value == 1
    assert one(Metric.GPU_UPLOAD_SIZE).value == a_b + b_b + dims_b
    assert one(Metric.GPU_READBACK_SIZE).value == c_b + ts_b
    assert one(Metric.GPU_ALLOC_COUNT).value == len(allocs)
    assert one(Metric.GPU_ALLOC_SIZE).value == sum(allocs)
    assert one(Metric.GPU_FREE_SIZE).value == sum(allocs)
    assert one(Metric.GPU_MEMORY_RESIDENT).value == 0
    assert one(Metric.GPU_MEMORY_RESIDENT_PEAK).value == sum(allocs)
    up, sub, ker, rb = (one(d) for d in (
        Metric.GPU_UPLOAD_DURATION, Metric.GPU_SUBMIT_DURATION, Metric.GPU_KERNEL_DURATION,
        Metric.GPU_READBACK_DURATION))
    for h in (up, sub, ker, rb):
        assert h.count == 1 and h.sum >= 0
    assert up.sum > 0 and sub.sum > 0 and rb.sum > 0 and ker.sum > 0
    if ker.sum <= sub.sum:  # device time inside host submit→complete: the usual case
        wait = one(Metric.GPU_QUEUE_WAIT_DURATION)
        assert wait.count == 1
        assert wait.sum == pytest.approx(sub.sum - ker.sum, abs=1e-12)
    else:
        # Device and host clocks disagree (dispatch.py allows for it): no wait is
        # recorded, and the disagreement is counted instead.
        assert Metric.GPU_QUEUE_WAIT_DURATION.name not in pts
        assert REJECTIONS.snapshot().get(
            ("gpu.queue.wait.duration", "kernel_exceeds_submit"), 0) >= 1
    assert list(sub.explicit_bounds) == list(Metric.GPU_SUBMIT_DURATION.buckets or ())
    status = {dict(p.attributes)[Attr.HW_STATE]: p.value for p in pts[Metric.HW_STATUS.name]}
    assert status == {"ok": 1, "degraded": 0, "failed": 0}
    for name in (Metric.GPU_FAULT_COUNT.name, Metric.GPU_RETRY_COUNT.name,
                 Metric.GPU_RECOVERY_COUNT.name, Metric.GPU_RESIDUAL_BATCH_COUNT.name):
        assert name not in pts


def test_without_timestamp_query_kernel_time_is_a_gap(env: Env) -> None:
    mm = env.matmul(timestamps=False, fallback_to_cpu=False)
    assert not mm.device.timestamps
    with env.tracer.proof(system="gkr", backend="wgpu") as proof:
        a = np.arange(12, dtype=np.int64).reshape(3, 4)
        assert np.array_equal(mm.matmul_m31(a, a.T.copy()), matmul_m31_reference(a, a.T))
    pts = env.points()
    assert Metric.GPU_KERNEL_DURATION.name not in pts
    assert Metric.GPU_QUEUE_WAIT_DURATION.name not in pts
    assert Metric.GPU_SUBMIT_DURATION.name in pts
    assert pts[Metric.GPU_READBACK_SIZE.name][0].value == 3 * 3 * 4
    gaps = {e.attributes[Attr.GPU_CAPABILITY] for e in _finished(env, proof).events
            if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED and e.attributes is not None}
    assert gaps == WGPU_GAPS | {"kernel_timestamps"}


def _finished(env: Env, handle: Any) -> Any:
    ctx = handle.span.get_span_context()
    return next(s for s in env.spans.get_finished_spans()
                if s.context is not None and s.context.span_id == ctx.span_id)


# ── evidence ─────────────────────────────────────────────────────────────────────────


def test_identity_and_expected_gaps_on_the_proof_span_at_first_dispatch(env: Env) -> None:
    mm = env.matmul()
    info = env.adapter.info
    a = np.arange(16, dtype=np.int64).reshape(4, 4)
    with env.tracer.proof(system="gkr", backend="wgpu") as proof:
        # Acquired but not yet dispatched: nothing on the span.
        assert not [e for e in proof.span.events if e.name.startswith("gpu.")]
        with env.tracer.layer(index=0, kind="MatMul"):
            mm.matmul_m31(a, a)
            mm.matmul_m31(a, a)
    layer = next(s for s in env.spans.get_finished_spans() if s.name == "proof.layer")
    events = [e for e in layer.events if e.name.startswith("gpu.")]
    (ident,) = [e for e in events if e.name == EventName.GPU_ADAPTER_ACQUIRED]
    assert ident.attributes is not None
    assert ident.attributes[Attr.GPU_BACKEND] == backend_name(info["backend_type"])
    assert ident.attributes[Attr.HW_NAME] == info["device"]
    # An id wgpu does not know (0, e.g. llvmpipe's device id) is absent, never 0.
    for key, field in ((Attr.GPU_PCI_VENDOR_ID, "vendor_id"),
                       (Attr.GPU_PCI_DEVICE_ID, "device_id")):
        if info[field]:
            assert ident.attributes[key] == info[field]
        else:
            assert key not in ident.attributes
    assert ident.attributes[Attr.HW_DRIVER_VERSION] == info["description"]
    gaps = {e.attributes[Attr.GPU_CAPABILITY]: e.attributes[Attr.GPU_CAPABILITY_REASON]
            for e in events if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED
            and e.attributes is not None}
    assert set(gaps) == WGPU_GAPS  # kernel timestamps are measured here, not a gap
    assert set(gaps.values()) == {"unsupported"}
    assert len(events) == 1 + len(WGPU_GAPS)  # the second dispatch added nothing
    counted = {dict(p.attributes)[Attr.GPU_CAPABILITY]: p.value
               for p in env.points()[Metric.GPU_CAPABILITY_UNSUPPORTED.name]}
    assert counted == dict.fromkeys(WGPU_GAPS, 1)
    assert env.points()[Metric.GPU_DISPATCH_COUNT.name][0].value == 2


def test_cpu_proof_with_an_acquired_adapter_stays_silent(env: Env) -> None:
    env.matmul()  # adapter and device acquired, pipeline compiled, never dispatched
    with env.tracer.proof(system="gkr", backend="cpu"), env.tracer.layer(index=0,
                                                                         kind="MatMul"):
        matmul_m31_reference(np.ones((2, 2), np.int64), np.ones((2, 2), np.int64))
    assert not [n for n in env.points() if n.startswith(("gpu.", "hw."))]
    for span in env.spans.get_finished_spans():
        assert not [e for e in span.events if e.name.startswith("gpu.")]


# ── faults ───────────────────────────────────────────────────────────────────────────


def test_device_lost_is_a_fault_recovered_on_the_cpu(env: Env) -> None:
    mm = env.matmul(fallback_to_cpu=True, max_retries=2)
    rng = np.random.default_rng(3)
    a, b = rand(rng, (6, 7)), rand(rng, (7, 5))
    mm.matmul_m31(a, b)
    mm.device.destroy()  # a real device loss
    with env.tracer.proof(system="gkr", backend="wgpu") as proof:
        got = mm.matmul_m31(a, b)
    assert np.array_equal(got, matmul_m31_reference(a, b))
    pts = env.points()
    (fault,) = pts[Metric.GPU_FAULT_COUNT.name]
    assert fault.value == 1 and dict(fault.attributes)[Attr.GPU_FAULT_KIND] == "device_lost"
    assert Metric.GPU_RETRY_COUNT.name not in pts  # a lost device is not retried
    assert pts[Metric.GPU_RECOVERY_COUNT.name][0].value == 1
    assert pts[Metric.GPU_RESIDUAL_BATCH_COUNT.name][0].value == 1
    assert pts[Metric.GPU_DISPATCH_COUNT.name][0].value == 2
    assert mm.runtime.state is HwState.FAILED
    status = {dict(p.attributes)[Attr.HW_STATE]: p.value for p in pts[Metric.HW_STATUS.name]}
    assert status["failed"] == 1 and status["ok"] == 0
    assert mm.runtime.resident_bytes == 0
    names = [e.name for e in _finished(env, proof).events]
    assert names == [EventName.GPU_FAULT, EventName.GPU_RECOVERY]


def test_device_lost_raises_without_fallback(env: Env) -> None:
    mm = env.matmul(fallback_to_cpu=False)
    mm.device.destroy()
    with pytest.raises(Exception, match=r"(?i)lost"):
        mm.matmul_m31(np.ones((2, 2), np.int64), np.ones((2, 2), np.int64))
    assert mm.runtime.state is HwState.FAILED


def test_transient_fault_is_retried(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    mm = env.matmul(fallback_to_cpu=False, max_retries=3)
    real = mm._dispatch
    failures = iter([True, True])

    def flaky(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if next(failures, False):
            with mm.runtime.dispatch():
                raise MemoryError("transient out of memory")
        return real(a, b)

    monkeypatch.setattr(mm, "_dispatch", flaky)
    a = np.arange(9, dtype=np.int64).reshape(3, 3)
    assert np.array_equal(mm.matmul_m31(a, a), matmul_m31_reference(a, a))
    pts = env.points()
    assert pts[Metric.GPU_RETRY_COUNT.name][0].value == 2
    assert pts[Metric.GPU_FAULT_COUNT.name][0].value == 2
    assert pts[Metric.GPU_DISPATCH_COUNT.name][0].value == 3
    assert mm.runtime.state is HwState.OK


# ── backend naming and census ────────────────────────────────────────────────────────


@pytest.mark.parametrize(("raw", "name"), [("Vulkan", "vulkan"), ("Metal", "metal"),
                                           ("D3D12", "d3d12"), ("OpenGL", "gl"),
                                           ("GL", "gl"), ("", "unknown")])
def test_backend_name_from_adapter_info(raw: str, name: str) -> None:
    assert backend_name(raw) == name


def test_identity_from_adapter_info_is_generic() -> None:
    ident = adapter_identity({"backend_type": "Metal", "vendor_id": 0x106B, "device_id": 0x1,
                              "device": "Apple M2", "description": "", "adapter_type":
                              "IntegratedGPU", "vendor": "apple"})
    assert (ident.backend, ident.vendor, ident.hw_id, ident.software) == (
        "metal", "Apple", "wgpu:metal:106b:0001", False)
    assert {g.capability for g in adapter_gaps(["timestamp-query"])} == {
        GpuCapability(c) for c in WGPU_GAPS}


def test_census_of_real_adapters(adapter: Any) -> None:
    backend = WgpuBackend.open()
    samples = [d.sample() for d in backend.devices()]
    assert samples
    ours = next(s for s in samples if s.identity.name == adapter.info["device"]
                and s.identity.backend == backend_name(adapter.info["backend_type"]))
    assert ours.measured == {GpuCapability.KERNEL_TIMESTAMPS}
    assert {c.value for c in ours.gaps} == WGPU_GAPS


class _DeviceWithoutTimestamps:
    """The real adapter, except that the device it opens lacks timestamp-query although
    the adapter advertises it (as a driver that refuses the feature would)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.info = real.info
        self.features = real.features

    def request_device_sync(self, **_: Any) -> Any:
        return self._real.request_device_sync(required_features=[])


def test_census_says_measured_only_after_reading_a_timestamp(adapter: Any) -> None:
    if "timestamp-query" not in adapter.features:
        pytest.skip("this adapter has no timestamp-query feature")
    from otel_proofscope.gpu.timestamp_probe import read_pass_timestamps
    from otel_proofscope.gpu.wgpu_backend import WgpuAdapterSource

    begin, end = read_pass_timestamps(adapter, wgpu)  # type: ignore[misc]
    assert 0 < begin <= end
    refused = WgpuAdapterSource(_DeviceWithoutTimestamps(adapter)).sample()
    assert GpuCapability.KERNEL_TIMESTAMPS not in refused.measured
    gap = refused.gaps[GpuCapability.KERNEL_TIMESTAMPS]
    assert gap.reason is GapReason.DRIVER_ERROR and "without 'timestamp-query'" in gap.detail


def test_missing_pci_ids_are_omitted_not_zero() -> None:
    ident = adapter_identity({"backend_type": "Vulkan", "vendor_id": 0x10005, "device_id": 0,
                              "device": "llvmpipe", "description": "Mesa",
                              "adapter_type": "CPU", "vendor": "Mesa"})
    assert (ident.pci_vendor_id, ident.pci_device_id) == (0x10005, None)
    attrs = ident.event_attributes()
    assert attrs[Attr.GPU_PCI_VENDOR_ID] == 0x10005 and Attr.GPU_PCI_DEVICE_ID not in attrs
    none = adapter_identity({"backend_type": "Vulkan", "device": "x"})
    assert Attr.GPU_PCI_VENDOR_ID not in none.event_attributes()
    assert none.hw_id == "wgpu:vulkan:0000:0000"  # the stable id keeps its shape
