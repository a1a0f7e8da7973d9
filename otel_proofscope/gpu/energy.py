"""Energy per proof phase from NVML: counter deltas, else integrated power samples.

:class:`NvmlEnergyMeter` implements ``phase_cost.EnergyMeter``. At each phase boundary
it reads every watched device once:

* where the device has NVML's cumulative energy counter
  (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and
  later), the phase's energy is the counter's delta: ``gpu.energy.source=counter``;
* where it has no counter but reports power (``nvmlDeviceGetPowerUsage``, mW), the
  power readings taken at the boundaries and by the sampler thread in between are
  integrated with trapezoids: ``gpu.energy.source=sampled``. A phase shorter than the
  sampling interval is then a straight line between its two boundary readings;
* where it has neither, the phase gets no ``gpu.energy`` and a
  ``gpu.capability.unsupported`` event says why (never a 0).

Energy is device-wide: NVML counts every process on the device, so the attribute says
``gpu.scope=device`` and names the devices (``gpu.energy.hw_ids``). MIG instances have
no energy counter of their own; the physical device's is used (and named).

The counter ticks every few tens of milliseconds, so a phase shorter than that may see
no tick at all: it then gets a gap (reason ``unavailable``), not a 0, and the figures
of short phases are quantized to the ticks that fell inside them (their parent's, and
the proof's, are not affected).

Cost: one NVML call per device per phase boundary (a few µs on a real driver).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from otel_proofscope.gpu.nvml import NvmlDevice, error_name, gap_reason
from otel_proofscope.phase_cost import EnergyGap, EnergyReading
from otel_proofscope.semconv import EnergySource, GapReason


class _Integrator:
    """∫ P dt over the power readings seen so far (trapezoids), in joules."""

    __slots__ = ("joules", "last_t", "last_w", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.joules = 0.0
        self.last_t: float | None = None
        self.last_w = 0.0

    def add(self, t: float, watts: float) -> float:
        with self.lock:
            if self.last_t is not None and t > self.last_t:
                self.joules += 0.5 * (watts + self.last_w) * (t - self.last_t)
            if self.last_t is None or t >= self.last_t:
                self.last_t, self.last_w = t, watts
            return self.joules


@dataclass
class _Watched:
    device: NvmlDevice
    source: EnergySource | None
    gap: EnergyGap | None
    integrator: _Integrator


class NvmlEnergyMeter:
    """Energy of the physical NVIDIA devices at phase boundaries."""

    def __init__(self, devices: Sequence[NvmlDevice], *,
                 clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._watched: list[_Watched] = []
        for dev in devices:
            if dev.identity.parent_hw_id is not None:
                continue  # a MIG instance: its parent's counter is read instead
            self._watched.append(self._probe(dev))

    def _probe(self, dev: NvmlDevice) -> _Watched:
        nvml, h = dev.nvml, dev.handle
        integ = _Integrator()
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            return _Watched(dev, EnergySource.COUNTER, None, integ)
        except nvml.NVMLError as exc:
            counter_err = error_name(exc)
        try:
            integ.add(self._clock(), int(nvml.nvmlDeviceGetPowerUsage(h)) / 1000.0)
            return _Watched(dev, EnergySource.SAMPLED, None, integ)
        except nvml.NVMLError as exc:
            return _Watched(dev, None, EnergyGap(
                gap_reason(nvml, exc.value),
                f"NVML: energy counter {counter_err}, power {error_name(exc)}",
                dev.identity.hw_id, dev.identity.backend), integ)

    @property
    def sources(self) -> dict[str, str | None]:
        """hw.id → energy source (None: unmeasurable)."""
        return {w.device.identity.hw_id: (w.source.value if w.source else None)
                for w in self._watched}

    def add_power_sample(self, hw_id: str, watts: float, t: float | None = None) -> None:
        """A power reading taken elsewhere (the sampler thread): refines the integral."""
        for w in self._watched:
            if w.source is EnergySource.SAMPLED and w.device.identity.hw_id == hw_id:
                w.integrator.add(self._clock() if t is None else t, watts)

    def _read(self, w: _Watched) -> float | None:
        """Joules so far on the device's scale (counter or integral); None on failure."""
        nvml, h = w.device.nvml, w.device.handle
        try:
            if w.source is EnergySource.COUNTER:
                return int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) / 1000.0
            if w.source is EnergySource.SAMPLED:
                return w.integrator.add(self._clock(),
                                        int(nvml.nvmlDeviceGetPowerUsage(h)) / 1000.0)
        except nvml.NVMLError:
            return None
        return None

    def begin(self) -> list[float | None]:
        return [self._read(w) for w in self._watched]

    def end(self, snapshot: Any) -> EnergyReading | EnergyGap:
        start: list[float | None] = list(snapshot or [])
        total = 0.0
        hw_ids: list[str] = []
        sampled = False
        gap: EnergyGap | None = None
        for w, s0 in zip(self._watched, start, strict=False):
            if w.source is None:
                gap = gap or w.gap
                continue
            s1 = self._read(w)
            ident = w.device.identity
            if s0 is None or s1 is None:
                gap = gap or EnergyGap(GapReason.DRIVER_ERROR,
                                       "NVML energy read failed at a phase boundary",
                                       ident.hw_id, ident.backend)
                continue
            if s1 < s0:  # counter reset (driver reload): not a measurement
                gap = gap or EnergyGap(GapReason.DRIVER_ERROR,
                                       "NVML energy counter went backwards (driver reload?)",
                                       ident.hw_id, ident.backend)
                continue
            if s1 == s0 and w.source is EnergySource.COUNTER:
                # A powered GPU never draws 0 W: the counter did not tick during this
                # phase (it updates every few tens of ms), which is not a measurement.
                gap = gap or EnergyGap(GapReason.UNAVAILABLE,
                                       "phase shorter than the NVML energy counter's update "
                                       "period (no tick between its boundaries)",
                                       ident.hw_id, ident.backend)
                continue
            total += s1 - s0
            hw_ids.append(ident.hw_id)
            sampled = sampled or w.source is EnergySource.SAMPLED
        if not hw_ids:
            return gap or EnergyGap(GapReason.UNAVAILABLE, "no NVIDIA device to read")
        return EnergyReading(total, (EnergySource.SAMPLED if sampled
                                     else EnergySource.COUNTER).value, tuple(hw_ids))
