"""A bounded, non-blocking batch span processor that counts every span it loses.

Why not the SDK's ``BatchSpanProcessor``: with a dead collector its ``force_flush``
takes ~35 s and still returns True, ``shutdown`` blocks process exit ~30 s, and queue
drops are only logged once per 20 s (measured with opentelemetry-sdk 1.45.2 against
a stopped OTLP gRPC receiver on loopback). Here:

* ``on_end`` (the prover thread) is a length check and a deque append; the worker is
  only woken when a full batch is waiting, so the prover never takes a lock per span.
  The worker thread starts with the processor, not on the first span, so a proof does
  not pay for a thread start (~0.1–1 ms on a loaded machine) inside its first phase;
* ``begin_flush`` wakes the worker without waiting, so a shutdown can start every
  sink's export at once and let their I/O overlap instead of running them in turn;
* the queue is bounded twice: in spans, and in estimated bytes (:func:`estimate_bytes`),
  because a span's size varies ~10x with its events: 8,192 layer spans of 32 round
  events each hold ~250 MB, far past the memory a dead collector may cost; in the export
  process the bytes also count against a budget shared with the Rerun view's queues
  (:mod:`otel_proofscope.pipeline.budget`);
* every loss (queue full, export failed, shutdown deadline) is counted exactly, in
  spans and in span events, in the process-wide :data:`DROPS` ledger;
* ``force_flush`` and ``shutdown`` honour their deadline even when the exporter hangs:
  a batch still in flight at the deadline is counted as lost and abandoned to the
  daemon worker;
* after ``fork`` the child starts with an empty queue, so it never exports its
  parent's spans a second time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.otlp.sdk_fields import event_count, span_attributes
from otel_proofscope.pipeline.budget import ByteBudget
from otel_proofscope.pipeline.cut_exports import cut_short, exporting
from otel_proofscope.pipeline.forking import after_fork_in_child
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)

#: Estimated bytes of one ended SDK span: a fixed part, per attribute and per event.
#: Measured with tracemalloc (opentelemetry-sdk 1.x, Python 3.11, ``proof.layer`` spans
#: with 4 attributes and round events of 5 attributes): 2.8 KB without events, +0.9 KB
#: per event, 31 KB with 32 events. The constants round those up, so the estimate
#: errs towards less memory. Large attribute values (a witness heatmap) are not sized:
#: it is an estimate, not an accounting.
SPAN_BYTES = 2048
ATTRIBUTE_BYTES = 256
EVENT_BYTES = 1024
#: configure()'s byte bound per sink. Issue 16 allows +64 MB of RSS in every route
#: against a dead collector; a route has two span queues (OTLP and Rerun), each with a
#: batch in flight (an eighth of the bound, see _drain), on top of a few MB of
#: baseline: 2 x 24 x 1.125 = 54 MiB estimated. 8,192 spans without events
#: (~3.3 KB estimated each) nearly fit: the span bound still binds first for them.
DEFAULT_MAX_QUEUE_BYTES = 24 * 2**20


def estimate_bytes(span: ReadableSpan) -> int:
    """Estimated memory ``span`` holds while queued; never raises (prover thread)."""
    try:
        # Through sdk_fields: the public properties copy (and for round records, build)
        # every event, here on the prover thread.
        return (SPAN_BYTES + ATTRIBUTE_BYTES * len(span_attributes(span))
                + EVENT_BYTES * event_count(span))
    except Exception:  # a foreign span type: count the fixed part
        return SPAN_BYTES


class ExportStats:
    """Spans and events one sink's exporter accepted, and those this processor lost."""

    __slots__ = ("events", "lock", "lost_events", "lost_spans", "spans")

    def __init__(self) -> None:
        self.spans = 0
        self.events = 0
        self.lost_spans = 0
        self.lost_events = 0
        self.lock = threading.Lock()

    def delivered(self, ledger: DropLedger, sink: str) -> tuple[int, int]:
        """(spans, events) delivered: accepted, less what the exporter itself lost later.

        An exporter with its own queue (Rerun) accepts a batch and may lose it
        afterwards; it counts that in the ledger under the same sink, so whatever the
        ledger holds beyond this processor's own losses was accepted but not delivered.
        """
        with self.lock:
            late_spans = ledger.total(signal="spans", sink=sink) - self.lost_spans
            late_events = ledger.total(signal="span_events", sink=sink) - self.lost_events
            return self.spans - max(0, late_spans), self.events - max(0, late_events)

    def add(self, batch: Sequence[ReadableSpan]) -> None:
        with self.lock:
            self.spans += len(batch)
            self.events += sum(event_count(s) for s in batch)


