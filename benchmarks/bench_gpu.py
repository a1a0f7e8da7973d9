"""GPU telemetry cost: the sampler's CPU share at 10 Hz and per-dispatch accounting.

Run: python benchmarks/bench_gpu.py [--seconds 3]   (prints a markdown table)

* Sampler: ``time.process_time`` of the whole process over a few seconds while the
  sampler thread samples at 10 Hz and the main thread sleeps, as a share of one core.
  Without an NVIDIA driver the devices are the tests' pynvml stand-in, so this is the
  package's own cost; on an NVIDIA machine ``--real`` samples the real devices and adds
  the driver's cost (NVML calls are ioctls, typically tens of µs each).
* Dispatch: the cost of one fully-recorded ``GpuRuntime.dispatch()`` (upload, submit,
  kernel, readback, queue wait, count) on an SDK MeterProvider, against an empty loop;
  and, where a wgpu adapter exists, a real 64×64 M31 matmul for scale.
* Attribution (``phase_cost``): per dispatch, the same dispatch inside an open phase
  frame against outside one; per span, a frame's open + close on a recording SDK span
  with no GPU work, with one dispatch (attributes set, per-phase counters added), and
  with an NVML energy meter over the pynvml stand-in (the package's cost; a real driver
  adds one ioctl per device per boundary). Median and range of 7 interleaved runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_proofscope.gpu import evidence
from otel_proofscope.gpu.backend import DeviceIdentity
from otel_proofscope.gpu.dispatch import GpuRuntime
from otel_proofscope.gpu.evidence import EvidenceDedup
from otel_proofscope.gpu.nvml import NvmlBackend
from otel_proofscope.gpu.sampler import Sampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def sampler_cost(devices: int, seconds: float, real: bool) -> tuple[float, float, int]:
    """(% of one core at 10 Hz, µs per sample of all devices, samples taken)."""
    if real:
        backend = NvmlBackend.open()
    else:
        from fake_pynvml import FakeGpu, FakeNvml

        backend = NvmlBackend.open(FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(devices)]))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    sampler = Sampler(backend.devices(), meter_provider=mp, interval_s=0.1, claims=EvidenceDedup(),
                      on_close=backend.close)
    per_sample = []
    for _ in range(200):
        t = time.perf_counter()
        sampler.sample_now()
        per_sample.append(time.perf_counter() - t)
    taken = sampler.samples_taken
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    mp.shutdown()
    return 100 * cpu / wall, statistics.median(per_sample) * 1e6, sampler.samples_taken - taken


def dispatch_cost(n: int = 20_000) -> tuple[float, float, float]:
    """(µs per accounted dispatch, µs per bare loop iteration, µs per raw SDK
    ``counter.add`` with the same attributes, for scale: a dispatch records 8 points)."""
    evidence.reset_dispatch_state()
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    rt = GpuRuntime(DeviceIdentity("vulkan", "bench", "bench", "x", "1"), meter_provider=mp,
                    claims=EvidenceDedup())
    with rt.dispatch():  # first dispatch emits evidence; not part of the steady state
        pass

    def accounted() -> float:
        t = time.perf_counter()
        for _ in range(n):
            with rt.dispatch() as d:
                d.record_upload(4096, 1e-4)
                d.record_submit(2e-4)
                d.record_kernel(1e-4)
                d.record_readback(4096, 1e-4)
        return (time.perf_counter() - t) / n

    def bare() -> float:
        t = time.perf_counter()
        for _ in range(n):
            pass
        return (time.perf_counter() - t) / n

    counter = mp.get_meter("bench").create_counter("bench.raw")
    attrs = rt.identity.dispatch_attributes()

    def raw() -> float:
        t = time.perf_counter()
        for _ in range(n):
            counter.add(1, attrs)
        return (time.perf_counter() - t) / n

    acc = min(accounted() for _ in range(3))
    base = min(bare() for _ in range(3))
    one = min(raw() for _ in range(3))
    mp.shutdown()
    return acc * 1e6, base * 1e6, one * 1e6


def _interleaved(fns: dict[str, Any], runs: int = 7) -> dict[str, list[float]]:
    """Each function ``runs`` times, interleaved (a, b, c, a, b, c, …) so machine load
    drifts hit every variant alike; seconds per iteration."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            out[k].append(fn())
    return out


def _med_range(xs: list[float]) -> str:
    return (f"{statistics.median(xs) * 1e6:.2f} µs (range {min(xs) * 1e6:.2f}–"
            f"{max(xs) * 1e6:.2f})")


