"""A two-GPU NVIDIA machine whose readings move over time, behind the pynvml stand-in.

``fake_pynvml.FakeNvml`` returns whatever its ``FakeGpu`` fields hold; a dashboard
needs readings that change (rates, a varying utilization). Here each device follows a
workload ``load(t)`` in [0.1, 0.9] (a sine with its own period and phase), and every
reading is derived from it the way the hardware relates them:

* utilization (%), memory used, power and temperature follow the load;
* the counters NVML keeps cumulative stay cumulative and never decrease: PCIe TX/RX
  bytes and energy (mJ) are integrals of the load in closed form, corrected ECC errors
  count up on one device (a real, slowly failing HBM cell), uncorrected stay 0 so
  both devices remain ``hw.state=ok``.

Readings are a function of the time since construction (``clock`` is injectable); only
the sampler thread reads the devices once sampling has started.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fake_pynvml import FakeGpu, FakeHandle, FakeNvml

GIB = 1024**3


@dataclass(frozen=True)
class Workload:
    """How one device is driven, and what it is."""

    gpu: FakeGpu
    period_s: float
    phase: float
    idle_w: float
    max_w: float
    pcie_tx_peak: float  # bytes/s at full load
    pcie_rx_peak: float
    working_set: int  # memory used at full load, above the resident base
    ecc_corrected_every_s: float | None = None

    def load(self, t: float) -> float:
        return 0.5 + 0.4 * math.sin(2 * math.pi * t / self.period_s + self.phase)

    def load_integral(self, t: float) -> float:
        """∫₀ᵗ load; non-decreasing because load > 0."""
        w = 2 * math.pi / self.period_s
        return 0.5 * t + 0.4 * (math.cos(self.phase) - math.cos(w * t + self.phase)) / w


#: Two devices of different models, at different loads and phases.
MACHINE: tuple[Workload, ...] = (
    Workload(FakeGpu(name="NVIDIA H100 80GB HBM3",
                     uuid="GPU-6f1e9a52-3c1b-4f0e-9a55-2d4b7c1e0a11",
                     pci_device_id=0x233010DE, bus_id="00000000:41:00.0",
                     memory_total=80 * GIB, memory_used=9 * GIB,
                     power_mw=120_000, energy_mj=52_113_207_000, temperature_c=38,
                     pcie_tx_bytes=8_411_220_480, pcie_rx_bytes=31_022_665_728,
                     ecc_corrected=3),
             period_s=6.0, phase=0.0, idle_w=72.0, max_w=690.0,
             pcie_tx_peak=3.2e9, pcie_rx_peak=11.5e9, working_set=48 * GIB),
    Workload(FakeGpu(name="NVIDIA A100-SXM4-40GB",
                     uuid="GPU-3b0d7e41-9a2c-4c55-8f10-6e2a1d9c7b33",
                     pci_device_id=0x20B010DE, bus_id="00000000:81:00.0",
                     memory_total=40 * GIB, memory_used=4 * GIB,
                     power_mw=60_000, energy_mj=17_804_554_000, temperature_c=35,
                     clock_sm_mhz=1410, clock_mem_mhz=1215,
                     pcie_tx_bytes=2_004_877_312, pcie_rx_bytes=6_510_338_048,
                     ecc_corrected=117),
             period_s=4.0, phase=1.9, idle_w=55.0, max_w=400.0,
             pcie_tx_peak=1.1e9, pcie_rx_peak=6.0e9, working_set=22 * GIB,
             ecc_corrected_every_s=1.5),
)


class MovingNvml(FakeNvml):
    """``FakeNvml`` over :data:`MACHINE`; every device read sees the state at that moment."""

    def __init__(self, workloads: tuple[Workload, ...] = MACHINE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Own copies: the FakeGpu fields are mutated, MACHINE stays as declared.
        self.workloads = tuple(replace(w, gpu=copy.deepcopy(w.gpu)) for w in workloads)
        self._clock = clock
        self._t0 = clock()
        # Frozen starting values; the live FakeGpu fields are derived from them.
        self._base = [(w.gpu.memory_used, w.gpu.energy_mj, w.gpu.pcie_tx_bytes,
                       w.gpu.pcie_rx_bytes, w.gpu.ecc_corrected) for w in self.workloads]
        super().__init__([w.gpu for w in self.workloads])

    def _gpu(self, handle: FakeHandle, fn: str) -> FakeGpu:
        self._advance(handle.index)
        return super()._gpu(handle, fn)

    def _advance(self, index: int) -> None:
        w, gpu = self.workloads[index], self.gpus[index]
        mem0, energy0, tx0, rx0, ecc0 = self._base[index]
        t = self._clock() - self._t0
        load, done = w.load(t), w.load_integral(t)
        power_w = w.idle_w + (w.max_w - w.idle_w) * load
        gpu.util_gpu = round(100 * load)
        gpu.util_memory = round(70 * load)
        gpu.memory_used = min(gpu.memory_total, mem0 + int(w.working_set * load))
        gpu.power_mw = int(power_w * 1000)
        gpu.temperature_c = 34 + round(40 * load)
        # Cumulative counters: max() so float rounding can never step one back by a unit
        # (Prometheus would read that as a counter reset).
        # energy: idle for t seconds plus the load-proportional part, in mJ.
        gpu.energy_mj = max(gpu.energy_mj, energy0 + int(
            1000 * (w.idle_w * t + (w.max_w - w.idle_w) * done)))
        gpu.pcie_tx_bytes = max(gpu.pcie_tx_bytes, tx0 + int(w.pcie_tx_peak * done))
        gpu.pcie_rx_bytes = max(gpu.pcie_rx_bytes, rx0 + int(w.pcie_rx_peak * done))
        if w.ecc_corrected_every_s:
            gpu.ecc_corrected = max(gpu.ecc_corrected,
                                    ecc0 + int(t / w.ecc_corrected_every_s))

    def uuids(self) -> list[str]:
        return [w.gpu.uuid for w in self.workloads]


__all__ = ["MACHINE", "MovingNvml", "Workload"]
