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
and a Rerun view slower than the prover fills only the Rerun sink's queue (each drops
what does not fit, counted under its own sink). So the frame loop never blocks on a
sink and reads frames as fast as they come.

Reports (JSON lines on the private stdout) add to the Rerun worker's what each sink has
settled (``sink_settled``: exported or counted lost) and the witness events the OTLP
stage withheld; losses of both sinks are in ``drops`` under their own sink names.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from otel_proofscope.ledger import DropLedger
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter
from otel_proofscope.pipeline.privacy import WitnessFilter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.rerun.process import CLOSE, Counts
from otel_proofscope.rerun.sink import DEFAULT_QUEUE, LEDGER_SINK, RerunSink, SinkStats
from otel_proofscope.rerun.sink import parse_target as parse_rerun_target
from otel_proofscope.rerun.worker import (
    Worker,
    child_pipes,
    shutdown_timeout,
)
from otel_proofscope.semconv import DropReason

_log = logging.getLogger("otel_proofscope.rerun.export_worker")

OTLP_SINK = "otlp"


class OtlpStage:
    """The OTLP sink of the child: a bounded queue and export thread of its own."""

    def __init__(self, exporter: SpanExporter | None, *, export_witness: bool, queue: int,
                 ledger: DropLedger) -> None:
        self._ledger = ledger
        self.filter = None if export_witness or exporter is None \
            else WitnessFilter(exporter, OTLP_SINK)
        self.processor = None if exporter is None else BoundedBatchSpanProcessor(
            self.filter or exporter, sink=OTLP_SINK, max_queue_size=queue, ledger=ledger)
        self.submitted = Counts()
        self.refused = Counts()  # no exporter: every span is lost on arrival

    def submit(self, spans: Sequence[ReadableSpan]) -> None:
        events = sum(len(s.events) for s in spans)
        if self.processor is None:
            self._ledger.record("spans", OTLP_SINK, DropReason.EXPORT_FAILED, len(spans))
            self._ledger.record("span_events", OTLP_SINK, DropReason.EXPORT_FAILED, events)
            self.refused.add(Counts(len(spans), events))
            return
        on_end = self.processor.on_end
        for span in spans:
            on_end(span)
        self.submitted.add(Counts(len(spans), events))

    def pending(self) -> Counts:
        """Submitted and neither exported nor counted lost yet."""
        if self.processor is None:
            return Counts()
        stats = self.processor.stats
        with stats.lock:
            done = Counts(stats.spans + stats.lost_spans, stats.events + stats.lost_events)
        return Counts(self.submitted.spans - done.spans,
                      self.submitted.span_events - done.span_events)

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


class ExportSinks:
    """The frame loop's sink: the same spans to the Rerun sink (if any) and OTLP."""

    def __init__(self, rerun: RerunSink | None, otlp: OtlpStage | None) -> None:
        self.rerun = rerun
        self.otlp = otlp
        self._no_stats = SinkStats()
        #: The time the parent said it leaves us to close (a CLOSE frame), if it did.
        self.close_within: float | None = None

    @property
    def stats(self) -> SinkStats:
        return self.rerun.stats if self.rerun is not None else self._no_stats

    def submit_spans(self, spans: Sequence[ReadableSpan], *, witness: bool = False) -> int:
        if self.rerun is not None:
            self.rerun.submit_spans(spans, witness=witness)
        if self.otlp is not None:
            self.otlp.submit(spans)
        return len(spans)

    def submit_metrics(self, data: MetricsData) -> bool:
        # Metric frames come only from a Rerun metric exporter sharing this child.
        return self.rerun.submit_metrics(data) if self.rerun is not None else False

    def flush_rerun(self, timeout_s: float) -> bool:
        return self.rerun.flush(timeout_s) if self.rerun is not None else True

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        ok = self.flush_rerun(timeout_s)
        if self.otlp is not None:
            ok = self.otlp.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def close(self, timeout_s: float) -> None:
        if self.close_within is not None:
            timeout_s = min(timeout_s, self.close_within)
        # Side by side: a collector that hangs must not take the Rerun sink's time.
        closer = None
        if self.otlp is not None:
            closer = threading.Thread(target=self.otlp.close, args=(timeout_s,),
                                      daemon=True, name="proofscope-export-otlp-close")
            closer.start()
        deadline = time.monotonic() + timeout_s
        if self.rerun is not None:
            self.rerun.close(timeout_s)
        if closer is not None:
            closer.join(max(0.0, deadline - time.monotonic()) + 0.1)


