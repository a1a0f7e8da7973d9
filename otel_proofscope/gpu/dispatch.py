"""Dispatch accounting: what one kernel dispatch cost, measured, never estimated.

``GpuRuntime`` is one telemetry runtime on one device. Code that runs kernels wraps
each dispatch in ``runtime.dispatch()`` and reports what it measured::

    rt = GpuRuntime(identity, gaps=backend_gaps, meter_provider=mp)
    with rt.dispatch() as d:
        with d.upload(nbytes):            # host→device copy, timed by the block
            ...
        with d.submit():                  # submit → complete (block until done inside)
            ...
        d.record_kernel_timestamps(t0, t1, period_ns)   # device timestamps, if any
        with d.readback(nbytes):
            ...

On exit the dispatch is counted and the queue wait (submit-to-complete minus kernel
time) recorded when both were measured. The first dispatch of a runtime emits the
adapter identity and the backend's capability gaps on the active span; an exception
inside the block is recorded as a fault (``gpu.fault`` event and counter) and re-raised.
Allocation accounting is exact: Python integers under a lock, resident and peak
resident bytes reported as observable instruments once the runtime has allocated.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from opentelemetry import metrics
from opentelemetry.metrics import Observation
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from otel_proofscope.gpu import evidence
from otel_proofscope.gpu.backend import DeviceIdentity, Gap, HwState
from otel_proofscope.gpu.evidence import Evidence, EvidenceDedup, active_span
from otel_proofscope.gpu.instruments import instruments_for
from otel_proofscope.ledger import REJECTIONS
from otel_proofscope.semconv import Attr, EventName, GpuCapability, Metric, MetricDef

_log = logging.getLogger("otel_proofscope.gpu")

# Fault kinds (``gpu.fault.kind``).
FAULT_DEVICE_LOST = "device_lost"
FAULT_GPU_IS_LOST = "gpu_is_lost"
FAULT_OUT_OF_MEMORY = "out_of_memory"
FAULT_VALIDATION = "validation"
FAULT_TIMEOUT = "timeout"
FAULT_DISPATCH = "dispatch"

FaultClassifier = Callable[[BaseException], str]

#: Faults after which the device is gone (``hw.status`` becomes failed).
FATAL_FAULTS = frozenset({FAULT_DEVICE_LOST, FAULT_GPU_IS_LOST})


def default_fault_kind(exc: BaseException) -> str:
    """A fault kind from an exception, by the words backends use."""
    text = f"{type(exc).__name__} {exc}".lower()
    if "lost" in text:
        return FAULT_DEVICE_LOST
    if isinstance(exc, MemoryError) or "outofmemory" in text or "out of memory" in text:
        return FAULT_OUT_OF_MEMORY
    if isinstance(exc, TimeoutError) or "timeout" in text:
        return FAULT_TIMEOUT
    if "validation" in text:
        return FAULT_VALIDATION
    return FAULT_DISPATCH


class GpuRuntime:
    """One telemetry runtime on one device: dispatch, allocation and fault accounting."""

    def __init__(self, identity: DeviceIdentity, *, gaps: Iterable[Gap] = (),
                 meter_provider: metrics.MeterProvider | None = None,
                 claims: EvidenceDedup | None = None,
                 fault_kind: FaultClassifier = default_fault_kind,
                 report_status: bool = True) -> None:
        """``gaps``: what this backend cannot measure on this device, reported once at
        the first dispatch. ``report_status``: also report ``hw.status`` for the device
        (turn off when an NVML sampler already reports it)."""
        self.identity = identity
        self.runtime_id = evidence.new_runtime_id()
        self.fault_kind = fault_kind
        inst = instruments_for(meter_provider)
        self._evidence = Evidence(inst, claims)
        self._attrs: dict[str, AttributeValue] = identity.dispatch_attributes()
        self._dispatch_count = inst.counter(Metric.GPU_DISPATCH_COUNT)
        self._upload_size = inst.counter(Metric.GPU_UPLOAD_SIZE)
        self._upload_duration = inst.histogram(Metric.GPU_UPLOAD_DURATION)
        self._readback_size = inst.counter(Metric.GPU_READBACK_SIZE)
        self._readback_duration = inst.histogram(Metric.GPU_READBACK_DURATION)
        self._submit_duration = inst.histogram(Metric.GPU_SUBMIT_DURATION)
        self._kernel_duration = inst.histogram(Metric.GPU_KERNEL_DURATION)
        self._queue_wait = inst.histogram(Metric.GPU_QUEUE_WAIT_DURATION)
        self._alloc_count = inst.counter(Metric.GPU_ALLOC_COUNT)
        self._alloc_size = inst.counter(Metric.GPU_ALLOC_SIZE)
        self._free_size = inst.counter(Metric.GPU_FREE_SIZE)
        self._fault_count = inst.counter(Metric.GPU_FAULT_COUNT)
        self._retry_count = inst.counter(Metric.GPU_RETRY_COUNT)
        self._recovery_count = inst.counter(Metric.GPU_RECOVERY_COUNT)
        self._residual_count = inst.counter(Metric.GPU_RESIDUAL_BATCH_COUNT)
        self._lock = threading.Lock()
        self._gaps: dict[GpuCapability, Gap] = {g.capability: g for g in gaps}
        self._dispatches = 0
        self._resident = 0
        self._peak = 0
        self._allocated = False
        self._state = HwState.OK
        inst.observe(Metric.GPU_MEMORY_RESIDENT, self)
        inst.observe(Metric.GPU_MEMORY_RESIDENT_PEAK, self)
        if report_status:
            inst.observe(Metric.HW_STATUS, self)

    # ── state ────────────────────────────────────────────────────────────────────────

    @property
    def dispatches(self) -> int:
        """Dispatches entered so far (exact)."""
        with self._lock:
            return self._dispatches

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return self._resident

    @property
    def peak_resident_bytes(self) -> int:
        with self._lock:
            return self._peak

    @property
    def state(self) -> HwState:
        with self._lock:
            return self._state

    @property
    def gaps(self) -> dict[GpuCapability, Gap]:
        with self._lock:
            return dict(self._gaps)

    def measures(self, capability: GpuCapability) -> bool:
        with self._lock:
            return capability not in self._gaps

    # ── dispatch ─────────────────────────────────────────────────────────────────────

    @contextmanager
    def dispatch(self) -> Iterator[Dispatch]:
        """Account one kernel dispatch (see the module docstring)."""
        with self._lock:
            first = self._dispatches == 0
            self._dispatches += 1
        if first:
            self._first_dispatch_evidence()
        d = Dispatch(self)
        try:
            yield d
        except Exception as exc:
            self.fault(self.fault_kind(exc), detail=str(exc)[:200])
            raise
        finally:
            d._finish()
            self._dispatch_count.add(1, self._attrs)

    def _first_dispatch_evidence(self) -> None:
        span = active_span()
        self._evidence.adapter_acquired(self.runtime_id, self.identity, span)
        for gap in self.gaps.values():
            self._evidence.capability_unsupported(self.runtime_id, self.identity, gap, span)
        evidence.note_dispatch(span)

    def report_gap(self, gap: Gap) -> bool:
        """A gap found after construction (e.g. a feature turned out missing). Reported
        now if this runtime already dispatched, else at its first dispatch."""
        with self._lock:
            self._gaps[gap.capability] = gap
            dispatched = self._dispatches > 0
        if not dispatched:
            return False
        return self._evidence.capability_unsupported(self.runtime_id, self.identity, gap,
                                                     active_span())

    # ── allocation ───────────────────────────────────────────────────────────────────

    def alloc(self, nbytes: int) -> None:
        """One device allocation of ``nbytes``."""
        n = _bytes(nbytes, "gpu.alloc")
        if n == 0:
            return
        with self._lock:
            self._allocated = True
            self._resident += n
            if self._resident > self._peak:
                self._peak = self._resident
        self._alloc_count.add(1, self._attrs)
        self._alloc_size.add(n, self._attrs)

    def free(self, nbytes: int) -> None:
        """One device release. Freeing more than is resident is a caller bug: the excess
        is rejected (``proofscope.rejected``) and residency clamps at zero."""
        n = _bytes(nbytes, "gpu.free")
        if n == 0:
            return
        with self._lock:
            if n > self._resident:
                REJECTIONS.record("gpu.free", "exceeds_resident")
                n = self._resident
            self._resident -= n
        if n:
            self._free_size.add(n, self._attrs)

    # ── faults and their aftermath ───────────────────────────────────────────────────

    def fault(self, kind: str, *, detail: str = "", span: Span | None = None) -> None:
        """One device fault of ``kind`` (``gpu.fault`` event, counter, warning)."""
        if kind in FATAL_FAULTS:
            with self._lock:
                self._state = HwState.FAILED
        self._fault_count.add(1, {**self._attrs, Attr.GPU_FAULT_KIND: kind})
        self._event(EventName.GPU_FAULT, {Attr.GPU_FAULT_KIND: kind}, span)
        _log.warning("GPU fault on %s (%s): %s%s", self.identity.hw_id, self.identity.backend,
                     kind, f": {detail}" if detail else "")

    def retry(self, attempt: int, *, span: Span | None = None) -> None:
        """A dispatch retried; ``attempt`` is 1-based."""
        self._retry_count.add(1, self._attrs)
        self._event(EventName.GPU_RETRY, {Attr.GPU_RETRY_ATTEMPT: int(attempt)}, span)

    def recovery(self, route: str = "cpu", *, span: Span | None = None) -> None:
        """Work the device could not finish was completed by another ``route``."""
        self._recovery_count.add(1, self._attrs)
        self._event(EventName.GPU_RECOVERY, {Attr.GPU_RECOVERY_ROUTE: route}, span)

    def residual_batch(self, count: int = 1) -> None:
        """``count`` batches re-done on the CPU after a fault."""
        if count > 0:
            self._residual_count.add(count, self._attrs)

    def _event(self, name: str, extra: dict[str, AttributeValue], span: Span | None) -> None:
        target = span if span is not None else active_span()
        if target is not None and target.is_recording():
            target.add_event(name, {**self._attrs, **extra})

    # ── observable instruments ───────────────────────────────────────────────────────

    def observe(self, metric: MetricDef) -> Iterable[Observation]:
        with self._lock:
            allocated, dispatched = self._allocated, self._dispatches > 0
            resident, peak, state = self._resident, self._peak, self._state
        # Silent until used: a runtime created but never dispatched reports nothing.
        if metric is Metric.GPU_MEMORY_RESIDENT and allocated:
            return [Observation(resident, self._attrs)]
        if metric is Metric.GPU_MEMORY_RESIDENT_PEAK and allocated:
            return [Observation(peak, self._attrs)]
        if metric is Metric.HW_STATUS and dispatched:
            hw = self.identity.hw_attributes()
            return [Observation(1 if s is state else 0, {**hw, Attr.HW_STATE: s.value})
                    for s in HwState]
        return []


class Dispatch:
    """What one dispatch measured. Durations in seconds."""

    __slots__ = ("_rt", "kernel_s", "submit_s")

    def __init__(self, runtime: GpuRuntime) -> None:
        self._rt = runtime
        self.submit_s: float | None = None
        self.kernel_s: float | None = None

    @contextmanager
    def upload(self, nbytes: int) -> Iterator[None]:
        """Time a host→device copy of ``nbytes`` (block until it is on the device)."""
        start = time.perf_counter()
        yield
        self.record_upload(nbytes, time.perf_counter() - start)

    def record_upload(self, nbytes: int, seconds: float | None) -> None:
        """An upload measured elsewhere; ``seconds`` None when not separable."""
        rt = self._rt
        rt._upload_size.add(_bytes(nbytes, "gpu.upload.size"), rt._attrs)
        if seconds is not None:
            rt._upload_duration.record(_seconds(seconds, "gpu.upload.duration"), rt._attrs)

    @contextmanager
    def readback(self, nbytes: int) -> Iterator[None]:
        """Time a device→host copy of ``nbytes``."""
        start = time.perf_counter()
        yield
        self.record_readback(nbytes, time.perf_counter() - start)

    def record_readback(self, nbytes: int, seconds: float | None) -> None:
        rt = self._rt
        rt._readback_size.add(_bytes(nbytes, "gpu.readback.size"), rt._attrs)
        if seconds is not None:
            rt._readback_duration.record(_seconds(seconds, "gpu.readback.duration"),
                                         rt._attrs)

    @contextmanager
    def submit(self) -> Iterator[None]:
        """Time submit → complete: submit inside the block and wait for completion."""
        start = time.perf_counter()
        yield
        self.record_submit(time.perf_counter() - start)

    def record_submit(self, seconds: float) -> None:
        s = _seconds(seconds, "gpu.submit.duration")
        self.submit_s = s
        self._rt._submit_duration.record(s, self._rt._attrs)

    def record_kernel(self, seconds: float) -> None:
        """Kernel time measured on the device (timestamp queries, CUDA events)."""
        s = _seconds(seconds, "gpu.kernel.duration")
        self.kernel_s = s
        self._rt._kernel_duration.record(s, self._rt._attrs)

    def record_kernel_timestamps(self, begin: int, end: int, period_ns: float) -> None:
        """Kernel time from two device timestamps (ticks) and the tick period."""
        if end < begin:
            REJECTIONS.record("gpu.kernel.duration", "timestamps_reversed")
            return
        self.record_kernel((end - begin) * period_ns / 1e9)

    def _finish(self) -> None:
        if self.submit_s is None or self.kernel_s is None:
            return
        wait = self.submit_s - self.kernel_s
        if wait < 0:
            # Device and host clocks disagree; a negative wait is not a measurement.
            REJECTIONS.record("gpu.queue.wait.duration", "kernel_exceeds_submit")
            return
        self._rt._queue_wait.record(wait, self._rt._attrs)


def _bytes(n: int, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name}: byte count must be a non-negative int, got {n!r}")
    return n


def _seconds(s: float, name: str) -> float:
    if isinstance(s, bool) or not isinstance(s, int | float) or not s >= 0 or s == float("inf"):
        raise ValueError(f"{name}: duration must be a finite non-negative number of "
                         f"seconds, got {s!r}")
    return float(s)
