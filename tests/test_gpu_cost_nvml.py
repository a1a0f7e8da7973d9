"""Energy per phase, per-process usage and MIG, through the faithful pynvml stand-in.

No NVIDIA driver exists here; ``fake_pynvml.FakeNvml`` is the boundary (real error
classes, structs and return shapes). Energy per phase is checked against the stand-in's
counter exactly; the sampled fallback against a closed-form trapezoid; per-process
attribution against a real child process of this test (its parent chain is read from
the real ``/proc``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextvars import copy_context
from typing import Any

import pynvml
import pytest
from fake_pynvml import FakeGpu, FakeNvml
from hypothesis import given, settings
from hypothesis import strategies as st
from metric_helpers import metric_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import phase_cost
from otel_proofscope.gpu import start_sampler
from otel_proofscope.gpu.backend import DeviceIdentity
from otel_proofscope.gpu.dispatch import GpuRuntime
from otel_proofscope.gpu.energy import NvmlEnergyMeter
from otel_proofscope.gpu.evidence import EvidenceDedup
from otel_proofscope.gpu.nvml import NvmlBackend
from otel_proofscope.gpu.processes import ProcessWatch, parent_pid
from otel_proofscope.gpu.sampler import Sampler
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.semconv import Attr, EventName, GpuCapability, Metric, SpanName

UUID = "GPU-6f1e9a52-3c1b-4f0e-9a55-2d4b7c1e0a11"
MIG0 = "MIG-0c5c0d3a-1111-5a2b-9c1e-000000000001"
MIG2 = "MIG-0c5c0d3a-1111-5a2b-9c1e-000000000003"
GIB = 1024**3


class Env:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])
        self.tracer = ProofTracer(tp, self.mp)
        self.runtime = GpuRuntime(DeviceIdentity("cuda", UUID, "H100", "NVIDIA", "550"),
                                  meter_provider=self.mp, claims=EvidenceDedup(),
                                  report_status=False)

    def dispatch(self, kernel_s: float = 0.001, up: int = 100, down: int = 10) -> None:
        with self.runtime.dispatch() as d:
            d.record_upload(up, None)
            d.record_kernel(kernel_s)
            d.record_readback(down, None)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def one(self, name: str) -> dict[str, Any]:
        (s,) = [s for s in self.finished() if s.name == name]
        return dict(s.attributes or {})


@pytest.fixture
def env() -> Iterator[Env]:
    yield Env()
    phase_cost.set_energy_meter(None)


def _meter(nvml: FakeNvml, clock: Any = None) -> NvmlEnergyMeter:
    backend = NvmlBackend.open(nvml)
    kw = {"clock": clock} if clock is not None else {}
    return NvmlEnergyMeter(backend.devices(), **kw)


# ── energy: counter deltas ───────────────────────────────────────────────────────────


def test_energy_per_phase_is_the_counter_delta(env: Env) -> None:
    gpu = FakeGpu(energy_mj=5_000_000)
    meter = _meter(FakeNvml([gpu]))
    assert meter.sources == {UUID: "counter"}
    phase_cost.set_energy_meter(meter)
    with env.tracer.proof(system="gkr", backend="cuda") as proof:
        with env.tracer.witness():
            env.dispatch()
            gpu.energy_mj += 1_250  # 1.25 J while the witness was generated
        gpu.energy_mj += 500  # between phases: the proof's own share
        with env.tracer.layer(index=0, kind="MatMul"):
            env.dispatch()
            gpu.energy_mj += 3_000
    witness, layer, root = (env.one(n) for n in (SpanName.WITNESS, SpanName.LAYER,
                                                 SpanName.PROOF))
    assert witness[Attr.GPU_ENERGY] == pytest.approx(1.25)
    assert layer[Attr.GPU_ENERGY] == pytest.approx(3.0)
    assert root[Attr.GPU_ENERGY] == pytest.approx(4.75)
    for a in (witness, layer, root):
        assert a[Attr.GPU_ENERGY_SOURCE] == "counter"
        assert a[Attr.GPU_SCOPE] == "device"  # NVML counts every process on the device
        assert list(a[Attr.GPU_ENERGY_HW_IDS]) == [UUID]
    cost = proof.gpu_cost
    assert cost is not None and cost.energy is not None
    assert cost.energy.joules == pytest.approx(4.75)
    # The per-phase metric counts each phase's own energy: the sum is the proof's.
    points = metric_points(env.reader)[Metric.GPU_PHASE_ENERGY.name]
    own = {dict(p.attributes)[Attr.PROOF_PHASE]: p.value for p in points}
    assert own == pytest.approx({SpanName.WITNESS: 1.25, SpanName.LAYER: 3.0,
                                 SpanName.PROOF: 0.5})


def test_energy_is_on_every_phase_while_a_meter_runs_even_without_dispatches(
        env: Env) -> None:
    """A wrapped prover's kernels are invisible to us; device energy per phase is not."""
    gpu = FakeGpu()
    phase_cost.set_energy_meter(_meter(FakeNvml([gpu])))
    with env.tracer.proof(system="gkr", backend="cuda"), env.tracer.verify():
        gpu.energy_mj += 42
    verify = env.one(SpanName.VERIFY)
    assert verify[Attr.GPU_ENERGY] == pytest.approx(0.042)
    assert Attr.GPU_DISPATCH_COUNT not in verify