class ExportWorker(Worker):
    """The Rerun worker's frame loop, serving OTLP as well."""

    KINDS = (*Worker.KINDS, CLOSE)

    def __init__(self, sinks: ExportSinks, ledger: DropLedger, report: BinaryIO,
                 capacity: int) -> None:
        super().__init__(sinks, ledger, report, capacity)
        self.sinks = sinks
        self.span_sinks = tuple(name for name, on in ((LEDGER_SINK, sinks.rerun is not None),
                                                      (OTLP_SINK, sinks.otlp is not None))
                                if on)

    def handle(self, kind: int, count: int, extra: int, payload: bytes) -> None:
        if kind == CLOSE:
            self.sinks.close_within = extra / 1000
            return
        super().handle(kind, count, extra, payload)

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

    def report(self, *, flush: int | None = None, ok: bool = True, final: bool = False) -> None:
        drops = [[k.signal, k.sink, k.reason, n] for k, n in self.ledger.snapshot().items()]
        stats = self.sink.stats
        line: dict[str, Any] = {
            "settled": self.received.as_dict(), "drops": drops, "flush": flush, "ok": ok,
            "final": final, "drawn": [stats.spans_drawn, stats.orphans]}
        otlp = self.sinks.otlp
        if otlp is not None:
            pending = otlp.pending()
            line["sink_settled"] = {OTLP_SINK: {
                "spans": self.received.spans - pending.spans,
                "span_events": self.received.span_events - pending.span_events,
                "metric_points": 0}}
            line["withheld"] = otlp.withheld
        try:
            self._report.write(json.dumps(line).encode() + b"\n")
            self._report.flush()
        except OSError:
            pass  # the parent is gone; nobody is left to tell


def otlp_exporter(config: dict[str, Any], ledger: DropLedger) -> SpanExporter | None:
    """The OTLP exporter ``configure()`` would have built, or None (logged) if the
    settings cannot make one: every span is then counted lost for OTLP."""
    try:
        return FastOTLPSpanExporter(protocol=str(config["protocol"]),
                                    timeout=float(config["timeout"]), sink=OTLP_SINK,
                                    ledger=ledger)
    except Exception as exc:
        _log.warning("cannot export OTLP: %r; every span is counted lost for OTLP", exc)
        return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m otel_proofscope.rerun.export_worker CONFIG_JSON",
              file=sys.stderr)
        return 64
    config = json.loads(args[0])
    report, frames = child_pipes("export process")
    timeout = shutdown_timeout()
    # The parent's ledger logs these losses once they are reported; not twice.
    logging.getLogger("otel_proofscope.drops").disabled = True
    ledger = DropLedger()
    target = parse_rerun_target(config.get("target") or "off")
    capacity = max(1, int(config.get("rerun_queue") or DEFAULT_QUEUE))
    rerun = RerunSink(target, queue_size=capacity, ledger=ledger) \
        if target.kind != "off" else None
    otlp = None
    if config.get("otlp"):
        otlp = OtlpStage(otlp_exporter(config["otlp"], ledger),
                         export_witness=bool(config.get("export_witness")),
                         queue=max(1, int(config.get("otlp_queue") or DEFAULT_QUEUE)),
                         ledger=ledger)
    worker = ExportWorker(ExportSinks(rerun, otlp), ledger, report, capacity // 2)
    return worker.run(frames, timeout)


if __name__ == "__main__":
    sys.exit(main())
