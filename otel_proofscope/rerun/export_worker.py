"""Child side of the export process: OTLP export and the Rerun view, out of the prover's
process.

Run as ``python -m otel_proofscope.rerun.export_worker CONFIG_JSON`` by
:mod:`otel_proofscope.rerun.export_process`.

Why: on the prover's side every sink costs GIL time, the OTLP encoding and gRPC send
(~18 µs per prover span) as much as the Rerun translation. Here the prover's process
packs each span once (:func:`~otel_proofscope.rerun.span_wire.pack_spans_full`) and this
process does the rest: it unpacks each frame once and hands the same spans to

* the OTLP stage: :class:`~otel_proofscope.pipeline.processor.BoundedBatchSpanProcessor`
  (its own bounded queue and export thread) around
  :class:`~otel_proofscope.pipeline.fast_otlp.FastOTLPSpanExporter`, configured from the
  ``OTEL_EXPORTER_OTLP_*`` variables this process inherited plus the protocol and
  timeout ``configure()`` chose, behind a witness filter unless ``export_witness``;
* the Rerun sink, exactly as :mod:`otel_proofscope.rerun.worker` does (when a target
  is configured).

Neither sink waits for the other: a dead collector fills only the OTLP stage's queue,
and a Rerun view slower than the prover fills only the Rerun sink's queue and the
packed backlog in front of it (each drops what does not fit, counted under its own
sink). So the frame loop never blocks on a sink and reads frames as fast as they come.
The three queues share one byte budget (:data:`BUDGET_BYTES`, issue 29 decision 6): the
Rerun sink's queue keeps its part reserved, the OTLP stage may hold at most
:data:`OTLP_QUEUE_BYTES` of it, and the backlog what is left.

Reports (JSON lines on the private stdout) add to the Rerun worker's what each sink has
settled (``sink_settled``: exported or counted lost) and the witness events the OTLP
stage withheld; losses of both sinks are in ``drops`` under their own sink names.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.budget import ByteBudget
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter
from otel_proofscope.pipeline.gc_policy import CollectWhenIdle
from otel_proofscope.pipeline.privacy import WitnessFilter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.rerun import prestart
from otel_proofscope.rerun.backlog import PackedBacklog
from otel_proofscope.rerun.process import (
    CLOSE,
    CLOSE_DEADLINE,
    FLUSH,
    SPANS,
    SPANS_WITNESS,
    Counts,
)
from otel_proofscope.rerun.sink import (
    DEFAULT_QUEUE,
    RerunSink,
    SinkStats,
)
from otel_proofscope.rerun.target import LEDGER_SINK
from otel_proofscope.rerun.target import parse_target as parse_rerun_target
from otel_proofscope.rerun.worker import (
    Worker,
    child_pipes,
    lower_priority,
    shutdown_timeout,
    waited_on,
)
from otel_proofscope.semconv import DropReason

_log = logging.getLogger("otel_proofscope.rerun.export_worker")

OTLP_SINK = "otlp"
#: How often the child reports progress unasked: what it settled since is what the
#: parent would count lost (not delivered) if the child were killed at the deadline.
REPORT_INTERVAL_S = 0.25
#: The bytes the three queues hold together (estimated for unpacked spans, exact for
#: packed frames); issue 29 decision 6 allows +64 MB of RSS for prover and export
#: process together (``python benchmarks/bench_memory.py --routes export``).
BUDGET_BYTES = 48 * 2**20
#: The Rerun sink's queue: a few batches for the translation (it takes a quarter at a
#: time); a burst waits packed in the backlog, ~5x smaller than unpacked.
RERUN_QUEUE_BYTES = 24 * 2**20
#: The most the OTLP stage may hold: a dead collector must not take the view's budget.
OTLP_QUEUE_BYTES = 8 * 2**20


class ProgressLedger(DropLedger):
    """The child's ledger: every loss is recorded under :attr:`progress`, the lock under
    which a report reads what each sink settled, so a report never holds a loss in one
    figure and not the other (the parent would count it twice, or as delivered)."""

    def __init__(self) -> None:
        super().__init__()
        self.progress = threading.RLock()
        #: Told, under the same lock, of every Rerun loss of whole items (spans, their
        #: events, metric points): the worker's count of what the view still holds.
        self.on_rerun_loss: Callable[[str, int], None] | None = None

    def record(self, signal: str, sink: str, reason: str, count: int = 1) -> None:
        with self.progress:
            super().record(signal, sink, reason, count)
            if self.on_rerun_loss is not None and count > 0 and sink == LEDGER_SINK \
                    and reason != DropReason.DISPLAY_CAP and signal in _HELD_SIGNALS:
                self.on_rerun_loss(signal, count)


#: What a frame hands the Rerun view, in :class:`Counts`' fields.
_HELD_SIGNALS = ("spans", "span_events", "metric_points")


class _Rejections(SpanExporter):
    """Moves the spans a receiver rejected (partial success: delivered, then refused;
    the exporter records them in its own ledger) into the child's ledger, under the
    progress lock, counting them: a report subtracts them from the delivered spans."""

    def __init__(self, inner: SpanExporter, rejections: DropLedger,
                 ledger: ProgressLedger, turn: threading.Event) -> None:
        self.inner = inner
        self._rejections = rejections
        self._ledger = ledger
        self._turn = turn
        self.moved = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._turn.wait()  # closing: the view draws first (ExportSinks.close)
        result = self.inner.export(spans)
        rejected = self._rejections.total(signal="spans")
        if rejected:
            self._rejections.reset()
            with self._ledger.progress:
                self._ledger.record("spans", OTLP_SINK, DropReason.INVALID, rejected)
                self.moved += rejected
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


class OtlpStage:
    """The OTLP sink of the child: a bounded queue and export thread of its own."""

    def __init__(self, exporter: SpanExporter | None, rejections: DropLedger, *,
                 export_witness: bool, queue: int, ledger: ProgressLedger,
                 budget: ByteBudget | None = None) -> None:
        self._ledger = ledger
        #: Set while OTLP may export; cleared while the view closes (see hold()).
        self.turn = threading.Event()
        self.turn.set()
        self.filter = None if export_witness or exporter is None \
            else WitnessFilter(exporter, OTLP_SINK)
        self.rejections = None if exporter is None \
            else _Rejections(self.filter or exporter, rejections, ledger, self.turn)
        self.processor = None if self.rejections is None else BoundedBatchSpanProcessor(
            self.rejections, sink=OTLP_SINK, max_queue_size=queue, ledger=ledger,
            max_queue_bytes=OTLP_QUEUE_BYTES, budget=budget)

    def submit(self, spans: Sequence[ReadableSpan]) -> None:
        if self.processor is None:
            events = sum(map(event_count, spans))
            self._ledger.record("spans", OTLP_SINK, DropReason.EXPORT_FAILED, len(spans))
            self._ledger.record("span_events", OTLP_SINK, DropReason.EXPORT_FAILED, events)
            return
        self.processor.on_end_many(spans)

    def exported(self) -> tuple[Counts, int]:
        """Spans and events the processor saw exported (a batch abandoned at the
        deadline is not: it counted it lost), and the rejected spans among them; call
        under the ledger's ``progress`` lock."""
        if self.processor is None or self.rejections is None:
            return Counts(), 0
        stats = self.processor.stats
        with stats.lock:
            return Counts(stats.spans, stats.events), self.rejections.moved

    @property
    def withheld(self) -> int:
        return self.filter.withheld_events if self.filter is not None else 0

    def flush(self, timeout_s: float) -> bool:
        if self.processor is None:
            return True
        return self.processor.force_flush(max(1, int(timeout_s * 1000)))

    def close(self, timeout_s: float) -> None:
        if self.processor is not None:
            self.processor.shutdown(max(1, int(timeout_s * 1000)))

    def hold(self) -> None:
        """No export starts until :meth:`release` (the batch being sent finishes)."""
        self.turn.clear()

    def release(self) -> None:
        self.turn.set()