# ── energy: sampled fallback, and neither ────────────────────────────────────────────


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_energy_falls_back_to_integrated_power_samples(env: Env) -> None:
    gpu = FakeGpu(power_mw=200_000,
                  errors={"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED})
    clock = Clock()
    meter = _meter(FakeNvml([gpu]), clock)
    assert meter.sources == {UUID: "sampled"}
    phase_cost.set_energy_meter(meter)
    with (env.tracer.proof(system="gkr", backend="cuda"),
          env.tracer.layer(index=0, kind="MatMul")):
        env.dispatch()
        clock.t += 1.0
        meter.add_power_sample(UUID, 400.0)  # the sampler thread's reading
        gpu.power_mw = 300_000
        clock.t += 2.0
    layer = env.one(SpanName.LAYER)
    # Trapezoids: 200 W → 400 W over 1 s, then 400 W → 300 W over 2 s = 300 + 700 J.
    assert layer[Attr.GPU_ENERGY] == pytest.approx(1000.0)
    assert layer[Attr.GPU_ENERGY_SOURCE] == "sampled"


def test_no_counter_and_no_power_is_a_gap_never_zero(env: Env) -> None:
    ns = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = FakeGpu(errors={"nvmlDeviceGetTotalEnergyConsumption": ns,
                          "nvmlDeviceGetPowerUsage": ns})
    meter = _meter(FakeNvml([gpu]))
    assert meter.sources == {UUID: None}
    phase_cost.set_energy_meter(meter)
    with env.tracer.proof(system="gkr", backend="cuda") as proof:
        with env.tracer.layer(index=0, kind="MatMul"):
            env.dispatch()
        with env.tracer.verify():
            pass  # no GPU work: no gap event either
    for s in env.finished():
        assert Attr.GPU_ENERGY not in (s.attributes or {}), s.name
    gaps = {s.name: [dict(e.attributes or {}) for e in s.events
                     if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED]
            for s in env.finished()}
    assert gaps[SpanName.VERIFY] == []
    for name in (SpanName.LAYER, SpanName.PROOF):
        (g,) = gaps[name]
        assert g[Attr.GPU_CAPABILITY] == GpuCapability.ENERGY.value
        assert g[Attr.GPU_CAPABILITY_REASON] == "unsupported"
        assert "NotSupported" in g[Attr.GPU_CAPABILITY_DETAIL]
        assert g[Attr.HW_ID] == UUID
    cost = proof.gpu_cost
    assert cost is not None and cost.energy is None and cost.energy_gap is not None


def test_gpu_lost_mid_proof_is_a_driver_error_gap(env: Env) -> None:
    gpu = FakeGpu()
    phase_cost.set_energy_meter(_meter(FakeNvml([gpu])))
    with (env.tracer.proof(system="gkr", backend="cuda"),
          env.tracer.layer(index=0, kind="MatMul")):
        env.dispatch()
        gpu.lost = True
    layer = next(s for s in env.finished() if s.name == SpanName.LAYER)
    assert Attr.GPU_ENERGY not in (layer.attributes or {})
    (g,) = [dict(e.attributes or {}) for e in layer.events
            if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED]
    assert g[Attr.GPU_CAPABILITY_REASON] == "driver-error"


def test_start_sampler_installs_and_removes_the_energy_meter() -> None:
    reader = InMemoryMetricReader()
    sampler = start_sampler(MeterProvider(metric_readers=[reader]), interval_s=60,
                            nvml=FakeNvml([FakeGpu()]), claims=EvidenceDedup())
    assert sampler is not None
    assert isinstance(phase_cost.energy_meter(), NvmlEnergyMeter)
    sampler.stop()
    assert phase_cost.energy_meter() is None


# ── attribution under threads (property) ─────────────────────────────────────────────


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=1,
                max_size=5))
