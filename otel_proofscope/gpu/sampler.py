"""Device telemetry off the hot path: a background thread samples, callbacks read a cache.

The sampler thread reads every device at a fixed interval and keeps the last sample
per device. The observable instruments (``hw.gpu.*``, ``hw.*``) only read that cache
when the SDK collects, so collection never waits on the driver and a prover thread
never calls NVML. One device that faults or raises does not stop the others.

Gaps and faults found while sampling:

* a field the device cannot give → a capability gap, claimed once per (device runtime,
  backend, capability). By default the gap is *held* until some :class:`GpuRuntime`
  dispatches (then it lands on that dispatch's span, the counter and the log), so
  sampling during a CPU proof emits no evidence. ``evidence="immediately"`` emits at
  once (counter and log; no span on the sampler thread), for wrapped processes that
  dispatch outside Python.
* ``GPU_IS_LOST`` → ``hw.status`` becomes ``failed``, ``gpu.fault.count`` (kind
  ``gpu_is_lost``) and one warning; the device's fields become driver-error gaps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from opentelemetry import metrics
from opentelemetry.metrics import Observation
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from otel_proofscope.gpu import evidence as ev
from otel_proofscope.gpu.backend import (
    BackendUnavailable,
    DeviceIdentity,
    DeviceSample,
    DeviceSource,
    Gap,
    HwState,
)
from otel_proofscope.gpu.evidence import Evidence, EvidenceDedup
from otel_proofscope.gpu.instruments import instruments_for
from otel_proofscope.semconv import Attr, Metric, MetricDef

_log = logging.getLogger("otel_proofscope.gpu")

EvidenceMode = Literal["first_dispatch", "immediately"]

#: Device metrics this sampler reports.
DEVICE_METRICS: tuple[MetricDef, ...] = (
    Metric.HW_GPU_UTILIZATION, Metric.HW_GPU_MEMORY_USAGE, Metric.HW_GPU_MEMORY_LIMIT,
    Metric.HW_GPU_MEMORY_UTILIZATION, Metric.HW_GPU_IO, Metric.HW_ERRORS, Metric.HW_STATUS,
    Metric.HW_POWER, Metric.HW_ENERGY, Metric.HW_GPU_TEMPERATURE, Metric.HW_GPU_CLOCK_SM,
    Metric.HW_GPU_CLOCK_MEMORY,
)

_SCALARS: dict[str, Callable[[DeviceSample], float | int | None]] = {
    Metric.HW_GPU_UTILIZATION.name: lambda s: s.utilization,
    Metric.HW_GPU_MEMORY_USAGE.name: lambda s: s.memory_used,
    Metric.HW_GPU_MEMORY_LIMIT.name: lambda s: s.memory_limit,
    Metric.HW_GPU_MEMORY_UTILIZATION.name: lambda s: (
        s.memory_used / s.memory_limit
        if s.memory_used is not None and s.memory_limit else None),
    Metric.HW_POWER.name: lambda s: s.power_w,
    Metric.HW_ENERGY.name: lambda s: s.energy_j,
    Metric.HW_GPU_TEMPERATURE.name: lambda s: s.temperature_c,
    Metric.HW_GPU_CLOCK_SM.name: lambda s: s.clock_sm_hz,
    Metric.HW_GPU_CLOCK_MEMORY.name: lambda s: s.clock_memory_hz,
}


class Sampler:
    """Samples devices on a background thread; observable instruments read the cache."""

    def __init__(self, sources: Sequence[DeviceSource], *,
                 meter_provider: metrics.MeterProvider | None = None,
                 interval_s: float = 1.0, claims: EvidenceDedup | None = None,
                 evidence: EvidenceMode = "first_dispatch",
                 on_close: Callable[[], None] | None = None) -> None:
        if not isinstance(interval_s, int | float) or not 0.001 <= interval_s <= 3600:
            raise ValueError(f"interval_s must be between 0.001 and 3600 s, got {interval_s!r}")
        if evidence not in ("first_dispatch", "immediately"):
            raise ValueError(f"evidence must be 'first_dispatch' or 'immediately', "
                             f"got {evidence!r}")
        self.sources = list(sources)
        self.interval_s = float(interval_s)
        self.evidence_mode: EvidenceMode = evidence
        self._on_close = on_close
        inst = instruments_for(meter_provider)
        self._evidence = Evidence(inst, claims)
        self._fault_count = inst.counter(Metric.GPU_FAULT_COUNT)
        # Each sampled device is its own telemetry runtime for once-only evidence.
        self._runtime_ids = [ev.new_runtime_id() for _ in self.sources]
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()  # one sampling pass at a time
        self._latest: dict[str, DeviceSample] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failing: set[int] = set()
        self.samples_taken = 0
        self.sample_errors = 0
        for d in DEVICE_METRICS:
            inst.observe(d, self)

    # ── lifecycle ────────────────────────────────────────────────────────────────────

    def start(self) -> Sampler:
        """Take one sample now, then keep sampling every ``interval_s`` on a thread."""
        if self._thread is not None:
            return self
        self.sample_now()
        self._thread = threading.Thread(target=self._run, name="proofscope-gpu-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_due = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_due - time.monotonic())):
            self.sample_now()
            next_due += self.interval_s
            now = time.monotonic()
            if next_due < now:  # fell behind (slow driver): skip, don't burst
                next_due = now + self.interval_s

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop sampling; True if the thread ended within ``timeout_s``. Idempotent."""
        self._stop.set()
        ended = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            ended = not self._thread.is_alive()
            if not ended:
                _log.warning("GPU sampler thread did not stop within %.1f s (driver call "
                             "blocked?); it is a daemon and will not hold the exit",
                             timeout_s)
        with self._lock:
            closing = not self._closed
            self._closed = True
        if closing and self._on_close is not None:
            try:
                self._on_close()
            except Exception as exc:  # closing telemetry must never break the prover
                _log.debug("GPU backend close failed: %s", exc)
        return ended

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    # ── sampling ─────────────────────────────────────────────────────────────────────

    def sample_now(self) -> dict[str, DeviceSample]:
        """Sample every device once (also what the thread does each tick)."""
        with self._sample_lock:
            self._sample_all()
        return self.latest()

    def _sample_all(self) -> None:
        for i, src in enumerate(self.sources):
            try:
                s = src.sample()
            except Exception as exc:
                self.sample_errors += 1
                if i not in self._failing:
                    self._failing.add(i)
                    _log.warning("GPU sampling of %s failed: %r; other devices continue",
                                 src.identity.hw_id, exc)
                continue
            self._failing.discard(i)
            with self._lock:
                self._latest[s.identity.hw_id] = s
            self._account(self._runtime_ids[i], s)
        self.samples_taken += 1

    def latest(self) -> dict[str, DeviceSample]:
        with self._lock:
            return dict(self._latest)

    def _account(self, runtime_id: int, s: DeviceSample) -> None:
        ident = s.identity
        if s.fault is not None:
            attrs: dict[str, AttributeValue] = {**ident.dispatch_attributes(),
                                                Attr.GPU_FAULT_KIND: s.fault}
            self._fault_count.add(1, attrs)
            _log.warning("GPU fault on %s (%s, %s): %s; its sampling stops, other devices "
                         "continue", ident.hw_id, ident.name, ident.backend, s.fault)
        for gap in s.gaps.values():
            if self._evidence.claims.first((runtime_id, ident.backend, gap.capability.value)):
                self._emit_gap(ident, gap)

    def _emit_gap(self, ident: DeviceIdentity, gap: Gap) -> None:
        def emit(span: Span | None) -> None:
            self._evidence.emit_gap(ident, gap, span)

        if self.evidence_mode == "immediately":
            emit(ev.active_span())
        else:
            ev.defer_until_dispatch(emit)

    # ── observable instruments ───────────────────────────────────────────────────────

    def observe(self, metric: MetricDef) -> Iterable[Observation]:
        if self._stop.is_set():
            return []
        out: list[Observation] = []
        for s in self.latest().values():
            hw = s.identity.hw_attributes()
            if metric is Metric.HW_STATUS:
                out.extend(Observation(1 if st is s.state else 0, {**hw, Attr.HW_STATE: st.value})
                           for st in HwState)
            elif s.state is HwState.FAILED:
                continue
            elif metric is Metric.HW_GPU_IO:
                for direction, v in (("transmit", s.io_transmit), ("receive", s.io_receive)):
                    if v is not None:
                        out.append(Observation(v, {**hw, Attr.NETWORK_IO_DIRECTION: direction}))
            elif metric is Metric.HW_ERRORS:
                out.extend(Observation(n, {**hw, Attr.ERROR_TYPE: kind})
                           for kind, n in s.errors.items())
            else:
                value = _SCALARS[metric.name](s)
                if value is not None:
                    out.append(Observation(value, hw))
        return out


def start_sampler(meter_provider: metrics.MeterProvider | None = None,
                  interval_s: float = 1.0, *, nvml: Any = None,
                  evidence: EvidenceMode = "first_dispatch",
                  claims: EvidenceDedup | None = None) -> Sampler | None:
    """Start sampling every NVIDIA device NVML sees; None when there is none.

    wgpu adapters expose no device-level telemetry (utilization, memory, power …), so
    they are not sampled; their gaps are reported by the dispatch runtime instead.
    ``nvml``: a ``pynvml``-compatible module (default: the real one).
    """
    from otel_proofscope.gpu.nvml import NvmlBackend

    try:
        backend = NvmlBackend.open(nvml)
    except BackendUnavailable as exc:
        _log.debug("no GPU sampler: %s", exc)
        return None
    devices = backend.devices()
    if not devices:
        backend.close()
        return None
    return Sampler(devices, meter_provider=meter_provider, interval_s=interval_s,
                   claims=claims, evidence=evidence, on_close=backend.close).start()