def attribution_cost(n: int = 20_000) -> dict[str, list[float]]:
    """Seconds per iteration, per variant (see the module docstring)."""
    from fake_pynvml import FakeGpu, FakeNvml
    from opentelemetry.sdk.trace import TracerProvider

    from otel_proofscope import phase_cost
    from otel_proofscope.gpu.energy import NvmlEnergyMeter
    from otel_proofscope.semconv import Attr

    evidence.reset_dispatch_state()
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    rt = GpuRuntime(DeviceIdentity("vulkan", "bench", "bench", "x", "1"), meter_provider=mp,
                    claims=EvidenceDedup())
    with rt.dispatch():
        pass
    rec = phase_cost.Recorder(mp.get_meter("bench"))
    span = TracerProvider().get_tracer("bench").start_span("bench")  # recording, never ended
    labels = {Attr.PROOF_PHASE: "proof.layer", Attr.LAYER_KIND: "MatMul"}

    def dispatches(framed: bool) -> Any:
        def run() -> float:
            frame = rec.open(labels) if framed else None
            t = time.perf_counter()
            for _ in range(n):
                with rt.dispatch() as d:
                    d.record_upload(4096, None)
                    d.record_kernel(1e-4)
                    d.record_readback(4096, None)
            dt = (time.perf_counter() - t) / n
            if frame is not None:
                rec.close(frame, span)
            return dt
        return run

    def spans(with_dispatch: bool, meter: Any) -> Any:
        m = max(1, n // 10)

        def run() -> float:
            previous = phase_cost.set_energy_meter(meter)
            try:
                t = time.perf_counter()
                for _ in range(m):
                    frame = rec.open(labels)
                    if with_dispatch:
                        phase_cost.charge(frame, "vulkan", "bench", 1e-4, 4096, 4096)
                    rec.close(frame, span)
                return (time.perf_counter() - t) / m
            finally:
                phase_cost.set_energy_meter(previous)
        return run

    def charge_only() -> float:
        # The whole per-dispatch hot path of attribution, without the dispatch around it.
        frame = rec.open(labels)
        current, charge = phase_cost.current, phase_cost.charge
        t = time.perf_counter()
        for _ in range(n):
            f = current()
            if f is not None:
                charge(f, "vulkan", "bench", 1e-4, 4096, 4096)
        dt = (time.perf_counter() - t) / n
        rec.close(frame, span)
        return dt

    backend = NvmlBackend.open(FakeNvml([FakeGpu()]))
    meter = NvmlEnergyMeter(backend.devices())
    try:
        return _interleaved({
            "dispatch outside a phase": dispatches(False),
            "dispatch inside a phase": dispatches(True),
            "context read + charge only": charge_only,
            "span, no GPU work": spans(False, None),
            "span, one dispatch": spans(True, None),
            "span, one dispatch + NVML energy (stand-in)": spans(True, meter),
        })
    finally:
        backend.close()
        mp.shutdown()


def real_matmul_ms() -> tuple[str, float] | None:
    try:
        import numpy as np

        from otel_proofscope.demo.gpu_kernels import P, WgpuMatmul

        mm = WgpuMatmul(meter_provider=MeterProvider(), claims=EvidenceDedup())
    except Exception:
        return None
    rng = np.random.default_rng(0)
    a = rng.integers(0, P, size=(64, 64))
    mm.matmul_m31(a, a)
    runs = []
    for _ in range(10):
        t = time.perf_counter()
        mm.matmul_m31(a, a)
        runs.append(time.perf_counter() - t)
    return mm.device.identity.name, statistics.median(runs) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--real", action="store_true", help="sample the real NVML devices")
    args = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    for devices in ([0] if args.real else [1, 8]):
        pct, us, taken = sampler_cost(devices, args.seconds, args.real)
        label = "real NVML devices" if args.real else f"{devices} device(s), pynvml stand-in"
        rows.append((f"sampler at 10 Hz, {label}", f"{pct:.3f} % of one core",
                     f"{us:.0f} µs per sample; {taken} samples in {args.seconds:g} s; "
                     "target <= 1 %"))
    acc, base, one = dispatch_cost()
    rows.append(("dispatch accounting (upload+submit+kernel+readback+count)",
                 f"{acc - base:.1f} µs per dispatch",
                 f"8 data points; one raw SDK counter.add here costs {one:.1f} µs"))
    att = attribution_cost()
    outside = statistics.median(att["dispatch outside a phase"])
    inside = statistics.median(att["dispatch inside a phase"])
    rows.append(("attribution per dispatch (inside a phase − outside)",
                 f"{(inside - outside) * 1e6:.2f} µs",
                 f"inside {_med_range(att['dispatch inside a phase'])}, outside "
                 f"{_med_range(att['dispatch outside a phase'])}; 7 interleaved runs"))
    rows.append(("attribution per dispatch, hot path alone (context read + charge)",
                 _med_range(att["context read + charge only"]),
                 "no lock; 7 interleaved runs"))
    for key in ("span, no GPU work", "span, one dispatch",
                "span, one dispatch + NVML energy (stand-in)"):
        rows.append((f"attribution per span: {key}", _med_range(att[key]),
                     "frame open + close on a recording span; 7 interleaved runs"))
    real: Any = real_matmul_ms()
    if real is not None:
        name, ms = real
        rows.append(("real 64×64 M31 matmul (wgpu), median of 10", f"{ms:.2f} ms",
                     f"{name}; accounting is {100 * (acc - base) / 1e3 / ms:.2f} % of it"))
    print("| measurement | result | notes |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
