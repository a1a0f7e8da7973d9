"""One warning per interval for an export destination that keeps failing, and one line
when it works again.

Why: against a dead collector every batch fails, and the exporter warned once per
batch: a 200,000-span burst printed 25 identical lines (one per 342-span batch) in 15 s,
burying the exit summary that says what was lost. The spans themselves are counted in
the drop ledger whatever is logged (its own rate-limited line and the summary give the
totals); this only keeps the *why* readable: the first failure in full, then at most one
line per interval saying how many exports failed since and the latest reason.
"""

from __future__ import annotations

import logging
import threading
import time

#: Seconds between two warnings about the same destination (the drop ledger's interval).
INTERVAL_S = 10.0


class FailureLog:
    """Rate-limited failure warnings for one destination (thread-safe)."""

    def __init__(self, log: logging.Logger, destination: str,
                 interval_s: float = INTERVAL_S) -> None:
        self._log = log
        self._destination = destination
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._unlogged = 0  # failures since the last warning
        self._unlogged_spans = 0
        self._failing = 0  # failures since the last success

    def failed(self, spans: int, message: str, *args: object) -> None:
        """One failed export of ``spans`` spans: ``message % args`` says why."""
        now = time.monotonic()
        with self._lock:
            self._failing += 1
            self._unlogged += 1
            self._unlogged_spans += spans
            if now - self._last < self._interval_s:
                return
            earlier, earlier_spans = self._unlogged - 1, self._unlogged_spans - spans
            self._last, self._unlogged, self._unlogged_spans = now, 0, 0
        text = message % args if args else message
        if earlier:
            text += (f" ({earlier} earlier failed export(s) of {earlier_spans} span(s) "
                     f"to {self._destination} not logged one by one)")
        self._log.warning("%s", text, stacklevel=2)

    def succeeded(self) -> None:
        """An export went through: say so once if the ones before it failed."""
        if not self._failing:  # the common case, without the lock
            return
        with self._lock:
            failing, self._failing = self._failing, 0
            self._last, self._unlogged, self._unlogged_spans = -float("inf"), 0, 0
        if failing:
            self._log.warning("OTLP export to %s works again after %d failed export(s) "
                              "(their spans are counted in proofscope.dropped)",
                              self._destination, failing)