class ExportSinks:
    """The frame loop's sink: the same spans to the Rerun sink (if any) and OTLP.

    The Rerun sink sits behind a :class:`~otel_proofscope.rerun.backlog.PackedBacklog`:
    the frame loop never waits for it, and a burst it lags behind waits packed."""

    def __init__(self, rerun: RerunSink | None, otlp: OtlpStage | None,
                 ledger: DropLedger, budget: ByteBudget | None = None) -> None:
        self.rerun = rerun
        self.otlp = otlp
        self.backlog = None if rerun is None else PackedBacklog(rerun, ledger, budget=budget)
        self._no_stats = SinkStats()
        #: When the parent said our time is up (``time.monotonic()``, shared by the
        #: processes of a machine), from a CLOSE frame, if it sent one.
        self.close_by: float | None = None

    @property
    def stats(self) -> SinkStats:
        return self.rerun.stats if self.rerun is not None else self._no_stats

    def submit_spans(self, spans: Sequence[ReadableSpan], *, witness: bool = False) -> int:
        # The frame sink's protocol; the frame loop hands frames to submit_frame.
        if self.rerun is not None:
            self.rerun.submit_spans(spans, witness=witness)
        if self.otlp is not None:
            self.otlp.submit(spans)
        return len(spans)

    def submit_frame(self, spans: Sequence[ReadableSpan], payload: bytes,
                     witness: bool, *, clean: bool = False) -> None:
        """The spans of one frame, with the frame itself (what the backlog keeps);
        ``clean``: every record of the frame unpacked (none refused)."""
        if self.backlog is not None:
            self.backlog.submit(spans, payload, witness=witness, clean=clean)
        if self.otlp is not None:
            self.otlp.submit(spans)

    def submit_metrics(self, data: MetricsData) -> bool:
        # Metric frames come only from a Rerun metric exporter sharing this child.
        return self.rerun.submit_metrics(data) if self.rerun is not None else False

    def flush_rerun(self, timeout_s: float) -> bool:
        if self.rerun is None or self.backlog is None:
            return True
        deadline = time.monotonic() + timeout_s
        return self.backlog.drain(timeout_s) and \
            self.rerun.flush(max(0.0, deadline - time.monotonic()))

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        ok = self.flush_rerun(timeout_s)
        if self.otlp is not None:
            ok = self.otlp.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def close_otlp_async(self, timeout_s: float) -> threading.Thread | None:
        """Start closing the OTLP stage (side by side with the view: a collector that
        hangs must not take the Rerun sink's time)."""
        if self.otlp is None:
            return None
        closer = threading.Thread(target=self.otlp.close, args=(timeout_s,), daemon=True,
                                  name="proofscope-export-otlp-close")
        closer.start()
        return closer

    def close_rerun(self, timeout_s: float) -> None:
        if self.rerun is None or self.backlog is None:
            return
        deadline = time.monotonic() + timeout_s
        # Half the time to hand the backlog over, the rest (at least) to draw it.
        self.backlog.close(timeout_s / 2)
        self.rerun.close(max(0.0, deadline - time.monotonic()))

    def close(self, timeout_s: float,
              on_rerun_closed: Callable[[], None] | None = None) -> None:
        """The view first, then OTLP with what is left, within ``close_by``;
        ``on_rerun_closed`` runs once the view is finished, before waiting on OTLP.

        Both sinks share this process's one CPU's worth of Python: at the exit bound,
        the OTLP stage exporting side by side took about half of it from the view (a
        burst's last thousands of spans undrawn; issue 29 decisions 2 and 3). So OTLP
        starts no export until the view is closed; its close runs meanwhile (on a
        thread: a collector that hangs holds only that thread) and gets the rest of the
        bound. Before the close both export side by side, so a long run's OTLP never
        waits for a view that is catching up."""
        if self.close_by is not None:
            timeout_s = min(timeout_s, max(0.0, self.close_by - time.monotonic()))
        deadline = time.monotonic() + timeout_s
        if self.otlp is not None and self.rerun is not None:
            self.otlp.hold()
        try:
            closer = self.close_otlp_async(timeout_s)
            self.close_rerun(timeout_s)
            if on_rerun_closed is not None and self.rerun is not None:
                on_rerun_closed()
        finally:
            if self.otlp is not None:
                self.otlp.release()
        if closer is not None:
            closer.join(max(0.0, deadline - time.monotonic()) + 0.1)