def test_frames_sum_exactly_across_threads_and_phases(layout: list[list[int]]) -> None:
    """Each layer's dispatches are split over threads sharing the layer's context;
    every span's figures, and the proof's totals, are exact."""
    env = Env()
    expected: dict[int, int] = {}
    with env.tracer.proof(system="gkr", backend="cuda"):
        for i, per_thread in enumerate(layout):
            with env.tracer.layer(index=i, kind="MatMul"):
                threads = []
                for n in per_thread:
                    ctx = copy_context()

                    def work(n: int = n) -> None:
                        for _ in range(n):
                            env.dispatch(kernel_s=0.5, up=3, down=1)

                    threads.append(threading.Thread(target=ctx.run, args=(work,)))
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            expected[i] = sum(per_thread)
    layers = {dict(s.attributes or {})[Attr.LAYER_INDEX]: dict(s.attributes or {})
              for s in env.finished() if s.name == SpanName.LAYER}
    for i, n in expected.items():
        a = layers[i]
        assert a.get(Attr.GPU_DISPATCH_COUNT, 0) == n
        assert a.get(Attr.GPU_UPLOAD_SIZE, 0) == 3 * n
        assert a.get(Attr.GPU_KERNEL_TIME, 0.0) == pytest.approx(0.5 * n)
    total = sum(expected.values())
    root = env.one(SpanName.PROOF)
    assert root.get(Attr.GPU_DISPATCH_COUNT, 0) == total
    assert root.get(Attr.GPU_READBACK_SIZE, 0) == total


# ── per process ──────────────────────────────────────────────────────────────────────


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield proc
    proc.kill()
    proc.wait()


def test_process_watch_follows_the_real_process_tree(
        child: subprocess.Popen[bytes]) -> None:
    assert parent_pid(child.pid) == os.getpid()
    watch = ProcessWatch()
    assert watch.watched([os.getpid(), child.pid, 1]) == {os.getpid(), child.pid}
    other = ProcessWatch(roots=[child.pid])
    assert other.watched([os.getpid(), child.pid]) == {child.pid}


