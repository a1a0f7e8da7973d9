"""GPU cost per proof phase: kernel time, dispatches, bytes moved and energy, per span.

Every phase span of :class:`~otel_proofscope.instrumentation.ProofTracer` opens a
*frame* in a context variable; each GPU dispatch (``gpu.dispatch.Dispatch``) adds what
it measured to the innermost frame; when the phase ends its figures become attributes
of its span (see ``semconv.GPU_COST_ATTRIBUTES``) and are added to the parent frame, so
a span's figures include its children's and the ``proof`` span carries the totals.
Only measured values are attached: ``gpu.kernel.time`` only from device timestamps,
``gpu.busy.ratio`` only where kernel time was measured, ``gpu.energy`` only from an
energy meter (NVML counter deltas or integrated power samples), never a 0 in its place:
where the meter cannot read a phase that ran GPU work, that span gets a
``gpu.capability.unsupported`` event (``gpu.capability=energy``) with the reason; where
no meter exists the backend's once-per-runtime evidence already carries that event
(wgpu, NVML devices without counter or power) and the proof's result names the gap.

Hot path (one dispatch): one context-variable read, one dict lookup by thread id and
five attribute additions — no lock. Each thread that dispatches under a frame writes
only its own cell (a frame shared by threads through ``contextvars.copy_context``
stays exact); the cells are summed once, at the phase's end. Measured in
``benchmarks/bench_gpu.py`` (``attribution`` rows).

Dispatches in a thread that did not inherit the phase's context (a plain
``threading.Thread`` started inside the phase) have no frame and are not attributed;
their metrics are still counted.

This module sits on the instrumentation floor: it knows nothing of GPUs. The GPU
package registers an :class:`EnergyMeter` (``set_energy_meter``) when NVML is sampled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from otel_proofscope.semconv import (
    Attr,
    EventName,
    GapReason,
    GpuCapability,
    GpuScope,
    Metric,
)

_get_ident = threading.get_ident


# ── energy (implemented by otel_proofscope.gpu.energy) ───────────────────────────────


@dataclass(frozen=True)
class EnergyReading:
    """Energy over one phase, device-wide, summed over ``hw_ids``."""

    joules: float
    source: str  # semconv.EnergySource
    hw_ids: tuple[str, ...]


@dataclass(frozen=True)
class EnergyGap:
    """Why a phase's energy could not be measured."""

    reason: GapReason
    detail: str
    hw_id: str = ""
    backend: str = ""


class EnergyMeter(Protocol):
    """Reads energy at phase boundaries (called on the prover thread: keep it cheap)."""

    def begin(self) -> Any:
        """A snapshot at the phase's start."""
        ...

    def end(self, snapshot: Any) -> EnergyReading | EnergyGap:
        """Energy since ``snapshot``."""
        ...


_energy_meter: EnergyMeter | None = None
_energy_lock = threading.Lock()


def set_energy_meter(meter: EnergyMeter | None) -> EnergyMeter | None:
    """Install the process-wide energy meter (None removes it); returns the previous."""
    global _energy_meter
    with _energy_lock:
        previous, _energy_meter = _energy_meter, meter
    return previous


def energy_meter() -> EnergyMeter | None:
    return _energy_meter


#: Why there is no energy when no meter is installed (wgpu, no NVML device).
NO_METER = EnergyGap(GapReason.UNSUPPORTED,
                     "no energy meter: energy needs NVML (an NVIDIA device with an energy "
                     "counter or power readings); this backend exposes neither")


# ── frames ───────────────────────────────────────────────────────────────────────────


class Cell:
    """One thread's share of a frame (written by that thread only)."""

    __slots__ = ("backend", "dispatches", "hw_id", "kernel_s", "readback", "timed", "upload")

    def __init__(self) -> None:
        self.dispatches = 0
        self.timed = 0
        self.kernel_s = 0.0
        self.upload = 0
        self.readback = 0
        self.backend = ""
        self.hw_id = ""


