"""Spans a Rerun sink cannot take yet, held as the packed frames they came in.

Why: in the export process the frame loop must never wait for the Rerun view (a slow
view would hold up OTLP, and at the shutdown deadline the frames still unread were lost
for both sinks), so a burst the translation lags behind used to overflow the Rerun
sink's queue (measured: 10,991 of a 20,200-span burst lost, counted). Unpacked spans
cost ~2.5 KB each with 4 round events and ~7.4 KB with 16; their packed frame ~540 B and
~1.5 KB. So the backlog keeps the frame bytes, a feeder thread unpacks each again when
the sink has room, and the spans reach the view late instead of not at all.

Bounded: at most :data:`MAX_BYTES` of frames, and in the export process no more than its
shared byte budget leaves (:mod:`otel_proofscope.pipeline.budget`); a frame past that is
counted lost for the Rerun sink (``queue_full``), as is whatever still waits when
:meth:`PackedBacklog.close` runs out of time (``shutdown``). Order is kept: while
anything waits, new frames queue behind it, except a trace's root.

A root (a span without a parent) goes ahead of what waits, to the front of the sink's
queue: it ends last, so it is in the last frame, and when the exit bound cut a 200,000-span
burst's tail (42,756 spans, counted) the root went with it and the view drew every span
it had as an orphan of a parent never received. Ahead of the others (and kept when the
rest of its frame is past the bound), the root is drawn with the next batch and what
follows goes straight under it. At most
:data:`MAX_ROOTS_PER_FRAME` a frame and :data:`MAX_ROOTS` waiting (unpacked, a few KB
each); a frame of more roots (many single-span traces) keeps its order.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.budget import ByteBudget
from otel_proofscope.rerun import span_wire
from otel_proofscope.rerun.target import LEDGER_SINK
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)

#: Packed frame bytes held at most (the export process's memory, not the prover's).
MAX_BYTES = 64 * 2**20
#: How often the feeder looks whether the sink has room again.
POLL_S = 0.005
#: Roots taken ahead of what waits, per frame and in all (see the module).
MAX_ROOTS_PER_FRAME = 4
MAX_ROOTS = 64


class SpanQueue(Protocol):
    """What the backlog feeds: :class:`~otel_proofscope.rerun.sink.RerunSink`."""

    def fits(self, spans: Sequence[ReadableSpan]) -> int: ...

    def submit_spans(self, spans: Sequence[ReadableSpan], *, witness: bool = False,
                     first: bool = False) -> int: ...


class _Held:
    """A frame's spans from ``skip`` on (the first ``skip`` went straight in), less
    those at ``taken`` (indices from ``skip``: roots that went ahead)."""

    __slots__ = ("clean", "events", "payload", "skip", "spans", "taken", "witness")

    def __init__(self, payload: bytes, skip: int, spans: int, events: int,
                 witness: bool, clean: bool = False, taken: frozenset[int] = frozenset()
                 ) -> None:
        self.payload = payload
        self.skip = skip
        self.spans = spans
        self.events = events
        self.witness = witness
        self.clean = clean  # no record of the frame was refused by its first unpack
        self.taken = taken


#: Roots that went ahead of the held frames, and their frame's witness flag.
_Roots = tuple[list[ReadableSpan], bool]


def _roots(spans: Sequence[ReadableSpan]) -> list[int]:
    """Where the roots of ``spans`` are, if there are few enough to go ahead."""
    at: list[int] = []
    for i, span in enumerate(spans):
        if span.parent is None:
            if len(at) == MAX_ROOTS_PER_FRAME:
                return []
            at.append(i)
    return at


class PackedBacklog:
    """In front of one Rerun sink: spans go straight in while it has room, else wait
    packed, in order, until a feeder thread can hand them over."""

    def __init__(self, sink: SpanQueue, ledger: DropLedger, *,
                 max_bytes: int = MAX_BYTES, poll_s: float = POLL_S,
                 budget: ByteBudget | None = None) -> None:
        self._sink = sink
        self._ledger = ledger
        self._max_bytes = max(1, max_bytes)
        self._poll_s = poll_s
        self._held: collections.deque[_Held] = collections.deque()
        #: Roots gone ahead of ``_held``, unpacked, with their frame's witness flag.
        self._roots: collections.deque[_Roots] = collections.deque()
        self._bytes = 0
        self._feeding = False  # a frame taken off the deque, not yet submitted
        self._closed = False
        self._give_up = False
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        #: The most bytes held at once (a figure for tests and benchmarks).
        self.peak_bytes = 0
        #: Shared with the other queues of the process (the export process's), if any.
        self._budget = None if budget is None else budget.share(lambda: self._bytes)

    def submit(self, spans: Sequence[ReadableSpan], payload: bytes, *,
               witness: bool = False, clean: bool = False) -> None:
        """``spans`` (unpacked from ``payload``, invalid ones already left out and
        counted): to the sink now if it has room and nothing waits, else held.
        ``clean``: none was left out, so a held frame is unpacked again without
        building its round events' fields (the Rerun translations read them unbuilt)."""
        if not spans:
            return
        with self._cond:
            now = 0 if self._held or self._roots or self._feeding or self._closed \
                else self._sink.fits(spans)
            if now < len(spans):
                rest = spans[now:]
                events = sum(map(event_count, rest))
                # A trace's root goes ahead, even of a frame past the bound: without
                # it the view draws every span it has as an orphan.
                waiting = sum(len(r) for r, _ in self._roots)
                at = _roots(rest) if not self._closed and waiting < MAX_ROOTS else []
                if at:
                    roots = [rest[i] for i in at]
                    self._roots.append((roots, witness))
                    events -= sum(map(event_count, roots))
                if self._closed or self._bytes + len(payload) > self._max_bytes or (
                        self._budget is not None and self._budget.room() < len(payload)):
                    reason = DropReason.SHUTDOWN if self._closed else DropReason.QUEUE_FULL
                    self._lose(len(rest) - len(at), events, reason)
                else:
                    self._held.append(_Held(payload, now, len(rest) - len(at), events,
                                            witness, clean, frozenset(at)))
                    self._bytes += len(payload)
                    self.peak_bytes = max(self.peak_bytes, self._bytes)
                if self._held or self._roots:
                    self._start()
                    self._cond.notify_all()
        if now:  # outside the lock: the sink's own lock, and nothing is held before these
            self._sink.submit_spans(spans[:now], witness=witness)

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything held has been handed to the sink (not yet drawn:
        flush the sink after this)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            while self._held or self._roots or self._feeding:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float) -> None:
        """Hand over what it can within ``timeout_s``; count the rest lost."""
        drained = self.drain(timeout_s)
        with self._cond:
            self._closed = True
            self._give_up = not drained
            lost = list(self._held)
            self._held.clear()
            roots = [span for spans, _ in self._roots for span in spans]
            self._roots.clear()
            self._bytes = 0
            self._cond.notify_all()
        for held in lost:
            self._lose(held.spans, held.events, DropReason.SHUTDOWN)
        if roots:
            self._lose(len(roots), sum(map(event_count, roots)), DropReason.SHUTDOWN)

    # ── the feeder thread ────────────────────────────────────────────────────────────

    def _start(self) -> None:
        # Called under the lock.
        if self._thread is None:
            self._thread = threading.Thread(target=self._feed, daemon=True,
                                            name="proofscope-rerun-backlog")
            self._thread.start()

    def _feed(self) -> None:
        while True:
            with self._cond:
                while not self._held and not self._roots and not self._closed:
                    self._cond.wait()
                if not self._held and not self._roots:
                    return
                # Roots first (see the module); a frame's bytes stay counted until it
                # is handed over.
                item: _Roots | _Held = self._roots.popleft() if self._roots \
                    else self._held.popleft()
                self._feeding = True
            try:
                if isinstance(item, _Held):
                    self._hand_over(item)
                else:
                    self._offer(*item, first=True)
            except Exception as exc:  # the feeder must survive anything
                _log.warning("rerun backlog: held spans could not be drawn: %r", exc)
                if isinstance(item, _Held):
                    self._lose(item.spans, item.events, DropReason.INVALID)
                else:
                    self._lose(len(item[0]), sum(map(event_count, item[0])),
                               DropReason.INVALID)
            with self._cond:
                self._feeding = False
                if isinstance(item, _Held) and not self._closed:  # else zeroed by close()
                    self._bytes -= len(item.payload)
                self._cond.notify_all()

    def _hand_over(self, held: _Held) -> None:
        # The same spans as the first unpack (its rejections were counted then); a frame
        # with none refused needs no second check of its round records to be the same.
        spans = span_wire.unpack_spans(held.payload,
                                       check_records=not held.clean).spans[held.skip:]
        if held.taken:
            spans = [span for i, span in enumerate(spans) if i not in held.taken]
        self._offer(spans, held.witness)

    def _offer(self, spans: Sequence[ReadableSpan], witness: bool, *,
               first: bool = False) -> None:
        """Hand ``spans`` to the sink as it has room; what is left when the close gives
        up is counted."""
        while spans:
            n = self._sink.fits(spans)
            if n:
                self._sink.submit_spans(spans[:n], witness=witness, first=first)
                spans = spans[n:]
                continue
            with self._cond:
                if self._give_up:
                    break
            time.sleep(self._poll_s)
        if spans:
            self._lose(len(spans), sum(map(event_count, spans)), DropReason.SHUTDOWN)

    def _lose(self, spans: int, events: int, reason: str) -> None:
        self._ledger.record("spans", LEDGER_SINK, reason, spans)
        self._ledger.record("span_events", LEDGER_SINK, reason, events)