class ExportWorker(Worker):
    """The Rerun worker's frame loop, serving OTLP as well."""

    KINDS = (*Worker.KINDS, CLOSE)

    def __init__(self, sinks: ExportSinks, ledger: ProgressLedger, report: BinaryIO,
                 capacity: int) -> None:
        super().__init__(sinks, ledger, report, capacity)
        self.progress = ledger.progress
        self.sinks = sinks
        self.span_sinks = tuple(name for name, on in ((LEDGER_SINK, sinks.rerun is not None),
                                                      (OTLP_SINK, sinks.otlp is not None))
                                if on)
        self._report_lock = threading.Lock()
        self._done = threading.Event()
        self._last: Any = None
        self._rerun_settled = Counts()
        self._rerun_drops: dict[Any, int] = {}
        # Spans drawn (with orphans, late and stranded ones) as of the same snapshot as
        # _rerun_settled: a live count ran ahead of what was settled, so a child killed
        # between two flushes had its spans counted both drawn and lost.
        self._rerun_drawn = [0, 0, 0, 0]
        # What the view holds (received, neither drawn and written nor counted lost), so
        # that a file's spans are settled while it draws, not only at a flush or the
        # close: a burst the view finished just past the shutdown deadline was counted
        # lost whole (200,001 spans in 1 of 3 bench_memory runs). Tracked under the
        # progress lock; a file only (a viewer confirms by answering, at a flush).
        self._held = Counts()
        self._tracking = sinks.rerun is not None and sinks.rerun.target.kind == "file"
        self._last_settle = 0.0
        if self._tracking:
            assert sinks.rerun is not None
            ledger.on_rerun_loss = self._lost_while_held
            sinks.rerun.on_batch_done = self._batch_done

    def run(self, frames: BinaryIO, close_timeout_s: float) -> int:
        ticker = threading.Thread(target=self._tick, daemon=True,
                                  name="proofscope-export-reports")
        ticker.start()
        try:
            return super().run(frames, close_timeout_s)
        finally:
            self._done.set()

    def activity(self) -> tuple[int, ...]:
        otlp = self.sinks.otlp
        exported = otlp.processor.stats.spans if otlp is not None and \
            otlp.processor is not None else 0
        return (*super().activity(), exported)

    def _tick(self) -> None:
        while not self._done.wait(REPORT_INTERVAL_S):
            self.report(only_if_changed=True)

    # ── what the view holds (settled while drawing) ──────────────────────────────────

    def _receive(self, spans: int, events: int, points: int = 0) -> None:
        with self.progress:  # received and held move together: never settled early
            super()._receive(spans, events, points)
            if self._tracking:
                self._held.add(Counts(spans, events, points))

    def _lost_while_held(self, signal: str, count: int) -> None:
        # Under the progress lock (the ledger's record). The sender thread's losses are
        # of the batch it is drawing, which _batch_done takes off whole.
        rerun = self.sinks.rerun
        if not self._tracking or rerun is None or rerun.is_sender():
            return
        setattr(self._held, signal, getattr(self._held, signal) - count)

    def _batch_done(self, spans: int, events: int, points: int) -> None:
        """On the sender thread, between two batches: everything received is drawn and
        written, counted lost, or still held; settle the first two (every
        :data:`REPORT_INTERVAL_S` at most)."""
        with self.progress:
            if not self._tracking:
                return
            self._held.sub(Counts(spans, events, points))
            now = time.monotonic()
            if now - self._last_settle < REPORT_INTERVAL_S:
                return
            self._last_settle = now
            held = Counts(*(max(0, n) for n in self._held.as_dict().values()))
            # A span waiting for its parent is logged, not drawn yet: still held (a kill
            # counts it unconfirmed, never drawn nor silently missing).
            assert self.sinks.rerun is not None
            held.spans += self.sinks.rerun.trace.pending
            settled = Counts(**self.received.as_dict())
            settled.sub(held)  # a count gone wrong settles less, never more
            self._settle_rerun(settled)

    def closing(self) -> None:
        with self.progress:  # the close settles everything (or a kill counts the rest)
            self._tracking = False
        super().closing()

    def _submit_spans(self, spans: Sequence[ReadableSpan], payload: bytes,
                      witness: bool, *, clean: bool = False) -> None:
        self.sinks.submit_frame(spans, payload, witness, clean=clean)

    def handle(self, kind: int, count: int, extra: int, payload: bytes) -> None:
        if kind == CLOSE:  # sent ahead of the frames still queued in the parent
            self.sinks.close_by = close_deadline(extra, payload)
            self.closing()
            return
        if kind in (SPANS, SPANS_WITNESS) and self.sinks.close_by is not None \
                and time.monotonic() >= self.sinks.close_by:
            # Past our deadline: counted unread, so that the close and the final report
            # still come before the parent's kill (which would leave all unconfirmed).
            self._receive(count, extra)
            self._lose_spans(count, extra, DropReason.SHUTDOWN)
            return
        if kind == FLUSH and self.sinks.otlp is not None:
            self._flush_each(count, extra / 1000)
            return
        super().handle(kind, count, extra, payload)

    def _flush_each(self, flush_id: int, timeout_s: float) -> None:
        """The Rerun sink here, settled and reported at once; OTLP on a thread of its
        own, which sends the flush's answer when it is done. A dead collector holds an
        OTLP flush for its whole timeout: in the frame loop it held up every frame
        behind it, the CLOSE frame too (measured on 2 busy CPUs: CLOSE read 1.8 s late,
        the child killed at the deadline and its .rrd left without a footer)."""
        deadline = time.monotonic() + timeout_s
        with waited_on():
            rerun_ok = self.sinks.flush_rerun(timeout_s)
        if rerun_ok:
            self._settle_rerun()
            self.report(only_if_changed=True)
        self._pending = 0
        otlp = self.sinks.otlp
        assert otlp is not None

        def flush_otlp() -> None:
            otlp_ok = otlp.flush(max(0.0, deadline - time.monotonic()))
            self.report(flush=flush_id, ok=rerun_ok and otlp_ok, rerun_ok=rerun_ok)

        threading.Thread(target=flush_otlp, daemon=True,
                         name=f"proofscope-export-flush-{flush_id}").start()

    def close_sinks(self, timeout_s: float) -> None:
        """The view first, then OTLP with what is left: the .rrd is finished and its
        spans reported settled while a dead or silent collector still holds the OTLP
        close, so a kill at the parent's deadline can cost OTLP only."""
        self.sinks.close(timeout_s, on_rerun_closed=self._report_rerun_settled)

    def _report_rerun_settled(self) -> None:
        self._settle_rerun()
        self.report(only_if_changed=True)

    def _settle_rerun(self, settled: Counts | None = None) -> None:
        """What the Rerun sink was given is drawn or counted lost (after its flush or
        close; or ``settled`` of it, from :meth:`_batch_done`): settled, with its losses
        as of now. Reports repeat both, so a kill counts the rest lost, once."""
        with self.progress:
            drops = self.ledger.snapshot()
            self._rerun_settled = settled if settled is not None \
                else Counts(**self.received.as_dict())
            stats = self.sink.stats
            self._rerun_drawn = stats.drawn_counts()
            self._rerun_drops = {k: n for k, n in drops.items() if k.sink != OTLP_SINK}
            # Left out under a display cap (not lost): the parent's exit report says so.
            self._rerun_drops.update(self.ledger.not_drawn())

    def _make_room(self, n: int) -> None:
        # With OTLP here, the frame loop never waits for the Rerun sink: a slow view
        # would hold up OTLP too (measured: at the shutdown deadline the frames still
        # unread were lost for both sinks). The Rerun sink's own bounded queue then
        # drops, counted under its name, what it cannot draw in time.
        if self.sinks.otlp is not None or self.sinks.rerun is None:
            return
        super()._make_room(n)

    def _lose_spans(self, spans: int, events: int, reason: str) -> None:
        for sink in self.span_sinks:
            self.ledger.record("spans", sink, reason, spans)
            self.ledger.record("span_events", sink, reason, events)

    def report(self, *, flush: int | None = None, ok: bool = True, final: bool = False,
               only_if_changed: bool = False, rerun_ok: bool | None = None) -> None:
        # From the frame loop and the ticker thread: one line at a time, in order.
        with self._report_lock:
            if final:
                self._done.set()
            elif self._done.is_set() and only_if_changed:
                return  # the final report is written or being written
            if final or (not only_if_changed and ok and rerun_ok is None):
                self._settle_rerun()  # after the Rerun sink's flush or close
            with self.progress:  # settled and lost: one consistent snapshot
                drops = self.ledger.snapshot()
                otlp = self.sinks.otlp
                exported, rejected = otlp.exported() if otlp is not None else (Counts(), 0)
            entries = [[k.signal, k.sink, k.reason, n] for k, n in (
                *self._rerun_drops.items(),
                *((k, n) for k, n in drops.items() if k.sink == OTLP_SINK))]
            line: dict[str, Any] = {
                "settled": self._rerun_settled.as_dict(), "drops": entries,
                "drawn": list(self._rerun_drawn)}
            if otlp is not None:
                # Exported, or counted lost in the snapshot: settled for OTLP. The
                # rejected spans are in both figures: once only.
                lost = {sig: sum(n for k, n in drops.items()
                                 if k.sink == OTLP_SINK and k.signal == sig)
                        for sig in ("spans", "span_events")}
                line["sink_settled"] = {OTLP_SINK: {
                    "spans": exported.spans + lost["spans"] - rejected,
                    "span_events": exported.span_events + lost["span_events"],
                    "metric_points": 0}}
                line["withheld"] = otlp.withheld
            if only_if_changed and line == self._last:
                return
            self._last = line
            line = {**line, "flush": flush, "ok": ok, "final": final}
            try:
                self._report.write(json.dumps(line).encode() + b"\n")
                self._report.flush()
            except OSError:
                pass  # the parent is gone; nobody is left to tell