@dataclass(frozen=True)
class PhaseCostResult:
    """What one phase cost (its children included)."""

    dispatches: int = 0
    timed_dispatches: int = 0
    kernel_s: float = 0.0
    upload_bytes: int = 0
    readback_bytes: int = 0
    duration_s: float = 0.0
    energy: EnergyReading | None = None
    energy_gap: EnergyGap | None = None
    backend: str = ""
    hw_id: str = ""

    @property
    def kernel_time(self) -> float | None:
        """Kernel seconds, None when no dispatch had device timestamps."""
        return self.kernel_s if self.timed_dispatches else None

    @property
    def busy_ratio(self) -> float | None:
        if not self.timed_dispatches or self.duration_s <= 0:
            return None
        return self.kernel_s / self.duration_s

    def attributes(self) -> dict[str, AttributeValue]:
        """The span attributes (only what was measured)."""
        out: dict[str, AttributeValue] = {}
        if self.dispatches:
            out[Attr.GPU_DISPATCH_COUNT] = self.dispatches
            out[Attr.GPU_UPLOAD_SIZE] = self.upload_bytes
            out[Attr.GPU_READBACK_SIZE] = self.readback_bytes
            if self.timed_dispatches:
                out[Attr.GPU_KERNEL_TIME] = self.kernel_s
                out[Attr.GPU_KERNEL_TIMED_DISPATCHES] = self.timed_dispatches
                ratio = self.busy_ratio
                if ratio is not None:
                    out[Attr.GPU_BUSY_RATIO] = ratio
        if self.energy is not None:
            out[Attr.GPU_ENERGY] = self.energy.joules
            out[Attr.GPU_ENERGY_SOURCE] = self.energy.source
            out[Attr.GPU_ENERGY_HW_IDS] = list(self.energy.hw_ids)
            out[Attr.GPU_SCOPE] = GpuScope.DEVICE.value
        return out


class Frame:
    """The GPU cost of one open phase."""

    __slots__ = ("_token", "cells", "child_energy_j", "children", "energy_snapshot", "labels",
                 "lock", "meter", "parent", "result", "start_ns")

    def __init__(self, parent: Frame | None, labels: Mapping[str, AttributeValue]) -> None:
        self.parent = parent
        self.cells: dict[int, Cell] = {}
        #: Closed child phases, summed (merged under ``lock``: once per child, not per
        #: dispatch). Kept apart from the cells so metrics can count exclusive figures.
        self.children = Cell()
        self.child_energy_j = 0.0
        self.lock = threading.Lock()
        self.labels = labels
        self.start_ns = time.perf_counter_ns()
        self.meter = _energy_meter
        self.energy_snapshot: Any = None
        self.result: PhaseCostResult | None = None
        self._token: Token[Frame | None] | None = None

    def cell(self) -> Cell:
        """This thread's cell (created on first use; dict.setdefault is atomic)."""
        c = self.cells.get(_get_ident())
        if c is None:
            c = self.cells.setdefault(_get_ident(), Cell())
        return c

    def totals(self, duration_s: float, *, children: bool = True) -> PhaseCostResult:
        d = t = up = rb = 0
        k = 0.0
        backend = hw_id = ""
        cells = list(self.cells.values())
        if children:
            cells.append(self.children)
        for c in cells:
            d += c.dispatches
            t += c.timed
            k += c.kernel_s
            up += c.upload
            rb += c.readback
            backend, hw_id = c.backend or backend, c.hw_id or hw_id
        return PhaseCostResult(d, t, k, up, rb, duration_s, backend=backend, hw_id=hw_id)


_current: ContextVar[Frame | None] = ContextVar("proofscope_phase_cost", default=None)


def current() -> Frame | None:
    """The innermost open phase of this context (the dispatch path reads this)."""
    return _current.get()


def charge(frame: Frame, backend: str, hw_id: str, kernel_s: float | None, upload: int,
           readback: int) -> None:
    """Add one dispatch to ``frame`` (called once per dispatch, at its end)."""
    c = frame.cell()
    c.dispatches += 1
    if kernel_s is not None:
        c.timed += 1
        c.kernel_s += kernel_s
    c.upload += upload
    c.readback += readback
    c.backend = backend
    c.hw_id = hw_id