class BoundedBatchSpanProcessor(SpanProcessor):
    def __init__(
        self,
        exporter: SpanExporter,
        *,
        sink: str,
        max_queue_size: int = 65_536,
        max_queue_bytes: int | None = None,
        max_batch_size: int = 512,
        schedule_delay_s: float = 0.5,
        ledger: DropLedger = DROPS,
        budget: ByteBudget | None = None,
    ) -> None:
        if max_queue_size < 1 or max_batch_size < 1 or (max_queue_bytes or 1) < 1:
            raise ValueError("max_queue_size, max_queue_bytes and max_batch_size must be "
                             ">= 1")
        self.exporter = exporter
        self.sink = sink
        self.stats = ExportStats()
        self._max_queue = max_queue_size
        # None: bounded in spans only (the class's behaviour before the byte bound).
        self._max_bytes = max_queue_bytes if max_queue_bytes is not None else float("inf")
        self._max_batch = min(max_batch_size, max_queue_size)
        self._delay = schedule_delay_s
        self._ledger = ledger
        self._init_state()
        #: Shared with the other queues of the process (the export process's), if any.
        self._budget = None if budget is None else budget.share(lambda: self._queued_bytes)
        # A child process must not re-export what its parent already queued. Its worker
        # (threads do not survive fork) starts again on its first span.
        after_fork_in_child(self._init_state)
        self._start_worker()

    def _init_state(self) -> None:
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        # Estimated bytes queued. Added before the append, removed after the pop, both
        # under _bytes_lock (spans end on any thread; += is not atomic), so it never
        # undercounts what the queue holds.
        self._queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._stopping = False
        self._closed = False
        self._flush_requests: list[threading.Event] = []
        self._in_flight: list[ReadableSpan] | None = None
        self._abandoned = False
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()

    # ── prover thread ────────────────────────────────────────────────────────────────

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan,
               lost: dict[DropReason, list[ReadableSpan]] | None = None) -> None:
        """Queue ``span``, or count it lost; with ``lost`` (:meth:`on_end_many`), put it
        there by reason instead of counting it. One body on the prover's path: a call
        per span to a shared helper cost ~50 ns of its ~0.9 µs."""
        if self._closed:
            self._lost(span, DropReason.SHUTDOWN, lost)
            return
        ctx = span.context
        if ctx is not None and not ctx.trace_flags.sampled:
            return
        queue = self._queue
        if len(queue) >= self._max_queue:
            self._lost(span, DropReason.QUEUE_FULL, lost)
            return
        size = estimate_bytes(span)
        # An empty queue takes any span, however large: it would never fit otherwise.
        if queue and (self._queued_bytes + size > self._max_bytes or (
                self._budget is not None and self._budget.room() < size)):
            self._lost(span, DropReason.QUEUE_FULL, lost)
            return
        with self._bytes_lock:
            self._queued_bytes += size
        queue.append(span)
        if self._worker is None:
            self._start_worker()
        elif len(queue) == self._max_batch:
            with self._cond:
                self._cond.notify()

    def on_end_many(self, spans: Sequence[ReadableSpan]) -> None:
        """:meth:`on_end` for each of ``spans``, in order, with what is lost counted once
        per reason. Why: the export process hands its OTLP queue a frame at a time, and
        against a dead collector, counting each lost span on its own (two ledger records
        under two locks) took ~2.4 s of the child's CPU in a 200,000-span burst, on the
        thread that also reads the frames the Rerun view waits for."""
        lost: dict[DropReason, list[ReadableSpan]] = {}
        on_end = self.on_end
        for span in spans:
            on_end(span, lost)
        for reason, spans_lost in lost.items():
            self._lose(spans_lost, reason)

    def _lost(self, span: ReadableSpan, reason: DropReason,
              lost: dict[DropReason, list[ReadableSpan]] | None) -> None:
        if lost is None:
            self._lose([span], reason)
        else:
            lost.setdefault(reason, []).append(span)

    # ── worker ───────────────────────────────────────────────────────────────────────

    def _start_worker(self) -> None:
        with self._worker_lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name=f"proofscope-export-{self.sink}", daemon=True)
                self._worker.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and not self._flush_requests \
                        and len(self._queue) < self._max_batch:
                    self._cond.wait(self._delay)
                stopping = self._stopping
                waiters, self._flush_requests = self._flush_requests, []
            self._drain()
            for event in waiters:
                event.set()
            if stopping:
                return

    def _drain(self) -> None:
        queue = self._queue
        # A batch is held until its export returns (retries against a dead collector
        # included): it gets an eighth of the byte bound, so queue and batch in flight
        # stay within ~1.1x the bound.
        batch_bytes = self._max_bytes / 8
        while queue:
            batch: list[ReadableSpan] = []
            size = 0
            while queue and len(batch) < self._max_batch and (not batch
                                                              or size < batch_bytes):
                span = queue.popleft()
                batch.append(span)
                size += estimate_bytes(span)
            # Same estimate as on_end: an ended span's attributes and events do not change.
            with self._bytes_lock:
                self._queued_bytes -= size
            self._export(batch)

    def _release_bytes(self, spans: Sequence[ReadableSpan]) -> None:
        size = sum(estimate_bytes(s) for s in spans)
        with self._bytes_lock:
            self._queued_bytes -= size

    def _export(self, batch: list[ReadableSpan]) -> None:
        self._in_flight = batch
        with exporting():
            try:
                result = self.exporter.export(batch)
            except Exception as exc:  # an exporter bug must not kill the worker
                _log.warning("span exporter %s raised: %r", self.sink, exc)
                result = SpanExportResult.FAILURE
        with self._cond:
            self._in_flight = None
            abandoned = self._abandoned
        if abandoned:  # shutdown already counted this batch as lost
            return
        if result == SpanExportResult.SUCCESS:
            self.stats.add(batch)
        else:
            self._lose(batch, DropReason.EXPORT_FAILED)

    def _lose(self, spans: Sequence[ReadableSpan], reason: DropReason) -> None:
        events = sum(event_count(s) for s in spans)
        with self.stats.lock:
            self.stats.lost_spans += len(spans)
            self.stats.lost_events += events
        self._ledger.record("spans", self.sink, reason, len(spans))
        self._ledger.record("span_events", self.sink, reason, events)

    # ── flush / shutdown ─────────────────────────────────────────────────────────────

    def begin_flush(self) -> threading.Event | None:
        """Ask the worker to export everything queued now, without waiting.

        Returns an event set once that is done (exported or counted as lost), or None
        when there is nothing to wait for (no worker, or closed).
        """
        if self._worker is None or self._closed:
            return None
        done = threading.Event()
        with self._cond:
            self._flush_requests.append(done)
            self._cond.notify()
        return done

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        done = self.begin_flush()
        if done is None:
            return not self._queue
        return done.wait(timeout_millis / 1000)

    def shutdown(self, timeout_millis: int = 3_000) -> None:
        if self._closed:
            return
        deadline = time.monotonic() + timeout_millis / 1000
        worker = self._worker
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if worker is not None:
            worker.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._closed = True
            stuck = worker is not None and worker.is_alive()
            lost = list(self._queue)
            self._queue.clear()
            self._release_bytes(lost)
            if stuck and self._in_flight is not None:
                lost.extend(self._in_flight)
                self._abandoned = True
        if lost:
            self._lose(lost, DropReason.SHUTDOWN)
            # The time this sink had left, not the pipeline's bound (which is shared by
            # every sink and by metrics): "the 0.0 s deadline" read like a bug.
            _log.warning("%s: %d span(s) not exported before the shutdown deadline "
                         "(%.1f s of the bound were left for this sink)",
                         self.sink, len(lost), timeout_millis / 1000)
        if stuck:
            # Counted above: the exporter's own ERROR for the cut export would say it twice.
            cut_short(worker.ident if worker is not None else None)
            # The exporter is blocked inside export(); its own shutdown may block on the
            # same lock, so it runs on a daemon thread that exit will not wait for.
            threading.Thread(target=self._shutdown_exporter, daemon=True).start()
        else:
            self._shutdown_exporter()

    def _shutdown_exporter(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as exc:
            _log.debug("exporter %s shutdown raised %r", self.sink, exc)


class SpanLimitAccounting(SpanProcessor):
    """Counts what the SDK's span limits silently discarded (events, attributes)."""

    def __init__(self, ledger: DropLedger = DROPS) -> None:
        self._ledger = ledger

    def on_end(self, span: ReadableSpan) -> None:
        if span.dropped_events:
            self._ledger.record("span_events", "sdk", DropReason.SPAN_LIMIT, span.dropped_events)
        if span.dropped_attributes:
            self._ledger.record("span_attributes", "sdk", DropReason.SPAN_LIMIT,
                                span.dropped_attributes)

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
