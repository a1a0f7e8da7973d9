"""The handle :func:`otel_proofscope.setup.configure` returns: flush, bounded shutdown,
the exit report, and the GPU sampler, all over the providers and sinks it built.

Each pipeline's report counts its own losses. The drop ledger is process-wide, so a
pipeline marks it when configured and reports what was recorded since, less what other
pipelines lost after their own shutdown (a span ended on a closed pipeline's tracer is
that pipeline's loss, counted by its processors). A second ``shutdown()`` returns the
report again with what the pipeline lost since the first (a proof made after shutdown
is dropped and used to be reported by nobody, or by the next pipeline as its own).
Pipelines running side by side in one process still share the losses each records
while both are open.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import (
    DROPS,
    REJECTIONS,
    DropKey,
    DropLedger,
    LedgerMark,
    RejectionLedger,
)
from otel_proofscope.pipeline.deadline import set_shutdown_deadline
from otel_proofscope.pipeline.metric_export import CountingMetricExporter, SinkMetricReader
from otel_proofscope.pipeline.privacy import WitnessFilter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.pipeline.sigterm import hold_sigterm

_log = logging.getLogger(__name__)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass
class ShutdownReport:
    """What the pipeline delivered and lost, for the exit summary."""

    duration_s: float
    spans_exported: dict[str, int]
    events_exported: dict[str, int]
    metric_points_exported: dict[str, int]
    dropped: int
    drop_lines: list[str]
    rejected: int
    witness_events_withheld: int
    timed_out: bool
    #: "rerun: drawn N spans; not drawn M (…)" when a Rerun route is configured.
    trace_line: str = ""
    #: Witness events each filtered sink withheld (never counted as exported there).
    witness_by_sink: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = []
        for sink, n in sorted(self.spans_exported.items()):
            out.append(f"exported to {sink}: {_count(n, 'span')}, "
                       f"{_count(self.events_exported.get(sink, 0), 'span event')}, "
                       f"{_count(self.metric_points_exported.get(sink, 0), 'metric point')}")
        for sink, n in sorted(self.metric_points_exported.items()):
            if sink not in self.spans_exported:
                out.append(f"exported to {sink}: {_count(n, 'metric point')}")
        if self.trace_line:
            out.append(self.trace_line)
        out += self.drop_lines
        if self.rejected:
            out.append(f"rejected bad input: {self.rejected} (see proofscope.rejected)")
        if self.witness_events_withheld:
            per_sink = ", ".join(f"{k}: {n}" for k, n in sorted(self.witness_by_sink.items())
                                 if n)
            out.append(f"witness events kept out of OTLP: {self.witness_events_withheld} "
                       f"({per_sink})")
        if self.timed_out:
            out.append(f"shutdown hit its {self.duration_s:.1f} s bound")
        return out


@dataclass
class Telemetry:
    """Handle returned by :func:`configure`."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    tracer: ProofTracer
    span_processors: list[BoundedBatchSpanProcessor]
    metric_exporters: list[CountingMetricExporter]
    shutdown_timeout_s: float
    out_dir: Path | None
    ledger: DropLedger = DROPS
    #: Bad input the hot path recorded instead of raising (the process-wide ledger).
    rejections: RejectionLedger = REJECTIONS
    witness_filters: list[WitnessFilter] = field(default_factory=list)
    _closers: list[Any] = field(default_factory=list)
    _before_shutdown: list[Any] = field(default_factory=list)
    #: This pipeline's Rerun sinks / child processes, closed last (see _close_all).
    _rerun: list[Any] = field(default_factory=list)
    #: The periodic readers of our metric sinks, shut down side by side (see _close_all).
    _sink_readers: list[SinkMetricReader] = field(default_factory=list)
    _report: ShutdownReport | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: The ledgers when this pipeline was configured (see the module docstring).
    _mark: LedgerMark = field(default_factory=LedgerMark)
    _rejections_mark: int = 0
    #: Other pipelines' losses after their shutdown, as they stood at our mark.
    _others_at_mark: list[tuple[weakref.ref[Telemetry], dict[DropKey, int]]] = field(
        default_factory=list)
    #: Per processor, (spans, events) it had lost when the first report was made.
    _lost_at_report: dict[int, tuple[int, int]] | None = None
    #: This pipeline's share of the ledger at its first report.
    _own_at_report: DropLedger | None = None

    def __post_init__(self) -> None:
        self._mark = self.ledger.mark()
        self._rejections_mark = self.rejections.total()
        alive = [r for r in _PIPELINES if r() is not None]
        self._others_at_mark = [(r, t.late_losses()) for r in alive
                                if (t := r()) is not None]
        _PIPELINES[:] = [*alive, weakref.ref(self)]

    def late_losses(self) -> dict[DropKey, int]:
        """What this pipeline's processors lost after its first report: spans ended on
        its tracer after shutdown (reason ``shutdown``), per sink."""
        before = self._lost_at_report
        if before is None:
            return {}
        out: dict[DropKey, int] = {}
        for p in self.span_processors:
            spans0, events0 = before.get(id(p), (0, 0))
            with p.stats.lock:
                spans, events = p.stats.lost_spans - spans0, p.stats.lost_events - events0
            for sink in getattr(p, "sinks", (p.sink,)):
                for signal, n in (("spans", spans), ("span_events", events)):
                    if n > 0:
                        key = DropKey(signal, sink, "shutdown")
                        out[key] = out.get(key, 0) + n
        return out

    def own_ledger(self) -> DropLedger:
        """This pipeline's share of the process ledger: recorded since it was configured,
        less what other pipelines lost after their shutdown in that time; once shut
        down, its share then plus what its processors lost since (exact: nothing else
        of this pipeline records after its shutdown)."""
        if self._own_at_report is not None:
            counts = self._own_at_report.snapshot()
            for key, n in self.late_losses().items():
                counts[key] = counts.get(key, 0) + n
            return DropLedger.holding(counts, self._own_at_report.not_drawn())
        claimed: dict[DropKey, int] = {}
        seen = set()
        for ref, at_mark in self._others_at_mark:
            other = ref()
            if other is None:
                continue
            seen.add(id(other))
            for key, n in other.late_losses().items():
                claimed[key] = claimed.get(key, 0) + n - at_mark.get(key, 0)
        for ref in _PIPELINES:  # configured after us, closed since
            other = ref()
            if other is not None and other is not self and id(other) not in seen:
                for key, n in other.late_losses().items():
                    claimed[key] = claimed.get(key, 0) + n
        return self.ledger.since(self._mark, claimed)

    def start_gpu_sampler(self, interval_s: float = 1.0, *,
                          evidence: Literal["first_dispatch", "immediately"] = "first_dispatch",
                          ) -> Any:
        """Sample NVML devices into ``hw.*`` instruments until shutdown.

        Returns the sampler, or None when no NVML device is present (a CPU-only machine
        stays silent). ``evidence="immediately"`` reports capability gaps at once
        (for wrapped processes whose dispatches we cannot see).
        """
        from otel_proofscope.gpu import start_sampler

        sampler = start_sampler(meter_provider=self.meter_provider, interval_s=interval_s,
                                evidence=evidence)
        if sampler is not None:
            self._before_shutdown.append(sampler.stop)
        return sampler

    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Export what is queued; bounded by ``timeout_s`` (default: the shutdown bound)."""
        budget = timeout_s if timeout_s is not None else self.shutdown_timeout_s
        deadline = time.monotonic() + budget
        ok = all(p.force_flush(int(max(0.0, deadline - time.monotonic()) * 1000))
                 for p in self.span_processors)
        # Metrics get their own share of the budget: a dead span sink must not leave
        # them none (the SDK raises MetricsTimeoutError on a zero timeout).
        remaining = max(budget / 4, deadline - time.monotonic()) * 1000
        try:
            return self.meter_provider.force_flush(int(remaining)) and ok
        except Exception as exc:
            _log.warning("metric flush did not finish within %.1f s: %s", remaining / 1000, exc)
            return False

    def shutdown(self, timeout_s: float | None = None, *,
                 log_drops: bool = True) -> ShutdownReport:
        """Flush and close every sink within ``timeout_s``; report what was lost.

        ``log_drops=False``: the caller prints ``report.lines()`` itself (the CLI's exit
        summary), so the drop lines are not logged a second time.
        """
        with self._lock:
            if self._report is not None:
                # Misuse after shutdown (a proof on a closed pipeline) is still this
                # pipeline's loss: report it, not the first report unchanged.
                self._report = self._make_report(self._report.duration_s,
                                                 self._report.timed_out)
                return self._report
            budget = timeout_s if timeout_s is not None else self.shutdown_timeout_s
            start = time.monotonic()
            deadline = start + budget
            # Exporters whose shutdown takes no timeout (Rerun) close within what is left;
            # cleared afterwards, or a later pipeline in this process would inherit it.
            set_shutdown_deadline(deadline)
            # A second SIGTERM (an impatient supervisor) must not abort the accounting
            # half way: the bound already guarantees a prompt exit.
            restore = hold_sigterm()
            try:
                self._close_all(budget, deadline)
            finally:
                set_shutdown_deadline(None)
                restore()
            elapsed = time.monotonic() - start
            own = self.own_ledger()
            self._report = self._make_report(budget, elapsed > budget, own)
            self._own_at_report = own
            self._lost_at_report = {id(p): (p.stats.lost_spans, p.stats.lost_events)
                                    for p in self.span_processors}
            if self._report.dropped and log_drops:
                for line in self._report.drop_lines:
                    _log.warning("%s", line)
            return self._report

    def _close_all(self, budget: float, deadline: float) -> None:
        for stop in self._before_shutdown:
            self._bounded(stop, min(deadline, time.monotonic() + budget / 4))
        # Every span sink starts exporting what it holds now, while the metrics are
        # collected below: a short proof's spans are all still queued here (the batch
        # delay outlasts it), and exporting them sink after sink, behind the metrics,
        # made the sinks' I/O and Rerun's native work wait for each other.
        for processor in self.span_processors:
            processor.begin_flush()
        # Metrics first: the final collection includes the last proof's durations. We
        # wait for them at most half the budget before the spans' turn (a hung metric
        # sink used to leave the spans no time: they were reported as delivered), and
        # then again with whatever the spans left.
        metrics = self._bounded(lambda: self._shutdown_metrics(deadline),
                                min(deadline, time.monotonic() + budget / 2))
        for processor in self.span_processors:
            processor.shutdown(int(max(0.0, deadline - time.monotonic()) * 1000))
        metrics.join(max(0.0, deadline - time.monotonic()))
        for exporter in self.metric_exporters:
            exporter.abandon()
        # A Rerun sink is shared by the span and the metric exporter and closes on the
        # last release; a metric shutdown that ran out of time never released, which
        # left the sink open past the report with its queue uncounted. Close it now
        # (a later release is then a no-op).
        for resource in self._rerun:
            try:
                resource.close(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                _log.debug("closing %r raised %r", resource, exc)
        for close in self._closers:
            try:
                close()
            except Exception as exc:
                _log.debug("closer raised %r", exc)

    def _shutdown_metrics(self, deadline: float) -> None:
        # Side by side: one hung sink must not keep the others' readers ticking (and
        # counting) past the report. The meter provider then shuts down the rest (a
        # caller's own readers); for ours its call is a no-op.
        def left_ms() -> float:
            return max(1.0, (deadline - time.monotonic()) * 1000)

        readers = [self._started(lambda r=r: r.shutdown(timeout_millis=left_ms()))
                   for r in self._sink_readers]
        try:
            self.meter_provider.shutdown(timeout_millis=left_ms())
        finally:
            for thread in readers:
                thread.join(max(0.0, deadline - time.monotonic()))

    @classmethod
    def _bounded(cls, fn: Any, deadline: float) -> threading.Thread:
        thread = cls._started(fn)
        thread.join(max(0.0, deadline - time.monotonic()))
        return thread

    @staticmethod
    def _started(fn: Any) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except Exception as exc:
                # e.g. a metric reader that ran out of time ("deadline already exceeded");
                # what it did not deliver is counted by the exporters' abandon() below.
                _log.debug("shutdown step raised %r", exc)

        thread = threading.Thread(target=run, daemon=True, name="proofscope-shutdown")
        thread.start()
        return thread

    def _make_report(self, budget: float, timed_out: bool,
                     own: DropLedger | None = None) -> ShutdownReport:
        own = own if own is not None else self.own_ledger()
        # A processor feeding the export process serves several sinks: one line each.
        delivered = {sink: p.stats.delivered(own, sink)
                     for p in self.span_processors for sink in getattr(p, "sinks", (p.sink,))}
        withheld: dict[str, int] = {}
        for f in self.witness_filters:
            withheld[f.sink] = withheld.get(f.sink, 0) + f.withheld_events
        return ShutdownReport(
            duration_s=budget,
            spans_exported={sink: d[0] for sink, d in delivered.items()},
            events_exported={sink: max(0, d[1] - withheld.get(sink, 0))
                             for sink, d in delivered.items()},
            witness_by_sink=withheld,
            metric_points_exported={e.sink: e.delivered() for e in self.metric_exporters},
            dropped=own.total(),
            drop_lines=own.summary_lines(),
            rejected=max(0, self.rejections.total() - self._rejections_mark),
            witness_events_withheld=sum(f.withheld_events for f in self.witness_filters),
            timed_out=timed_out,
            trace_line=self._trace_line(own),
        )

    def _trace_line(self, own: DropLedger) -> str:
        if not any("rerun" in getattr(p, "sinks", (p.sink,)) for p in self.span_processors):
            return ""
        from otel_proofscope.rerun.tally import TALLY

        return TALLY.summary_line(own)


#: Every pipeline configured in this process (weakly held): each report leaves out the
#: others' losses after their shutdown.
_PIPELINES: list[weakref.ref[Telemetry]] = []