class Recorder:
    """Opens and closes frames for one tracer; owns the per-phase metrics."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._kernel = Metric.GPU_PHASE_KERNEL_TIME.counter(meter)
        self._energy = Metric.GPU_PHASE_ENERGY.counter(meter)
        self._transfer = Metric.GPU_PHASE_TRANSFER_SIZE.counter(meter)

    def open(self, labels: Mapping[str, AttributeValue]) -> Frame:
        frame = Frame(_current.get(), labels)
        if frame.meter is not None:
            try:
                frame.energy_snapshot = frame.meter.begin()
            except Exception:  # a driver hiccup must never break the prover
                frame.meter = None
        frame._token = _current.set(frame)
        return frame

    def close(self, frame: Frame, span: Span) -> PhaseCostResult:
        """Attach the phase's figures to ``span`` (still open) and pass them up."""
        if frame._token is not None:
            try:
                _current.reset(frame._token)
            except ValueError:  # closed in another context: restore the parent instead
                _current.set(frame.parent)
        duration_s = (time.perf_counter_ns() - frame.start_ns) / 1e9
        own = frame.totals(duration_s, children=False)
        result = frame.totals(duration_s)
        energy: EnergyReading | None = None
        gap: EnergyGap | None = None
        if frame.meter is not None:
            try:
                got = frame.meter.end(frame.energy_snapshot)
            except Exception as exc:
                got = EnergyGap(GapReason.DRIVER_ERROR, f"energy read failed: {exc!r}"[:200])
            if isinstance(got, EnergyReading):
                energy = got
            else:
                gap = got
        elif result.dispatches:
            gap = NO_METER
        if energy is not None or gap is not None:
            result = PhaseCostResult(
                result.dispatches, result.timed_dispatches, result.kernel_s,
                result.upload_bytes, result.readback_bytes, duration_s, energy,
                gap if result.dispatches else None, result.backend, result.hw_id)
        frame.result = result
        if span.is_recording():
            attrs = result.attributes()
            if attrs:
                span.set_attributes(attrs)
            # Without a meter the runtime's once-only evidence already says why there is
            # no energy (wgpu: "exposes no energy telemetry"; NVML: the device's energy and
            # power gaps); a meter that could not read this phase says so on the phase.
            if result.energy_gap is not None and result.energy_gap is not NO_METER:
                g = result.energy_gap
                span.add_event(EventName.GPU_CAPABILITY_UNSUPPORTED, {
                    Attr.GPU_BACKEND: g.backend or result.backend,
                    Attr.GPU_CAPABILITY: GpuCapability.ENERGY.value,
                    Attr.GPU_CAPABILITY_REASON: g.reason.value,
                    Attr.GPU_CAPABILITY_DETAIL: g.detail,
                    Attr.HW_ID: g.hw_id or result.hw_id,
                })
        own_energy = None
        if energy is not None:
            with frame.lock:
                child_j = frame.child_energy_j
            own_energy = max(0.0, energy.joules - child_j)
        self._record(frame.labels, own, own_energy, energy)
        parent = frame.parent
        if parent is not None:
            with parent.lock:
                c = parent.children
                c.dispatches += result.dispatches
                c.timed += result.timed_dispatches
                c.kernel_s += result.kernel_s
                c.upload += result.upload_bytes
                c.readback += result.readback_bytes
                c.backend = result.backend or c.backend
                c.hw_id = result.hw_id or c.hw_id
                if energy is not None:
                    parent.child_energy_j += energy.joules
        return result

    def _record(self, labels: Mapping[str, AttributeValue], r: PhaseCostResult,
                own_energy_j: float | None, energy: EnergyReading | None) -> None:
        # Metrics count each phase's *own* figures (children excluded), so a
        # `sum by (proof_phase)` panel adds up to the proof without counting twice; the
        # proof's own share is what ran between its phases.
        if r.timed_dispatches:
            self._kernel.add(r.kernel_s, labels)
        if r.dispatches:
            if r.upload_bytes:
                self._transfer.add(r.upload_bytes,
                                   {**labels, Attr.NETWORK_IO_DIRECTION: "transmit"})
            if r.readback_bytes:
                self._transfer.add(r.readback_bytes,
                                   {**labels, Attr.NETWORK_IO_DIRECTION: "receive"})
        if energy is not None and own_energy_j is not None:
            self._energy.add(own_energy_j, {**labels, Attr.GPU_ENERGY_SOURCE: energy.source,
                                            Attr.GPU_SCOPE: GpuScope.DEVICE.value})


@contextmanager
def attribute(span: Span, recorder: Recorder, phase: str,
              labels: Mapping[str, AttributeValue] | None = None) -> Iterator[Frame]:
    """Attribute the GPU work inside the block to ``span`` (for spans not made by
    ``ProofTracer``): ``with phase_cost.attribute(span, recorder, "my.phase"): …``."""
    frame = recorder.open({Attr.PROOF_PHASE: phase, **(labels or {})})
    try:
        yield frame
    finally:
        recorder.close(frame, span)
