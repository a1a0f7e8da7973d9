"""Accounting for one proof stream: what arrived, what was rejected, what was lost.

Every rejected line is counted in the process ledgers (``REJECTIONS`` by field and
reason, ``DROPS`` under signal ``stream_events``) so ``proofscope.dropped`` /
``proofscope.rejected`` and the exit summary agree with this report.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from otel_proofscope.integrations.proof_stream.decoder import Decoded, DecodeError
from otel_proofscope.ledger import DROPS, REJECTIONS
from otel_proofscope.semconv import DropReason

#: The ``signal`` under which stream losses are filed in ``DROPS``.
SIGNAL = "stream_events"
#: How many rejection messages are kept for the report (all are counted).
MAX_KEPT_ERRORS = 20


@dataclass
class StreamStats:
    source: str
    lines: int = 0
    events: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    errors: list[DecodeError] = field(default_factory=list)
    notes: Counter[tuple[str, str]] = field(default_factory=Counter)
    lagged: int = 0
    bridge_problems: Counter[str] = field(default_factory=Counter)
    reconnects: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, decoded: Decoded) -> None:
        with self._lock:
            self.lines += 1
            for note in decoded.notes:
                self.notes[note] += 1
                REJECTIONS.record(f"stream.{note[0]}", note[1])
            if decoded.event is not None:
                self.events[type(decoded.event).__name__] += 1
                return
            err = decoded.error
            if err is None:
                return
            self.rejected += 1
            self.rejected_by_reason[err.reason] += 1
            if len(self.errors) < MAX_KEPT_ERRORS:
                self.errors.append(err)
        where = err.variant or "line"
        if err.field:
            where += "." + err.field
        REJECTIONS.record(f"stream.{where}", err.reason)
        reason = DropReason.SIZE_CAP if err.reason == "line_too_long" else DropReason.INVALID
        DROPS.record(SIGNAL, self.source, reason.value)

    def record_lagged(self, count: int) -> None:
        """The producer reported ``count`` events lost before they reached us."""
        with self._lock:
            self.lagged += count
        DROPS.record(SIGNAL, f"{self.source}-upstream", DropReason.QUEUE_FULL.value, count)

    def record_problem(self, what: str, count: int = 1) -> None:
        """An event that decoded but could not be placed (e.g. an end without a start)."""
        with self._lock:
            self.bridge_problems[what] += count
        REJECTIONS.record(f"stream.{what}", "out_of_order")

    @property
    def decoded(self) -> int:
        return sum(self.events.values())

    def lines_report(self) -> list[str]:
        with self._lock:
            out = [f"proof-stream {self.source}: {self.lines} line(s), {self.decoded} event(s)"
                   + (f" ({', '.join(f'{n} {k}' for k, n in sorted(self.events.items()))})"
                      if self.events else "")]
            if self.rejected:
                reasons = ", ".join(f"{n} {r}" for r, n in sorted(self.rejected_by_reason.items()))
                out.append(f"  rejected {self.rejected} line(s): {reasons}")
                out += [f"    {e.message()}" for e in self.errors]
                if self.rejected > len(self.errors):
                    out.append(f"    … and {self.rejected - len(self.errors)} more")
            for (path, kind), n in sorted(self.notes.items()):
                label = "unknown field" if kind == "unknown_field" else "unknown value"
                out.append(f"  skipped {label} {path} ×{n}")
            if self.lagged:
                out.append(f"  producer reported {self.lagged} event(s) lost (lagged)")
            for what, n in sorted(self.bridge_problems.items()):
                out.append(f"  {what}: {n}")
            if self.reconnects:
                out.append(f"  reconnected {self.reconnects} time(s); events sent while "
                           "disconnected are not counted")
            return out