def test_per_process_usage_is_filtered_to_the_prover(
        child: subprocess.Popen[bytes]) -> None:
    me = os.getpid()
    stranger = 1  # init: on the device, not ours
    gpu = FakeGpu(processes=[(me, 2 * GIB), (child.pid, None), (stranger, 5 * GIB)],
                  process_samples=[(me, 1_000, 60, 10), (me, 2_000, 80, 10),
                                   (stranger, 2_000, 99, 50)])
    reader = InMemoryMetricReader()
    backend = NvmlBackend.open(FakeNvml([gpu]))
    sampler = Sampler(backend.devices(), meter_provider=MeterProvider(metric_readers=[reader]),
                      claims=EvidenceDedup(), on_close=backend.close, watch=ProcessWatch())
    try:
        (s,) = sampler.sample_now().values()
        procs = {p.pid: p for p in s.processes}
        assert set(procs) == {me, child.pid}  # the stranger is left out
        assert procs[me].memory_used == 2 * GIB
        assert procs[me].sm_utilization == pytest.approx(0.70)  # mean of 60 % and 80 %
        assert procs[child.pid].memory_used is None  # NVML: not available, not 0
        assert procs[child.pid].sm_utilization is None
        points = metric_points(reader)
        util = {dict(p.attributes)[Attr.PROCESS_PID]: p.value
                for p in points[Metric.GPU_PROCESS_UTILIZATION.name]}
        assert util == {me: pytest.approx(0.70)}
        mem = points[Metric.GPU_PROCESS_MEMORY_USAGE.name]
        assert [(dict(p.attributes)[Attr.PROCESS_PID], p.value) for p in mem] == [
            (me, 2 * GIB)]
        assert all(dict(p.attributes)[Attr.GPU_SCOPE] == "process" for p in mem)
        # The next interval has no newer sample: NVML says NotFound → no value, no 0.
        (s,) = sampler.sample_now().values()
        assert {p.pid: p.sm_utilization for p in s.processes} == {me: None,
                                                                   child.pid: None}
        assert GpuCapability.PROCESS_UTILIZATION not in s.gaps
    finally:
        sampler.stop()


@pytest.mark.parametrize(("code", "reason"), [
    (pynvml.NVML_ERROR_NO_PERMISSION, "permission-denied"),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, "unsupported"),
])
def test_process_query_errors_are_gaps(code: int, reason: str) -> None:
    gpu = FakeGpu(processes=[(os.getpid(), GIB)],
                  errors={"nvmlDeviceGetComputeRunningProcesses": code,
                          "nvmlDeviceGetProcessUtilization": code})
    backend = NvmlBackend.open(FakeNvml([gpu]))
    sampler = Sampler(backend.devices(), claims=EvidenceDedup(), on_close=backend.close,
                      watch=ProcessWatch())
    try:
        (s,) = sampler.sample_now().values()
        assert s.processes == ()
        for cap in (GpuCapability.PROCESS_MEMORY, GpuCapability.PROCESS_UTILIZATION):
            assert s.gaps[cap].reason.value == reason
        assert s.utilization is not None  # the device-wide reading is unaffected
    finally:
        sampler.stop()


def test_process_queries_on_a_lost_gpu_do_not_raise() -> None:
    gpu = FakeGpu(processes=[(os.getpid(), GIB)])
    backend = NvmlBackend.open(FakeNvml([gpu]))
    (dev,) = backend.devices()
    gpu.lost = True
    assert dev.sample_processes(ProcessWatch()) == ((), {})
    assert dev.lost
    backend.close()


# ── MIG ──────────────────────────────────────────────────────────────────────────────


def _mig_machine() -> FakeNvml:
    parent = FakeGpu(mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, mig_devices=[
        FakeGpu.mig_instance(MIG0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GIB, GIB),
        None,  # an empty slot: NotFound
        FakeGpu.mig_instance(MIG2, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * GIB),
    ])
    plain = FakeGpu(uuid="GPU-00000000-1111-2222-3333-444444444444")  # no MIG at all
    return FakeNvml([parent, plain])


def test_mig_instances_are_devices_with_a_parent() -> None:
    nvml = _mig_machine()
    backend = NvmlBackend.open(nvml)
    devs = backend.devices()
    ids = [(d.identity.hw_id, d.identity.parent_hw_id) for d in devs]
    assert ids == [(UUID, None), (MIG0, UUID), (MIG2, UUID),
                   ("GPU-00000000-1111-2222-3333-444444444444", None)]
    mig = devs[1]
    assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig.handle).index == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(devs[0].handle)
    s = mig.sample()
    assert s.memory_limit == 40 * GIB and s.memory_used == GIB
    # Whole-GPU readings are not the instance's: gaps, not the parent's values.
    assert s.gaps[GpuCapability.UTILIZATION].reason.value == "unsupported"
    assert s.gaps[GpuCapability.ENERGY].reason.value == "unsupported"
    assert s.identity.hw_attributes()[Attr.HW_PARENT] == UUID
    assert Attr.HW_PARENT not in devs[0].identity.hw_attributes()
    backend.close()


