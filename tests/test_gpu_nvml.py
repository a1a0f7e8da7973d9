"""NVML backend and the device sampler, driven through a faithful pynvml stand-in.

The real ``pynvml`` is used wherever this machine allows: its error classes and ctypes
structures inside the stand-in, and its real ``nvmlInit`` for the LibraryNotFound path.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from fake_pynvml import IMPLEMENTED, FakeGpu, FakeNvml
from metric_helpers import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.gpu import evidence, start_sampler
from otel_proofscope.gpu.backend import BackendUnavailable, DeviceIdentity
from otel_proofscope.gpu.census import census_dict, take_census
from otel_proofscope.gpu.dispatch import GpuRuntime
from otel_proofscope.gpu.evidence import EvidenceDedup
from otel_proofscope.gpu.nvml import NvmlBackend
from otel_proofscope.gpu.sampler import Sampler
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.semconv import Attr, EventName, GapReason, GpuCapability, Metric

UUID0 = "GPU-6f1e9a52-3c1b-4f0e-9a55-2d4b7c1e0a11"
UUID1 = "GPU-00000000-1111-2222-3333-444444444444"


class Env:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])
        self.claims = EvidenceDedup()
        self.samplers: list[Sampler] = []

    def sampler(self, nvml: FakeNvml, **kw: Any) -> Sampler:
        backend = NvmlBackend.open(nvml)
        s = Sampler(backend.devices(), meter_provider=self.mp, claims=self.claims,
                    on_close=backend.close, **kw)
        self.samplers.append(s)
        return s

    def points(self) -> dict[str, list[Any]]:
        return metric_points(self.reader)


def by_device(points: list[Any], *extra: str) -> dict[tuple[Any, ...], Any]:
    return {(dict(p.attributes)[Attr.HW_ID], *(dict(p.attributes)[k] for k in extra)): p.value
            for p in points}


@pytest.fixture
def env() -> Iterator[Env]:
    evidence.reset_dispatch_state()
    e = Env()
    yield e
    for s in e.samplers:
        s.stop(1.0)
    e.mp.shutdown()
    evidence.reset_dispatch_state()


# ── the stand-in is faithful to pynvml ───────────────────────────────────────────────


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_fake_has_real_pynvml_signature(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(FakeNvml, name))
    fake_params = [p for p in fake.parameters if p != "self"]
    assert fake_params == list(real.parameters), name


def test_fake_uses_real_errors_structs_and_lifecycle() -> None:
    nvml = FakeNvml()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert isinstance(nvml.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    assert isinstance(nvml.nvmlDeviceGetPciInfo(h), pynvml.nvmlPciInfo_t)
    nvml.gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(h)
    nvml.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(h)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml(library_found=False).nvmlInit()


# ── sampling every field ─────────────────────────────────────────────────────────────


def test_all_fields_measured_with_units_and_attributes(env: Env) -> None:
    s = env.sampler(FakeNvml([FakeGpu()]))
    s.sample_now()
    pts = env.points()
    hw = {Attr.HW_ID: UUID0, Attr.HW_TYPE: "gpu", Attr.HW_NAME: "NVIDIA H100 80GB HBM3",
          Attr.HW_VENDOR: "NVIDIA", Attr.HW_DRIVER_VERSION: "550.54.15"}

    def value(metric: Any, **attrs: str) -> Any:
        (p,) = [p for p in pts[metric.name]
                if all(dict(p.attributes).get(k.replace("_", "."), v) == v
                       for k, v in attrs.items())]
        assert {k: v for k, v in dict(p.attributes).items() if k in hw} == hw
        return p.value

    assert value(Metric.HW_GPU_UTILIZATION) == pytest.approx(0.87)
    assert value(Metric.HW_GPU_MEMORY_USAGE) == 12 * 1024**3
    assert value(Metric.HW_GPU_MEMORY_LIMIT) == 80 * 1024**3
    assert value(Metric.HW_GPU_MEMORY_UTILIZATION) == pytest.approx(12 / 80)
    io = by_device(pts[Metric.HW_GPU_IO.name], Attr.NETWORK_IO_DIRECTION)
    assert io == {(UUID0, "transmit"): 123_456_789, (UUID0, "receive"): 987_654_321}
    errs = by_device(pts[Metric.HW_ERRORS.name], Attr.ERROR_TYPE)
    assert errs == {(UUID0, "ecc_corrected"): 3, (UUID0, "ecc_uncorrected"): 0}
    assert value(Metric.HW_POWER) == pytest.approx(412.345)
    assert value(Metric.HW_ENERGY) == pytest.approx(9_876_543.21)
    assert value(Metric.HW_GPU_TEMPERATURE) == 63
    assert value(Metric.HW_GPU_CLOCK_SM) == pytest.approx(1.98e9)
    assert value(Metric.HW_GPU_CLOCK_MEMORY) == pytest.approx(2.619e9)
    status = by_device(pts[Metric.HW_STATUS.name], Attr.HW_STATE)
    assert status == {(UUID0, "ok"): 1, (UUID0, "degraded"): 0, (UUID0, "failed"): 0}
    (sample,) = s.latest().values()
    assert sample.measured == {GpuCapability.UTILIZATION, GpuCapability.MEMORY_USAGE,
                               GpuCapability.MEMORY_LIMIT, GpuCapability.PCIE_IO,
                               GpuCapability.ERRORS, GpuCapability.POWER, GpuCapability.ENERGY,
                               GpuCapability.TEMPERATURE, GpuCapability.CLOCKS}
    assert set(sample.gaps) == {GpuCapability.OCCUPANCY, GpuCapability.STALL_COUNTERS}
    assert sample.identity.pci_vendor_id == 0x10DE
    assert sample.identity.pci_device_id == 0x2330


def test_readings_follow_the_device(env: Env) -> None:
    nvml = FakeNvml([FakeGpu()])
    s = env.sampler(nvml)
    s.sample_now()
    nvml.gpus[0].util_gpu = 12
    nvml.gpus[0].energy_mj += 5_000
    s.sample_now()
    pts = env.points()
    assert pts[Metric.HW_GPU_UTILIZATION.name][0].value == pytest.approx(0.12)
    assert pts[Metric.HW_ENERGY.name][0].value == pytest.approx(9_876_548.21)


NOT_SUPPORTED_CASES = [
    ("nvmlDeviceGetUtilizationRates", {GpuCapability.UTILIZATION},
     {Metric.HW_GPU_UTILIZATION}),
    ("nvmlDeviceGetMemoryInfo", {GpuCapability.MEMORY_USAGE, GpuCapability.MEMORY_LIMIT},
     {Metric.HW_GPU_MEMORY_USAGE, Metric.HW_GPU_MEMORY_LIMIT, Metric.HW_GPU_MEMORY_UTILIZATION}),
    ("nvmlDeviceGetFieldValues", {GpuCapability.PCIE_IO}, {Metric.HW_GPU_IO}),
    ("nvmlDeviceGetTotalEccErrors", {GpuCapability.ERRORS}, {Metric.HW_ERRORS}),
    ("nvmlDeviceGetPowerUsage", {GpuCapability.POWER}, {Metric.HW_POWER}),
    ("nvmlDeviceGetTotalEnergyConsumption", {GpuCapability.ENERGY}, {Metric.HW_ENERGY}),
    ("nvmlDeviceGetTemperature", {GpuCapability.TEMPERATURE}, {Metric.HW_GPU_TEMPERATURE}),
    ("nvmlDeviceGetClockInfo", {GpuCapability.CLOCKS},
     {Metric.HW_GPU_CLOCK_SM, Metric.HW_GPU_CLOCK_MEMORY}),
]


@pytest.mark.parametrize(("fn", "caps", "missing"), NOT_SUPPORTED_CASES,
                         ids=[c[0] for c in NOT_SUPPORTED_CASES])
def test_not_supported_per_field_is_a_gap_not_a_zero(env: Env, fn: str,
                                                     caps: set[GpuCapability],
                                                     missing: set[Any]) -> None:
    gpu = FakeGpu(errors={fn: pynvml.NVML_ERROR_NOT_SUPPORTED})
    s = env.sampler(FakeNvml([gpu]), evidence="immediately")
    s.sample_now()
    s.sample_now()
    (sample,) = s.latest().values()
    assert caps <= set(sample.gaps)
    assert all(sample.gaps[c].reason is GapReason.UNSUPPORTED for c in caps)
    assert not caps & sample.measured
    pts = env.points()
    missing_names = {m.name for m in missing}
    for name in missing_names:
        assert name not in pts, f"{name} reported despite NotSupported"
    # Every other device metric is still there.
    for m in (Metric.HW_GPU_UTILIZATION, Metric.HW_GPU_MEMORY_USAGE, Metric.HW_GPU_IO,
              Metric.HW_ERRORS, Metric.HW_POWER, Metric.HW_ENERGY, Metric.HW_GPU_TEMPERATURE,
              Metric.HW_GPU_CLOCK_SM, Metric.HW_STATUS):
        if m.name not in missing_names:
            assert m.name in pts, m.name
    counted = {(dict(p.attributes)[Attr.GPU_CAPABILITY], dict(p.attributes)[Attr.GPU_BACKEND],
                p.value) for p in pts[Metric.GPU_CAPABILITY_UNSUPPORTED.name]}
    for c in caps:
        assert (c.value, "nvml", 1) in counted  # once, though sampled twice


def test_pcie_field_not_supported_per_field_value(env: Env) -> None:
    gpu = FakeGpu(field_returns={pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
                                 pynvml.NVML_ERROR_NOT_SUPPORTED})
    s = env.sampler(FakeNvml([gpu]))
    s.sample_now()
    (sample,) = s.latest().values()
    assert sample.gaps[GpuCapability.PCIE_IO].reason is GapReason.UNSUPPORTED
    assert sample.io_transmit is None and sample.io_receive is None
    assert Metric.HW_GPU_IO.name not in env.points()


@pytest.mark.parametrize(("code", "reason"), [
    (pynvml.NVML_ERROR_NO_PERMISSION, GapReason.PERMISSION_DENIED),
    (pynvml.NVML_ERROR_UNINITIALIZED, GapReason.NOT_INITIALIZED),
    (pynvml.NVML_ERROR_UNKNOWN, GapReason.DRIVER_ERROR),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, GapReason.UNSUPPORTED),
])
def test_gap_reasons_from_nvml_errors(env: Env, code: int, reason: GapReason) -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetPowerUsage": code})
    s = env.sampler(FakeNvml([gpu]), evidence="immediately")
    s.sample_now()
    (sample,) = s.latest().values()
    assert sample.gaps[GpuCapability.POWER].reason is reason
    pts = env.points()[Metric.GPU_CAPABILITY_UNSUPPORTED.name]
    power = [p for p in pts if dict(p.attributes)[Attr.GPU_CAPABILITY] == "power"]
    assert dict(power[0].attributes)[Attr.GPU_CAPABILITY_REASON] == reason.value


def test_shutdown_under_the_sampler_gives_not_initialized_gaps(env: Env) -> None:
    nvml = FakeNvml([FakeGpu()])
    s = env.sampler(nvml)
    s.sample_now()
    nvml.nvmlShutdown()  # someone else shut NVML down
    s.sample_now()
    (sample,) = s.latest().values()
    assert sample.measured == frozenset()
    assert {g.reason for g in sample.gaps.values()} == {GapReason.NOT_INITIALIZED,
                                                        GapReason.UNSUPPORTED}


def test_uncorrected_ecc_marks_device_degraded(env: Env) -> None:
    s = env.sampler(FakeNvml([FakeGpu(ecc_uncorrected=2)]))
    s.sample_now()
    status = by_device(env.points()[Metric.HW_STATUS.name], Attr.HW_STATE)
    assert status[(UUID0, "degraded")] == 1 and status[(UUID0, "ok")] == 0


# ── faults ───────────────────────────────────────────────────────────────────────────


def test_gpu_lost_mid_run_fails_that_device_only(env: Env,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid=UUID1, util_gpu=10)])
    s = env.sampler(nvml, evidence="immediately")
    s.sample_now()
    nvml.gpus[0].lost = True
    with caplog.at_level(logging.WARNING, logger="otel_proofscope.gpu"):
        for util in (20, 30, 40):
            nvml.gpus[1].util_gpu = util
            s.sample_now()
    pts = env.points()
    status = by_device(pts[Metric.HW_STATUS.name], Attr.HW_STATE)
    assert status[(UUID0, "failed")] == 1 and status[(UUID0, "ok")] == 0
    assert status[(UUID1, "ok")] == 1 and status[(UUID1, "failed")] == 0
    utils = by_device(pts[Metric.HW_GPU_UTILIZATION.name])
    assert utils == {(UUID1,): pytest.approx(0.40)}  # the lost device reports no stale value
    (fault,) = pts[Metric.GPU_FAULT_COUNT.name]
    assert fault.value == 1
    assert dict(fault.attributes) == {Attr.GPU_BACKEND: "nvml", Attr.HW_ID: UUID0,
                                      Attr.GPU_FAULT_KIND: "gpu_is_lost"}
    lost_gaps = {dict(p.attributes)[Attr.GPU_CAPABILITY]
                 for p in pts[Metric.GPU_CAPABILITY_UNSUPPORTED.name]
                 if dict(p.attributes)[Attr.GPU_CAPABILITY_REASON] == "driver-error"}
    assert lost_gaps == {c.value for c in (
        GpuCapability.UTILIZATION, GpuCapability.MEMORY_USAGE, GpuCapability.MEMORY_LIMIT,
        GpuCapability.PCIE_IO, GpuCapability.ERRORS, GpuCapability.POWER,
        GpuCapability.ENERGY, GpuCapability.TEMPERATURE, GpuCapability.CLOCKS)}
    faults = [r for r in caplog.records if "gpu_is_lost" in r.getMessage()]
    assert len(faults) == 1
    # After the loss the lost device is not polled again.
    calls = nvml.calls["nvmlDeviceGetUtilizationRates"]
    s.sample_now()
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == calls + 1


def test_a_raising_source_does_not_stop_the_others(env: Env,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    good = NvmlBackend.open(FakeNvml([FakeGpu()])).devices()[0]

    class Broken:
        identity = DeviceIdentity("nvml", "GPU-broken", "x", "NVIDIA", "1")

        def sample(self) -> Any:
            raise OSError("ioctl failed")

    s = Sampler([Broken(), good], meter_provider=env.mp, claims=env.claims)
    env.samplers.append(s)
    with caplog.at_level(logging.WARNING, logger="otel_proofscope.gpu"):
        s.sample_now()
        s.sample_now()
    assert set(s.latest()) == {UUID0}
    assert s.sample_errors == 2
    assert len([r for r in caplog.records if "GPU-broken" in r.getMessage()]) == 1


# ── evidence timing ──────────────────────────────────────────────────────────────────


def test_sampler_gaps_wait_for_a_dispatch_then_land_on_its_span(env: Env) -> None:
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    tracer = ProofTracer(tp, env.mp)
    s = env.sampler(FakeNvml([FakeGpu(errors={
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED})]))
    s.sample_now()
    # Sampling alone (e.g. during a CPU proof) emits no evidence.
    assert Metric.GPU_CAPABILITY_UNSUPPORTED.name not in env.points()
    assert evidence.pending_count() == 3  # power, occupancy, stall_counters
    ident = next(iter(s.latest().values())).identity
    rt = GpuRuntime(DeviceIdentity("cuda", ident.hw_id, ident.name, ident.vendor,
                                   ident.driver_version), meter_provider=env.mp,
                    claims=env.claims, report_status=False)
    with tracer.proof(system="gkr", backend="cuda"), rt.dispatch():
        pass
    (proof,) = spans.get_finished_spans()
    gaps = {(e.attributes[Attr.GPU_BACKEND], e.attributes[Attr.GPU_CAPABILITY])
            for e in proof.events if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED
            and e.attributes is not None}
    assert gaps == {("nvml", "power"), ("nvml", "occupancy"), ("nvml", "stall_counters")}
    assert evidence.pending_count() == 0
    tp.shutdown()


# ── lifecycle, discovery, census ─────────────────────────────────────────────────────


def test_background_thread_samples_and_stops_bounded(env: Env) -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid=UUID1)])
    s = start_sampler(env.mp, interval_s=0.01, nvml=nvml, claims=env.claims)
    assert s is not None
    env.samplers.append(s)
    deadline = time.monotonic() + 10
    while s.samples_taken < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.samples_taken >= 4 and s.running
    assert set(s.latest()) == {UUID0, UUID1}
    assert s.stop(timeout_s=2.0)
    assert not s.running
    assert nvml.refcount == 0  # nvmlShutdown called by stop()
    taken = s.samples_taken
    time.sleep(0.05)
    assert s.samples_taken == taken
    assert not [n for n in env.points() if n.startswith("hw.")]  # stopped: silent
    assert s.stop()  # idempotent


def test_library_not_found_means_no_sampler() -> None:
    assert start_sampler(nvml=FakeNvml(library_found=False)) is None
    with pytest.raises(BackendUnavailable) as info:
        NvmlBackend.open(FakeNvml(library_found=False))
    assert info.value.reason is GapReason.UNAVAILABLE
    assert info.value.detail == "LibraryNotFound"


def test_real_pynvml_without_driver_is_library_not_found() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # an NVIDIA machine: scripts/gpu-check covers it
        pynvml.nvmlShutdown()
        pytest.skip("NVML is present on this machine")
    assert start_sampler() is None
    (nvml,) = take_census(include_wgpu=False)
    assert (nvml.available, nvml.reason, nvml.detail) == (False, "unavailable",
                                                          "LibraryNotFound")


def test_no_devices_means_no_sampler() -> None:
    assert start_sampler(nvml=FakeNvml([])) is None


def test_census_with_fake_nvml() -> None:
    nvml = FakeNvml([FakeGpu(errors={"nvmlDeviceGetTotalEccErrors":
                                     pynvml.NVML_ERROR_NOT_SUPPORTED})])
    (b,) = take_census(nvml=nvml, include_wgpu=False)
    assert b.available
    d = census_dict([b])["backends"][0]["devices"][0]
    assert d["hw_id"] == UUID0 and d["vendor"] == "NVIDIA" and d["state"] == "ok"
    assert "errors" not in d["measured"] and "power" in d["measured"]
    assert {g["capability"]: g["reason"] for g in d["gaps"]} == {
        "occupancy": "unsupported", "stall_counters": "unsupported", "errors": "unsupported"}
    assert nvml.refcount == 0


def test_sampler_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Sampler([], interval_s=0)
