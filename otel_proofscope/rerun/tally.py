"""How many received spans Rerun drew, next to the ones it did not (one summary line).

Every span handed to a Rerun sink ends in exactly one place: drawn in the trace view
(counted here, once the frame holding it was sent) or lost for a reason (counted in
the drop ledger under signal ``spans``, sink ``rerun``). The summary line puts both
together, so a run that drew nothing can never read as "nothing dropped"::

    rerun: drawn 14 spans (2 as orphans: parent never received); not drawn 0
    rerun: drawn 18 spans (9 drawn late: their parent arrived after them); not drawn 0
    rerun: drawn 8 spans (4 left where they were drawn before their parent arrived:
      its lane had grown too large to redraw); not drawn 0
    rerun: drawn 0 spans; not drawn 14 (sink_unavailable 14)

A child-process translator reports its own counts to the parent (``process.py``),
which adds them here.
"""

from __future__ import annotations

import threading

from otel_proofscope.ledger import DropLedger
from otel_proofscope.semconv import SINK_RERUN


class DrawTally:
    """Thread-safe running counts of spans drawn, of those drawn as orphans (parent
    never received), of those drawn before their parent arrived and then moved under
    it (*late*: an orphan whose parent came turns into a late span), and of those whose
    parent came too late to move them (*stranded*: their lane was over
    ``flame.MAX_GROUP_SPANS`` and is never redrawn, so they stay where they were drawn)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.drawn = 0
        self.orphans = 0
        self.late = 0
        self.stranded = 0

    def add(self, drawn: int, orphans: int = 0, late: int = 0, stranded: int = 0) -> None:
        if drawn or orphans or late or stranded:
            with self._lock:
                self.drawn += drawn
                self.orphans += orphans
                self.late += late
                self.stranded += stranded

    def reset(self) -> None:
        with self._lock:
            self.drawn = self.orphans = self.late = self.stranded = 0

    def summary_line(self, ledger: DropLedger) -> str:
        """``drawn N spans; not drawn M (reason n, …)`` for the sink ``rerun``."""
        with self._lock:
            drawn, orphans, late, stranded = self.drawn, self.orphans, self.late, self.stranded
        lost: dict[str, int] = {}
        for key, n in ledger.snapshot().items():
            if key.signal == "spans" and key.sink == SINK_RERUN:
                lost[key.reason] = lost.get(key.reason, 0) + n
        line = f"rerun: drawn {drawn} span{'s' if drawn != 1 else ''}"
        notes = []
        if late:
            notes.append(f"{late} drawn late: their parent arrived after them")
        if stranded:
            notes.append(f"{stranded} left where they were drawn before their parent "
                         "arrived: its lane had grown too large to redraw")
        if orphans:
            notes.append(f"{orphans} as orphans: parent never received")
        if notes:
            line += " (" + "; ".join(notes) + ")"
        line += f"; not drawn {sum(lost.values())}"
        if lost:
            line += " (" + ", ".join(f"{r} {n}" for r, n in sorted(lost.items())) + ")"
        return line


#: The process-wide tally (the counterpart of ``DROPS``).
TALLY = DrawTally()
