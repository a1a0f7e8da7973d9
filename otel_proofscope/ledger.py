"""The drop and rejection ledgers: every bounded queue, cap and sink reports its losses here.

One ledger per process (``DROPS``). Each loss is counted exactly under
(signal, sink, reason); the ``proofscope.dropped`` observable counter reads the ledger,
a rate-limited log line reports the running total, and the exit summary prints it, so
the three always agree with each other.

A process may configure more than one pipeline (one after another, or a test suite);
each pipeline's report counts only its own share: :meth:`DropLedger.mark` when it is
configured, :meth:`DropLedger.since` that mark (less what another pipeline claims) when
it reports.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from otel_proofscope.semconv import DISPLAY_CAPS, DROP_REASON_NOTES, Attr, DropReason

_log = logging.getLogger("otel_proofscope.drops")


@dataclass(frozen=True, order=True)
class DropKey:
    signal: str  # spans, span_events, metric_points, logs, rerun_rows, stream_events
    sink: str  # otlp, file, rerun, queue name …
    reason: str  # a semconv.DropReason value

    def attributes(self) -> dict[str, str]:
        return {
            Attr.PROOFSCOPE_SIGNAL: self.signal,
            Attr.PROOFSCOPE_SINK: self.sink,
            Attr.REASON: self.reason,
        }


@dataclass(frozen=True)
class LedgerMark:
    """The ledger's counts at one moment (:meth:`DropLedger.mark`)."""

    counts: Mapping[DropKey, int] = field(default_factory=dict)
    not_drawn: Mapping[DropKey, int] = field(default_factory=dict)


def _minus(now: Mapping[DropKey, int], *parts: Mapping[DropKey, int]) -> dict[DropKey, int]:
    out = {}
    for key, n in now.items():
        left = n - sum(p.get(key, 0) for p in parts)
        if left > 0:
            out[key] = left
    return out


class DropLedger:
    """Thread-safe exact counters of lost telemetry, with a rate-limited warning."""

    def __init__(self, log_interval_s: float = 10.0, name: str = "proofscope") -> None:
        self._lock = threading.Lock()
        self._counts: dict[DropKey, int] = {}
        self._not_drawn: dict[DropKey, int] = {}
        self._log_interval_s = log_interval_s
        self._last_log = -float("inf")
        self.name = name

    def record(self, signal: str, sink: str, reason: str, count: int = 1) -> None:
        if count <= 0:
            return
        key = DropKey(signal, sink, str(reason))
        if key.reason == DropReason.DISPLAY_CAP:  # nothing lost: counted apart, no warning
            with self._lock:
                self._not_drawn[key] = self._not_drawn.get(key, 0) + count
            return
        now = time.monotonic()
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + count
            due = now - self._last_log >= self._log_interval_s
            if due:
                self._last_log = now
                total = sum(self._counts.values())
        if due:
            _log.warning(
                "otel_proofscope dropped telemetry: %d so far (latest: %d %s to %s, %s)",
                total, count, signal, sink, reason,
            )

    def snapshot(self) -> dict[DropKey, int]:
        with self._lock:
            return dict(self._counts)

    def total(self, signal: str | None = None, sink: str | None = None,
              reason: str | None = None) -> int:
        return sum(
            n for k, n in self.snapshot().items()
            if (signal is None or k.signal == signal)
            and (sink is None or k.sink == sink)
            and (reason is None or k.reason == reason)
        )

    def not_drawn(self) -> dict[DropKey, int]:
        """Items a view left out under a display cap (complete elsewhere; not drops)."""
        with self._lock:
            return dict(self._not_drawn)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._not_drawn.clear()
            self._last_log = -float("inf")

    def mark(self) -> LedgerMark:
        """The counts now, for :meth:`since`."""
        with self._lock:
            return LedgerMark(dict(self._counts), dict(self._not_drawn))

    @classmethod
    def holding(cls, counts: Mapping[DropKey, int],
                not_drawn: Mapping[DropKey, int] | None = None) -> DropLedger:
        """A ledger that holds ``counts`` (a report's share; it never logs)."""
        view = cls(log_interval_s=math.inf)
        view._counts = {k: n for k, n in counts.items() if n > 0}
        view._not_drawn = {k: n for k, n in (not_drawn or {}).items() if n > 0}
        return view

    def since(self, mark: LedgerMark, less: Mapping[DropKey, int] | None = None,
              ) -> DropLedger:
        """A new ledger holding what was recorded after ``mark``, less ``less`` (losses
        another pipeline claims as its own): one pipeline's share of a process ledger.
        It never logs; its totals and summary lines are the share's."""
        with self._lock:
            counts, not_drawn = dict(self._counts), dict(self._not_drawn)
        view = DropLedger.holding(_minus(counts, mark.counts, less or {}),
                                  _minus(not_drawn, mark.not_drawn))
        view.name = self.name
        return view

    def summary_lines(self) -> list[str]:
        snap = self.snapshot()
        if not snap:
            lines = ["dropped: nothing"]
        else:
            lines = [f"dropped: {sum(snap.values())} item(s)"]
            lines += [f"  {n} {k.signal} → {k.sink} ({k.reason})"
                      for k, n in sorted(snap.items())]
            # Once per reason that a bare word would misstate, after the counts.
            lines += [f"  ({reason}: {note})" for reason, note in DROP_REASON_NOTES.items()
                      if any(k.reason == reason for k in snap)]
        for k, n in sorted(self.not_drawn().items()):
            why = DISPLAY_CAPS.get(k.signal, "")
            lines.append(f"not drawn in {k.sink} (display cap{'; ' + why if why else ''}): "
                         f"{n} {k.signal}")
        return lines


class RejectionLedger:
    """Counts bad input that the hot path records instead of raising."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def record(self, field: str, reason: str) -> None:
        with self._lock:
            self._counts[(field, reason)] = self._counts.get((field, reason), 0) + 1

    def snapshot(self) -> Mapping[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        return sum(self.snapshot().values())

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


#: The process-wide ledgers.
DROPS = DropLedger()
REJECTIONS = RejectionLedger()