def test_mig_devices_reach_the_metrics_with_hw_parent() -> None:
    reader = InMemoryMetricReader()
    backend = NvmlBackend.open(_mig_machine())
    sampler = Sampler(backend.devices(), meter_provider=MeterProvider(metric_readers=[reader]),
                      claims=EvidenceDedup(), on_close=backend.close)
    try:
        sampler.sample_now()
        mem = metric_points(reader)[Metric.HW_GPU_MEMORY_USAGE.name]
        parents = {dict(p.attributes)[Attr.HW_ID]: dict(p.attributes).get(Attr.HW_PARENT)
                   for p in mem}
        assert parents[MIG0] == UUID and parents[MIG2] == UUID and parents[UUID] is None
        util = {dict(p.attributes)[Attr.HW_ID]
                for p in metric_points(reader)[Metric.HW_GPU_UTILIZATION.name]}
        assert MIG0 not in util and UUID in util
    finally:
        sampler.stop()


def test_energy_meter_reads_the_physical_device_not_its_mig_instances() -> None:
    meter = _meter(_mig_machine())
    assert set(meter.sources) == {UUID, "GPU-00000000-1111-2222-3333-444444444444"}


def test_mig_disabled_or_unsupported_lists_no_instances() -> None:
    off = FakeGpu(mig_mode=pynvml.NVML_DEVICE_MIG_DISABLE,
                  mig_devices=[FakeGpu.mig_instance(MIG0, "x", GIB)])
    backend = NvmlBackend.open(FakeNvml([off]))
    assert [d.identity.hw_id for d in backend.devices()] == [UUID]
    nvml = FakeNvml([FakeGpu()])
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)
    backend.close()


def test_a_phase_between_counter_ticks_is_a_gap_not_zero(env: Env) -> None:
    gpu = FakeGpu()
    phase_cost.set_energy_meter(_meter(FakeNvml([gpu])))
    with env.tracer.proof(system="gkr", backend="cuda"):
        with env.tracer.layer(index=0, kind="MatMul"):
            env.dispatch()  # the counter does not move: no tick inside this phase
        gpu.energy_mj += 700
    layer = next(s for s in env.finished() if s.name == SpanName.LAYER)
    assert Attr.GPU_ENERGY not in (layer.attributes or {})
    (g,) = [dict(e.attributes or {}) for e in layer.events
            if e.name == EventName.GPU_CAPABILITY_UNSUPPORTED]
    assert g[Attr.GPU_CAPABILITY_REASON] == "unavailable"
    assert env.one(SpanName.PROOF)[Attr.GPU_ENERGY] == pytest.approx(0.7)


def test_census_lists_mig_instances_with_their_parent() -> None:
    from otel_proofscope.gpu.census import census_dict, render_table, take_census

    census = take_census(nvml=_mig_machine(), include_wgpu=False)
    (nvml_backend,) = census_dict(census)["backends"]
    parents = {d["hw_id"]: d["parent_hw_id"] for d in nvml_backend["devices"]}
    assert parents[MIG0] == UUID and parents[MIG2] == UUID and parents[UUID] is None
    assert f"MIG instance of {UUID}" in render_table(census)


def test_a_prover_listed_as_a_graphics_process_is_found(
        child: subprocess.Popen[bytes]) -> None:
    """NVIDIA may list a Vulkan (wgpu) process as graphics, not compute."""
    gpu = FakeGpu(processes=[(os.getpid(), GIB)],
                  graphics_processes=[(os.getpid(), GIB), (child.pid, 2 * GIB), (1, GIB)])
    backend = NvmlBackend.open(FakeNvml([gpu]))
    (dev,) = backend.devices()
    procs, gaps = dev.sample_processes(ProcessWatch())
    assert [(p.pid, p.memory_used) for p in procs] == sorted(
        [(os.getpid(), GIB), (child.pid, 2 * GIB)])
    gpu.errors["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    procs, gaps = dev.sample_processes(ProcessWatch())
    assert [p.pid for p in procs] == [os.getpid()] and GpuCapability.PROCESS_MEMORY not in gaps
    backend.close()
