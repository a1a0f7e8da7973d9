"""Once-per-runtime GPU evidence: adapter identity and capability gaps.

Evidence fires on the **first dispatch** under a telemetry runtime, never when an
adapter is acquired, so a CPU proof that merely *could* use a GPU stays silent. Each
record is claimed once per ``(runtime, backend, slot)`` in a bounded, process-wide
dedup set; a claim that does not fit is dropped, counted exactly (also in the
``DROPS`` ledger) and warned about with the running loss, never silently re-recorded.
The key includes the backend, so one runtime that drives two backends reports each
backend's gaps.

A gap becomes three things: a ``gpu.capability.unsupported`` span event on the active
span, a ``gpu.capability.unsupported`` counter increment, and one log line.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Hashable

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from otel_proofscope import instrumentation
from otel_proofscope.gpu.backend import DeviceIdentity, Gap
from otel_proofscope.gpu.instruments import Instruments
from otel_proofscope.ledger import DROPS
from otel_proofscope.semconv import Attr, DropReason, EventName, Metric

_log = logging.getLogger("otel_proofscope.gpu")

#: Upper bound on retained dedup keys. A runtime records one identity slot plus at
#: most one slot per capability (12), so 1024 covers ~78 fully reported runtimes.
MAX_EVIDENCE_KEYS = 1024

IDENTITY_SLOT = "identity"

#: ``proofscope.sink`` under which dedup overflow is counted in the DROPS ledger.
DEDUP_SINK = "gpu_evidence_dedup"


class EvidenceDedup:
    """Bounded set of the GPU evidence records already emitted (once per key); overflow
    is counted exactly, never re-recorded."""

    def __init__(self, capacity: int = MAX_EVIDENCE_KEYS) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._seen: set[Hashable] = set()
        self._lost = 0

    def first(self, key: Hashable) -> bool:
        """True exactly once per key; False on repeats and when full (the latter counted)."""
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) >= self.capacity:
                self._lost += 1
                lost = self._lost
            else:
                self._seen.add(key)
                return True
        DROPS.record("span_events", DEDUP_SINK, DropReason.SIZE_CAP)
        _log.warning(
            "GPU evidence dedup set is full (capacity %d); dropped the once-per-runtime "
            "record %r; %d record(s) lost so far", self.capacity, key, lost)
        return False

    @property
    def lost(self) -> int:
        with self._lock:
            return self._lost

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._seen

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()
            self._lost = 0

    claim = first  # the name before "claim" meant only the sumcheck claim


#: The process-wide dedup set.
EVIDENCE_DEDUP = EvidenceDedup()

_runtime_ids = itertools.count(1)


def new_runtime_id() -> int:
    """A process-unique id for one telemetry runtime."""
    return next(_runtime_ids)


def active_span() -> Span | None:
    """The span evidence attaches to: OTel's current span, else the proof-phase span."""
    span = trace.get_current_span()
    if span.is_recording():
        return span
    phase = instrumentation.current_span()
    if phase is not None and phase.is_recording():
        return phase
    return None


class Evidence:
    """Emits identity and gap evidence through one provider's instruments."""

    def __init__(self, instruments: Instruments, claims: EvidenceDedup | None = None) -> None:
        self.claims = claims if claims is not None else EVIDENCE_DEDUP
        self._unsupported = instruments.counter(Metric.GPU_CAPABILITY_UNSUPPORTED)

    def adapter_acquired(self, runtime_id: int, identity: DeviceIdentity,
                         span: Span | None = None) -> bool:
        """Record the device identity once per (runtime, backend). True if recorded now."""
        if not self.claims.first((runtime_id, identity.backend, IDENTITY_SLOT)):
            return False
        if span is not None and span.is_recording():
            span.add_event(EventName.GPU_ADAPTER_ACQUIRED, identity.event_attributes())
        _log.info(
            "GPU adapter: %s (%s, vendor %s, pci %s:%s, driver %s) as %s on backend %s",
            identity.name, "software" if identity.software else "hardware", identity.vendor,
            _hex(identity.pci_vendor_id), _hex(identity.pci_device_id),
            identity.driver_version or "?", identity.hw_id, identity.backend)
        return True

    def capability_unsupported(self, runtime_id: int, identity: DeviceIdentity, gap: Gap,
                               span: Span | None = None) -> bool:
        """Report one gap once per (runtime, backend, capability). True if reported now."""
        key = (runtime_id, identity.backend, gap.capability.value)
        if not self.claims.first(key):
            return False
        self.emit_gap(identity, gap, span)
        return True

    def emit_gap(self, identity: DeviceIdentity, gap: Gap, span: Span | None) -> None:
        """Emit an already-claimed gap: event, counter and one log line."""
        if span is not None and span.is_recording():
            attrs: dict[str, AttributeValue] = {
                Attr.GPU_BACKEND: identity.backend,
                Attr.GPU_CAPABILITY: gap.capability.value,
                Attr.GPU_CAPABILITY_REASON: gap.reason.value,
                Attr.HW_ID: identity.hw_id,
            }
            if gap.detail:
                attrs[Attr.GPU_CAPABILITY_DETAIL] = gap.detail
            span.add_event(EventName.GPU_CAPABILITY_UNSUPPORTED, attrs)
        self._unsupported.add(1, {
            Attr.GPU_BACKEND: identity.backend,
            Attr.GPU_CAPABILITY: gap.capability.value,
            Attr.GPU_CAPABILITY_REASON: gap.reason.value,
        })
        _log.info("GPU capability unsupported: %s on %s (backend %s): %s%s",
                  gap.capability.value, identity.hw_id, identity.backend, gap.reason.value,
                  f" — {gap.detail}" if gap.detail else "")


def _hex(v: int | None) -> str:
    return "?" if v is None else f"{v:#06x}"


# ── evidence found off the dispatch path (the sampler's thread) ──────────────────────
#
# The sampler claims its records when it finds them but holds them until some runtime
# dispatches, so that merely sampling a GPU during a CPU proof emits no evidence. The
# pending list is bounded by the claim set: only claimed records are queued.

_pending_lock = threading.Lock()
_pending: list[Callable[[Span | None], None]] = []
_dispatch_seen = False


def defer_until_dispatch(emit: Callable[[Span | None], None]) -> None:
    """Run ``emit(span)`` at the first dispatch of any runtime (now, if one happened)."""
    with _pending_lock:
        if not _dispatch_seen:
            _pending.append(emit)
            return
    emit(active_span())


def note_dispatch(span: Span | None) -> None:
    """Called by every runtime's first dispatch: flush deferred evidence onto ``span``."""
    global _dispatch_seen
    with _pending_lock:
        _dispatch_seen = True
        todo = list(_pending)
        _pending.clear()
    for emit in todo:
        emit(span)


def pending_count() -> int:
    with _pending_lock:
        return len(_pending)


def reset_dispatch_state() -> None:
    """Forget that a dispatch happened and drop deferred records (tests)."""
    global _dispatch_seen
    with _pending_lock:
        _dispatch_seen = False
        _pending.clear()