def close_deadline(ms: int, payload: bytes) -> float:
    """When a CLOSE frame says our time is up (``time.monotonic()``): the parent's own
    deadline from the payload, else (or if that clock reading is implausible) ``ms``
    from now."""
    relative = time.monotonic() + ms / 1000
    if len(payload) == CLOSE_DEADLINE.size:
        (absolute,) = CLOSE_DEADLINE.unpack(payload)
        if time.monotonic() - 3600 < absolute <= relative:
            return float(absolute)
    return relative


def otlp_exporter(config: dict[str, Any], rejections: DropLedger) -> SpanExporter | None:
    """The OTLP exporter ``configure()`` would have built, or None (logged) if the
    settings cannot make one: every span is then counted lost for OTLP."""
    try:
        return FastOTLPSpanExporter(protocol=str(config["protocol"]),
                                    timeout=float(config["timeout"]), sink=OTLP_SINK,
                                    ledger=rejections)
    except Exception as exc:
        _log.warning("cannot export OTLP: %r; every span is counted lost for OTLP", exc)
        return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m otel_proofscope.rerun.export_worker "
              f"CONFIG_JSON | {prestart.ARG}", file=sys.stderr)
        return 64
    if args[0] == prestart.ARG:
        # Started ahead of configure() (rerun/prestart.py): imports done, now the work.
        try:
            header = prestart.read_header(0)
        except ValueError as exc:
            print(f"proofscope: {exc}", file=sys.stderr)
            return 2
        if header is None:
            return 0  # nobody took this child
        prestart.apply_env(header.get("env"))
        config = header["config"]
    else:
        config = json.loads(args[0])
    report, frames = child_pipes("export process")
    timeout = shutdown_timeout()
    # The parent's ledger logs these losses once they are reported; not twice.
    logging.getLogger("otel_proofscope.drops").disabled = True
    ledger = ProgressLedger()
    target = parse_rerun_target(config.get("target") or "off")
    # PROOFSCOPE_RERUN_QUEUE as the Rerun-only worker read it (checked by configure()).
    capacity = max(1, int(config.get("rerun_queue")
                          or os.environ.get("PROOFSCOPE_RERUN_QUEUE", "").strip()
                          or DEFAULT_QUEUE))
    budget = ByteBudget(BUDGET_BYTES)
    rerun = RerunSink(target, queue_size=capacity, queue_bytes=RERUN_QUEUE_BYTES,
                      ledger=ledger, budget=budget, budget_reserve=RERUN_QUEUE_BYTES) \
        if target.kind != "off" else None
    otlp = None
    if config.get("otlp"):
        rejections = DropLedger()  # the receiver's, moved to ``ledger`` by _Delivered
        otlp = OtlpStage(otlp_exporter(config["otlp"], rejections), rejections,
                         export_witness=bool(config.get("export_witness")),
                         queue=max(1, int(config.get("otlp_queue") or DEFAULT_QUEUE)),
                         ledger=ledger, budget=budget)
    worker = ExportWorker(ExportSinks(rerun, otlp, ledger, budget), ledger, report,
                          capacity // 2)
    worker.report()  # ready: the parent tells a child that never started from one that hung
    lower_priority()
    worker.collector = CollectWhenIdle(worker.activity).start()
    return worker.run(frames, timeout)


if __name__ == "__main__":
    sys.exit(main())
