"""One Rerun recording per target: a bounded queue and a background sender thread.

The exporters only enqueue (``submit_*`` never blocks and never calls Rerun); the
sender thread translates and sends. Every item that does not reach Rerun is counted in
:data:`~otel_proofscope.ledger.DROPS` under sink ``rerun``: queue full, viewer
unavailable, shutdown deadline, or invalid input.

Targets (``PROOFSCOPE_RERUN``): ``file:PATH.rrd`` (the default, ``file:proofscope.rrd``),
``spawn`` (start a local viewer), ``rerun+http://HOST:PORT/proxy`` (a running viewer or
``rerun --serve-grpc``), ``off``.

A viewer that is absent or dies is detected with a TCP probe before connecting and
every second while sending (the Rerun SDK would otherwise block ~5 s in
``connect_grpc`` and then drop data silently): one warning, items counted as
``sink_unavailable`` (including those sent since the last successful probe, whose
delivery cannot be confirmed), and a reconnect attempt every few seconds.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

import rerun as rr
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.budget import ByteBudget
from otel_proofscope.pipeline.forking import after_fork_in_child
from otel_proofscope.pipeline.output_files import UnsafeOutputError, open_output_fd
from otel_proofscope.pipeline.processor import estimate_bytes
from otel_proofscope.rerun import blueprint, exit_guard, span_guard
from otel_proofscope.rerun.columns import Frame, Send
from otel_proofscope.rerun.display import display_unavailable
from otel_proofscope.rerun.liveness import speaks_http2, tcp_accepts
from otel_proofscope.rerun.model import GapTable, ProofRegistry
from otel_proofscope.rerun.shared import SharedByTarget
from otel_proofscope.rerun.tally import TALLY
from otel_proofscope.rerun.target import LEDGER_SINK, Target
from otel_proofscope.rerun.translate import Issues, SpanTranslator
from otel_proofscope.rerun.translate_metrics import MetricIssues, MetricTranslator
from otel_proofscope.rerun.translate_trace import TraceIssues, TraceTranslator
from otel_proofscope.semconv import DISPLAY_CAPS, DropReason

_log = logging.getLogger(__name__)

APP_ID = "otel_proofscope"
#: Signal under which contract spans the 3D walk could not use are counted (the trace
#: view still draws them; what it cannot draw is counted under ``spans``).
WALK_SIGNAL = "proof_walk_spans"
#: Items (spans or metric points) queued before new ones are dropped and counted.
DEFAULT_QUEUE = 8192
#: The same bound in estimated bytes (``pipeline.processor.estimate_bytes``): a span's
#: memory grows with its events (a 16-round layer span holds ~17 KB), so 8,192 queued
#: spans could hold ~140 MB. Batches taken off the queue for one frame are capped at a
#: quarter of it.
DEFAULT_QUEUE_BYTES = 16 * 2**20
#: The bound in a child process (the Rerun worker, the export process), whose memory is
#: not the prover's: a burst the translation lags behind is held rather than dropped, as
#: the 8,192-span count bound held it before bytes were counted (measured on the child
#: route: 5,636 of a 20,200-span burst lost at 16 MiB, none before).
CHILD_QUEUE_BYTES = 128 * 2**20
#: Spans translated together (one frame, one send per entity).
MAX_BATCH = 4096
#: The same once close() has begun: a batch still being translated at the deadline is
#: abandoned whole, so at the end the batches are small and what was translated in time
#: is sent (measured in the export process: 1,131 spans of 32 rounds abandoned with the
#: full-size batches after a 5,050-layer burst).
CLOSING_BATCH = 128


def no_display() -> str | None:
    """Why a spawned viewer cannot open a window here, or None where it can (a display
    variable that is set must also name a server that answers)."""
    return display_unavailable()


#: Whether something accepts TCP connections at host:port (kept for callers).
probe = tcp_accepts


@dataclass
class SinkStats:
    spans_received: int = 0
    spans_translated: int = 0
    metric_points_received: int = 0
    batches: int = 0
    rerun_calls: int = 0
    rows: int = 0
    spans_drawn: int = 0  # in the trace view (every span, contract or not)
    orphans: int = 0  # of which drawn without their parent (never received)
    late: int = 0  # of which drawn before their parent came, then moved under it
    stranded: int = 0  # of which drawn before their parent came, left where they were
    coerced: int = 0
    translate_errors: list[str] = field(default_factory=list)

    def drawn_counts(self) -> list[int]:
        """``[drawn, orphans, late, stranded]``: what a child process reports."""
        return [self.spans_drawn, self.orphans, self.late, self.stranded]

    def add_drawn(self, d: TraceIssues, sign: int = 1) -> None:
        """Count what ``d`` drew (``sign=-1``: take back what was never confirmed), here
        and in the process-wide tally."""
        counts = (sign * d.drawn, sign * d.orphans, sign * d.late, sign * d.stranded)
        self.spans_drawn += counts[0]
        self.orphans += counts[1]
        self.late += counts[2]
        self.stranded += counts[3]
        TALLY.add(*counts)


@dataclass
class _Item:
    kind: Literal["spans", "metrics", "flush", "stop"]
    payload: Any = None
    n: int = 0
    events: int = 0
    witness: bool = False
    done: threading.Event | None = None
    size: int = 0  # estimated bytes held (spans)


class RerunSink:
    """Translates and sends to one target on a background thread."""

    def __init__(self, target: Target, *, queue_size: int = DEFAULT_QUEUE,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES, probe_interval_s: float = 1.0,
                 retry_interval_s: float = 5.0,
                 connect_timeout_s: float = 5.0, write_timeout_s: float = 5.0,
                 ledger: DropLedger = DROPS, budget: ByteBudget | None = None,
                 budget_reserve: int = 0) -> None:
        if queue_size < 1 or queue_bytes < 1:
            raise ValueError("queue_size and queue_bytes must be >= 1")
        self.target = target
        #: Whether a file target gets Rerun's footer, an index of every chunk for fast
        #: random access. The SDK keeps that index in memory until the file is closed,
        #: ~300 B a chunk (~8 KB a single-span trace in ``serve``), so a long-running
        #: session turns it off (rerun-sdk's own advice); read when the file opens.
        self.footer = True
        self.stats = SinkStats()
        self._capacity = queue_size
        self._capacity_bytes = queue_bytes
        self._batch_bytes = max(1, queue_bytes // 4)
        self._queued_bytes = 0
        #: Shared with the other queues of the process (the export process's), if any.
        self._budget = None if budget is None else budget.share(
            lambda: self._queued_bytes, reserve=budget_reserve)
        self._probe_interval = probe_interval_s
        self._retry_interval = retry_interval_s
        self._connect_timeout = connect_timeout_s
        self._write_timeout = write_timeout_s
        self._ledger = ledger
        self._queue: collections.deque[_Item] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        self._abandoned = False
        self._in_flight: list[_Item] = []
        gaps = GapTable()
        self.spans = SpanTranslator(ProofRegistry(), gaps)
        self.metrics = MetricTranslator(gaps)
        self.trace = TraceTranslator()
        # Sent to a viewer, not yet confirmed alive: trace-view counts and translator calls.
        self._unconfirmed_drawn = TraceIssues()
        self._unconfirmed_calls: set[int] = set()
        self._gap_overflow = 0
        self._rec: rr.RecordingStream | None = None
        # The layout follows the data: panels for what the recording holds (blueprint.py).
        self._layouts = blueprint.Layouts()
        self._available: bool | None = None
        self._next_retry = 0.0
        self._last_probe = 0.0
        self._unconfirmed: list[_Item] = []
        #: Called on the sender thread with (spans, span events, metric points) of each
        #: batch it finished (drawn and written, or counted lost): the export process
        #: settles what a file holds while it draws, not only at a flush.
        self.on_batch_done: Callable[[int, int, int], None] | None = None
        self._warned_unavailable = False
        self._warned_translate = False
        self._warned_poison = False
        self._shutdown_timeout = 3.0
        self._file_lock: int | None = None
        self._forked = False
        after_fork_in_child(self._after_fork_in_child)
        exit_guard.install()

    def _after_fork_in_child(self) -> None:
        # A forked process inherits this sink but not its thread, and must not write to
        # its parent's recording: it counts its own items as sink_unavailable. What was
        # queued belongs to the parent, which sends it.
        self._cond = threading.Condition(threading.Lock())
        self._forked = True
        self._queue.clear()
        self._queued = 0
        self._queued_bytes = 0
        self._in_flight = []
        self._unconfirmed = []

    def _refuse_forked(self, item: _Item) -> None:
        self._lose_item(item, DropReason.SINK_UNAVAILABLE)
        if not self._warned_unavailable:
            self._warned_unavailable = True
            _log.warning("rerun: this process was forked from the one that owns the Rerun "
                         "recording %s; its own spans and metrics are not drawn (counted in "
                         "proofscope.dropped as sink_unavailable); OTLP export is "
                         "unaffected", self.target.name)

    # ── producer side (exporter threads): never blocks, never calls Rerun ────────────

    def submit_spans(self, spans: Sequence[ReadableSpan], *, witness: bool = False,
                     first: bool = False) -> int:
        """Queue ``spans`` (ahead of everything queued if ``first``: a trace's root the
        export process's backlog let go ahead); returns how many were accepted (the rest
        are counted)."""
        if not spans:
            return 0
        if self._forked:
            self._refuse_forked(_Item("spans", None, len(spans),
                                      sum(event_count(s) for s in spans)))
            return 0
        sizes = [estimate_bytes(s) for s in spans]  # outside the lock: the sender waits
        with self._cond:
            if self._closed:
                accepted = 0
            else:
                accepted, size = self._fitting(sizes)
                if accepted > 0:
                    batch = list(spans[:accepted])
                    item = _Item("spans", batch, accepted,
                                 sum(event_count(s) for s in batch), witness, size=size)
                    if first:
                        self._queue.appendleft(item)
                    else:
                        self._queue.append(item)
                    self._queued += accepted
                    self._queued_bytes += size
                    self._cond.notify()
            closed = self._closed
        if accepted < len(spans):
            lost = spans[accepted:]
            self._lose_spans(len(lost), sum(event_count(s) for s in lost),
                             DropReason.SHUTDOWN if closed else DropReason.QUEUE_FULL)
        if accepted:
            self._start()
        return accepted

    def submit_metrics(self, data: MetricsData) -> bool:
        n = sum(len(m.data.data_points) for rm in data.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics)
        if n == 0:
            return True
        if self._forked:
            self._refuse_forked(_Item("metrics", None, n))
            return False
        with self._cond:
            ok = not self._closed and self._queued + n <= self._capacity
            if ok:
                self._queue.append(_Item("metrics", data, n))
                self._queued += n
                self._cond.notify()
            closed = self._closed
        if not ok:
            self._ledger.record("metric_points", LEDGER_SINK, DropReason.SHUTDOWN if closed
                                else DropReason.QUEUE_FULL, n)
            return False
        self._start()
        return True

    def backlog(self) -> tuple[int, int]:
        """(items queued, capacity): a full queue drops new items (counted). The byte
        bound is folded in: a queue whose bytes are full reports itself full."""
        with self._cond:
            if self._queued_bytes >= self._capacity_bytes:
                return self._capacity, self._capacity
            return self._queued, self._capacity

    def _fitting(self, sizes: Sequence[int]) -> tuple[int, int]:
        """How many spans of these estimated sizes, from the first, fit in the queue now
        (count and bytes), and their bytes; under the lock."""
        room_bytes = self._capacity_bytes - self._queued_bytes
        if self._budget is not None:
            room_bytes = min(room_bytes, self._budget.room())
        n = size = 0
        for span_size in sizes[:max(self._capacity - self._queued, 0)]:
            # An empty queue takes one span however large (as the batch processor does):
            # it would never fit otherwise, and "queue full" would be a false reason.
            if size + span_size > room_bytes and (n or self._queued):
                break
            size += span_size
            n += 1
        return n, size

    def can_take(self, spans: Sequence[ReadableSpan]) -> bool:
        """Whether ``spans`` fit in the queue now, in count and in estimated bytes (an
        empty queue takes anything: what does not fit is counted when submitted)."""
        sizes = [estimate_bytes(s) for s in spans]
        with self._cond:
            return self._queued == 0 or self._fitting(sizes)[0] == len(spans)

    def fits(self, spans: Sequence[ReadableSpan]) -> int:
        """How many of ``spans``, from the first, the queue takes now without dropping
        any (in count and in estimated bytes); at least one while the queue is empty,
        so a span larger than the whole bound is still submitted (and counted)."""
        sizes = [estimate_bytes(s) for s in spans]
        with self._cond:
            n = self._fitting(sizes)[0]
            empty = self._queued == 0
        return max(n, 1) if empty and spans else n

    def flush(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until everything queued so far reached Rerun."""
        if self._forked:
            return False
        with self._cond:
            if self._closed:
                return not self._queue
            if self._thread is None and not self._queue:
                return True
            done = threading.Event()
            self._queue.append(_Item("flush", timeout_s, done=done))
            self._cond.notify()
        self._start()
        return done.wait(max(timeout_s, 0.0))

    def close(self, timeout_s: float) -> None:
        """Send what is queued within ``timeout_s``, then close the recording."""
        if self._forked:
            return  # the recording and its thread belong to the parent
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._shutdown_timeout = max(timeout_s, 0.0)
            exit_guard.extend_deadline(deadline)
            self._queue.append(_Item("stop", deadline))
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            stuck = thread is not None and thread.is_alive()
            lost = [i for i in self._queue if i.kind in ("spans", "metrics")]
            self._queue.clear()
            if stuck:
                exit_guard.mark_trouble()
                # Stuck in Rerun (a frozen viewer): what it was sending and what it sent
                # since the last confirmation cannot be confirmed.
                lost += self._in_flight + self._unconfirmed
                self._unconfirmed = []
                self._abandoned = True
                # Let the worker exit once Rerun returns from its current call.
                self._queue.append(_Item("stop", time.monotonic()))
                self._cond.notify()
            self._queued = 0
            self._queued_bytes = 0
        for item in lost:
            self._lose_item(item, DropReason.SHUTDOWN)
        if sum(i.n for i in lost):  # items whose spans were all refused hold none
            _log.warning("rerun: %d item(s) not sent before the shutdown deadline (%.1f s "
                         "of the bound were left for Rerun)", sum(i.n for i in lost), timeout_s)
        if thread is None:
            self._disconnect(deadline)

    # ── accounting ───────────────────────────────────────────────────────────────────

    def _lose_spans(self, spans: int, events: int, reason: DropReason) -> None:
        self._ledger.record("spans", LEDGER_SINK, reason, spans)
        self._ledger.record("span_events", LEDGER_SINK, reason, events)

    def _lose_item(self, item: _Item, reason: DropReason) -> None:
        if item.kind == "spans":
            self._lose_spans(item.n, item.events, reason)
        elif item.kind == "metrics":
            self._ledger.record("metric_points", LEDGER_SINK, reason, item.n)

    def _record_issues(self, issues: Issues | MetricIssues) -> None:
        r = self._ledger.record
        if isinstance(issues, Issues):
            # Still drawn in the trace view (or counted there): a loss of the walk only.
            r(WALK_SIGNAL, LEDGER_SINK, DropReason.INVALID, issues.malformed_spans)
            r("span_events", LEDGER_SINK, DropReason.INVALID,
              issues.invalid_events + issues.rejected_heatmaps)
            self.stats.spans_translated += issues.spans + issues.foreign_drawn
            self.stats.coerced += issues.coerced
            if issues.errors:
                self.stats.translate_errors = (self.stats.translate_errors + issues.errors)[-10:]
                if not self._warned_translate:
                    self._warned_translate = True
                    _log.warning("rerun: could not translate some spans (counted as invalid): "
                                 "%s", issues.errors[0])
        else:
            r("metric_points", LEDGER_SINK, DropReason.INVALID, issues.skipped)
        self._record_caps(issues.capped)
        overflow = self.spans.gaps.overflow
        if overflow > self._gap_overflow:
            r("capability_gaps", LEDGER_SINK, DropReason.SIZE_CAP, overflow - self._gap_overflow)
            self._gap_overflow = overflow

    # ── sender thread ────────────────────────────────────────────────────────────────

    def _record_caps(self, capped: dict[str, int]) -> None:
        for what, n in capped.items():
            # A display cap over items that are complete elsewhere loses nothing.
            self._ledger.record(what, LEDGER_SINK, DropReason.DISPLAY_CAP
                                if what in DISPLAY_CAPS else DropReason.SIZE_CAP, n)

    def _record_trace(self, issues: TraceIssues, sent: bool) -> None:
        r = self._ledger.record
        r("spans", LEDGER_SINK, DropReason.INVALID, issues.invalid)
        # A full wait draws spans early (issues.pending_overflow): drawn, not lost, so
        # not in the ledger; where they end up (late, stranded, orphans) is the tally's.
        self._record_caps(issues.capped)
        if sent:
            self.stats.add_drawn(issues)

    def _unconfirm(self, issues: TraceIssues) -> None:
        u = self._unconfirmed_drawn
        u.drawn += issues.drawn
        u.orphans += issues.orphans
        u.late += issues.late
        u.stranded += issues.stranded
        for call, n in issues.drawn_calls.items():
            u.drawn_calls[call] = u.drawn_calls.get(call, 0) + n

    def _trace_tick(self, final: bool) -> None:
        """Draw spans that waited too long for their parent (all of them when final)."""
        frame = Frame()
        issues = self.trace.drain(frame) if final else self.trace.expire(time.monotonic(),
                                                                           frame)
        if not issues.drawn and not len(frame):  # (a final tighter redraw draws none)
            return
        sent = self._available is True and not self._abandoned and self._rec is not None
        if sent:
            self._send(frame.sends())
        else:  # drawn into nothing: the spans are lost to Rerun after all
            self._lose_spans(issues.drawn, 0, DropReason.SINK_UNAVAILABLE)
        self._record_trace(issues, sent)
        if sent and self.target.kind in ("grpc", "spawn"):
            self._unconfirm(issues)

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"proofscope-rerun-{self.target.kind}")
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                tick = False
                while not self._queue:
                    # Wake when a span waiting for its parent is due to be drawn.
                    due = self.trace.next_expiry(time.monotonic())
                    if not self._cond.wait(due) and due is not None and not self._queue:
                        tick = True
                        break
                if not tick:
                    first = self._queue.popleft()
                    items = [first]
                    if first.kind == "spans":  # coalesce queued span batches into one frame
                        n, size = first.n, first.size
                        most = CLOSING_BATCH if self._closed else MAX_BATCH
                        while self._queue and self._queue[0].kind == "spans" \
                                and n < most and size < self._batch_bytes \
                                and self._queue[0].witness == first.witness:
                            nxt = self._queue.popleft()
                            items.append(nxt)
                            n += nxt.n
                            size += nxt.size
                    self._queued -= sum(i.n for i in items)
                    self._queued_bytes -= sum(i.size for i in items)
                    self._in_flight = items
            if tick:
                try:
                    self._trace_tick(final=False)
                except Exception as exc:  # the sender must survive anything
                    _log.warning("rerun: trace view error: %r", exc)
                continue
            try:
                if first.kind == "stop":
                    with contextlib.suppress(Exception):
                        self._trace_tick(final=True)  # orphans: drawn, not lost
                    self._disconnect(first.payload)
                    return
                if first.kind == "flush":
                    self._flush_rec(first.payload)
                    assert first.done is not None
                    first.done.set()
                    continue
                self._process(items)
            except Exception as exc:  # the sender must survive anything
                _log.warning("rerun: sender error (items counted as export_failed): %r", exc)
                for item in items:
                    self._lose_item(item, DropReason.EXPORT_FAILED)
            finally:
                with self._cond:
                    self._in_flight = []
                self._batch_done(items)

    def is_sender(self) -> bool:
        """Whether the caller is this sink's sender thread."""
        return threading.current_thread() is self._thread

    def _batch_done(self, items: list[_Item]) -> None:
        hook = self.on_batch_done
        if hook is None or items[0].kind not in ("spans", "metrics"):
            return
        spans = events = points = 0
        for item in items:
            if item.kind == "spans":
                spans += item.n
                events += item.events
            elif item.kind == "metrics":
                points += item.n
        try:
            hook(spans, events, points)
        except Exception as exc:  # the sender must survive anything
            _log.warning("rerun: batch hook error: %r", exc)

    def _screen(self, items: list[_Item]) -> None:
        """Refuse undrawable spans one by one (counted invalid), in place."""
        for item in items:
            ok, bad, why = span_guard.split(item.payload)
            if not bad:
                continue
            events = sum(span_guard.event_count(s) for s in bad)
            self._lose_spans(len(bad), events, DropReason.INVALID)
            item.payload, item.n, item.events = ok, item.n - len(bad), item.events - events
            if not self._warned_poison:
                self._warned_poison = True
                _log.warning("rerun: refused %d span(s) that cannot be drawn (counted as "
                             "invalid; the rest of the batch is drawn): %s", len(bad), why)

    def _translate_spans(self, spans: list[ReadableSpan],
                         witness: bool) -> tuple[Issues, list[Send]]:
        frame = Frame()
        try:
            issues = self.spans.translate(spans, frame, witness=witness)
            return issues, frame.sends()
        except Exception as exc:
            # Something the screen did not foresee: isolate it span by span, so one bad
            # span costs only itself.
            _log.debug("rerun: batch translation failed (%r); retrying span by span", exc)
        merged = Issues()
        sends: list[Send] = []
        for span in spans:
            one = Frame()
            try:
                got = self.spans.translate([span], one, witness=witness)
                sends += one.sends()
            except Exception as exc:
                got = Issues(malformed_spans=1,
                             errors=[f"{getattr(span, 'name', '?')}: {exc!r}"])
            _merge_issues(merged, got)
        return merged, sends

    def _process(self, items: list[_Item]) -> None:
        issues: Issues | MetricIssues
        if items[0].kind == "spans":
            self._screen(items)
            spans = [s for i in items for s in i.payload]
            self.stats.spans_received += len(spans)
            issues, sends = self._translate_spans(spans, items[0].witness)
            trace_frame = Frame()
            trace: TraceIssues | None = self.trace.translate(spans, trace_frame,
                                                             now=time.monotonic())
            sends += trace_frame.sends()
        else:
            frame = Frame()
            self.stats.metric_points_received += items[0].n
            issues = self.metrics.translate(items[0].payload, frame)
            trace = None
            sends = frame.sends()
        self._record_issues(issues)
        if not self._ensure_open():
            self._lose_batch(items, trace)
            return
        if self._abandoned:
            return  # close() gave up on us and counted these
        self._send(sends)
        self.stats.batches += 1
        if self.target.kind == "file" and not self._written():
            self._lose_batch(items, trace)
            return
        if trace is not None:
            self._record_trace(trace, sent=True)
        if self.target.kind in ("grpc", "spawn"):
            self._unconfirmed += items
            if trace is not None:
                self._unconfirm(trace)
                self._unconfirmed_calls.add(self.trace.last_call)
            self._check_alive()

    def _lose_batch(self, items: list[_Item], trace: TraceIssues | None) -> None:
        """Count a batch that did not reach Rerun (no connection, a failed write)."""
        for item in items:
            self._lose_item(item, DropReason.SINK_UNAVAILABLE)
        if trace is not None:
            # The batch's own spans are counted with its items; spans carried from earlier
            # batches (sent then, while they waited) are lost now, and this batch's
            # waiting spans must not be drawn (and counted) later as well.
            self._lose_spans(trace.drawn_outside({self.trace.last_call}), 0,
                             DropReason.SINK_UNAVAILABLE)
            self.trace.discard_last_call()
            self._record_trace(trace, sent=False)

    def _send(self, sends: list[Send]) -> None:
        rec = self._rec
        assert rec is not None
        layout = self._layouts.observe((s.path for s in sends),
                                       self.spans.proofs.largest_walk)
        if layout is not None:
            rec.send_blueprint(layout, make_active=True, make_default=True)
        for s in sends:
            if s.static is not None:
                rec.log(s.path, s.static, static=True)
            else:
                rec.send_columns(s.path, indexes=s.indexes, columns=s.columns)
            self.stats.rows += s.rows
        self.stats.rerun_calls += len(sends)

    # ── connection management (sender thread only) ───────────────────────────────────

    def _ensure_open(self) -> bool:
        if self._available:
            return True
        now = time.monotonic()
        if self._available is False and now < self._next_retry:
            return False
        t = self.target
        try:
            if t.kind == "file":
                reason = self._open_file()
            elif t.kind == "spawn":
                reason = self._open_viewer(spawn=self._rec is None)
            elif t.kind == "grpc":
                reason = self._open_viewer(spawn=False)
            else:
                reason = "target is off"
        except Exception as exc:
            reason = repr(exc)
        if reason is None:
            if self._warned_unavailable:
                _log.warning("rerun: viewer at %s is back; sending again", t.name)
            self._warned_unavailable = False
            self._available = True
            self._last_probe = time.monotonic()
            return True
        self._unavailable(reason)
        return False

    def _unavailable(self, reason: str) -> None:
        self._available = False
        exit_guard.mark_trouble()
        # A file that cannot be written will not become writable; a viewer may come back.
        self._next_retry = time.monotonic() + (
            float("inf") if self.target.kind == "file" else self._retry_interval)
        if not self._warned_unavailable:
            self._warned_unavailable = True
            _log.warning("rerun: %s unavailable (%s); Rerun telemetry is dropped and counted "
                         "in proofscope.dropped, OTLP export is unaffected", self.target.name,
                         reason)

    def _recording(self) -> rr.RecordingStream:
        if self._rec is None:
            rec = rr.RecordingStream(APP_ID, recording_id=str(uuid.uuid4()))
            # The layout is y-up (kind offsets and round bars point up).
            rec.log("/", rr.ViewCoordinates.RIGHT_HAND_Y_UP, static=True)
            self._rec = rec
        return self._rec

    def _open_file(self) -> str | None:
        path = Path(self.target.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path = self._claim(path)
        # Rerun opens the file itself, by name, and follows a link: check once more that
        # the name is still the regular file claimed (no link planted since). A link
        # planted between this check and Rerun's open is the race that remains.
        fd = self._file_lock
        if fd is not None:
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(path))
            except OSError:
                same = False
            if not same:
                raise UnsafeOutputError(f"refusing to write recording {str(path)!r}: it was "
                                        "replaced (a link?) after it was opened")
        self._recording().save(path, default_blueprint=self._layouts.current(),
                               write_footer=self.footer)
        return None

    def _claim(self, path: Path) -> Path:
        """Hold an exclusive lock on the file while writing it: a second writer (another
        prover, or a worker that called ``configure()`` with the same target) would
        interleave two streams into one corrupt recording. Such a writer gets a sibling
        file named after its pid instead, and says so once."""
        fallback = path.with_name(f"{path.stem}-{os.getpid()}{path.suffix}")
        for candidate in (path, fallback):
            # Fails here, clearly, when the file cannot be written at all, and refuses a
            # symbolic link or anything but a regular file planted at the path.
            fd = open_output_fd(candidate, append=True, what="recording")
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                except OSError:
                    pass  # a filesystem without locks: write unguarded, as Rerun would
            self._file_lock = fd
            if candidate != path:
                _log.warning("rerun: %s is being written by another process; this one "
                             "writes its recording to %s", path, candidate)
            return candidate
        raise RuntimeError(f"{path} and {fallback} are both being written by other "
                           f"processes")

    def _release_file(self) -> None:
        fd, self._file_lock = self._file_lock, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # releases the lock

    def _alive(self) -> bool:
        # An HTTP/2 answer, not a TCP accept: a frozen viewer still accepts (liveness.py).
        # Over TLS (rerun+https) the cleartext preface cannot be answered: TCP only.
        if self.target.url.lower().startswith("rerun+https"):
            return tcp_accepts(self.target.host, self.target.port)
        return speaks_http2(self.target.host, self.target.port)

    def _open_viewer(self, *, spawn: bool) -> str | None:
        t = self.target
        if not self._alive():
            if probe(t.host, t.port):
                return (f"{t.host}:{t.port} accepts connections but does not answer "
                        "gRPC (a frozen viewer, or not a Rerun server)")
            if not spawn:
                return f"nothing listens on {t.host}:{t.port}"
            missing = no_display()
            if missing is not None:  # the viewer would start, bind, and die in winit
                return missing
            rr.spawn(port=t.port, connect=False, hide_welcome_screen=True,
                     recording=self._recording())
            deadline = time.monotonic() + self._connect_timeout
            while not self._alive():
                if time.monotonic() > deadline:
                    return f"the spawned viewer did not listen on port {t.port} within " \
                           f"{self._connect_timeout:.0f} s"
                time.sleep(0.1)
        self._recording().connect_grpc(t.url, default_blueprint=self._layouts.current())
        return None

    def _written(self) -> bool:
        """Whether this batch reached the file. Rerun's file writer only logs a failed
        write (a full disk: ``No space left on device``) and stops; its flush then
        times out. So every batch is flushed, and the first failure marks the file
        unavailable for good: that batch and everything after it is counted lost."""
        rec = self._rec
        assert rec is not None
        try:
            rec.flush(timeout_sec=self._write_timeout)
            return True
        except Exception as exc:
            path = Path(self.target.path)
            try:
                full = os.statvfs(path.parent).f_bavail == 0
            except OSError:
                full = False
            why = "no space left on device" if full else f"the file writer stopped ({exc})"
            self._unavailable(f"writing {path} failed: {why}")
            return False

    def _check_alive(self) -> None:
        now = time.monotonic()
        if now - self._last_probe < self._probe_interval:
            return
        self._last_probe = now
        drawn, self._unconfirmed_drawn = self._unconfirmed_drawn, TraceIssues()
        calls, self._unconfirmed_calls = self._unconfirmed_calls, set()
        if self._alive():
            self._unconfirmed = []
            return
        lost, self._unconfirmed = self._unconfirmed, []
        # Counted as drawn when sent; delivery is unconfirmed: they are counted lost, the
        # lost batches' own spans with their items below, those carried from earlier
        # batches here; their spans still waiting must not be drawn again later.
        self.stats.add_drawn(drawn, sign=-1)
        self._lose_spans(drawn.drawn_outside(calls), 0, DropReason.SINK_UNAVAILABLE)
        self.trace.discard_calls(calls)
        for item in lost:
            self._lose_item(item, DropReason.SINK_UNAVAILABLE)
        self._unavailable("the viewer stopped answering")

    def _flush_rec(self, timeout_s: float) -> None:
        if self._rec is not None and self._available:
            self._rec.flush(timeout_sec=max(timeout_s, 0.001))
            if self.target.kind in ("grpc", "spawn"):
                self._last_probe = 0.0
                self._check_alive()

    def _disconnect(self, deadline: float) -> None:
        rec, self._rec = self._rec, None
        if rec is None:
            return
        try:
            if self._available:
                rec.flush(timeout_sec=max(deadline - time.monotonic(), 0.001))
                if self.target.kind in ("grpc", "spawn"):
                    self._last_probe = 0.0
                    self._check_alive()
            rec.disconnect()
        except Exception as exc:
            _log.debug("rerun: disconnect raised %r", exc)
        finally:
            self._release_file()


def _merge_issues(into: Issues, more: Issues) -> None:
    for f in dataclasses.fields(Issues):
        a, b = getattr(into, f.name), getattr(more, f.name)
        if isinstance(a, int):
            setattr(into, f.name, a + b)
        elif isinstance(a, list):
            a.extend(b)
        elif isinstance(a, dict):
            for k, n in b.items():
                a[k] = a.get(k, 0) + n


# ── one sink per target, shared by the span and metric exporters ─────────────────────

_registry: SharedByTarget[RerunSink] = SharedByTarget()


def acquire(target: Target, **kwargs: Any) -> RerunSink:
    """The sink for ``target`` (created on first use; reference counted)."""
    return _registry.acquire(target.name, lambda: RerunSink(target, **kwargs))


def release(sink: RerunSink, timeout_s: float) -> None:
    """Drop one reference: the last one closes the sink, earlier ones only flush."""
    _registry.release(sink.target.name, sink, timeout_s)
