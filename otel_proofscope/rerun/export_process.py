"""Pack once, export out of process: OTLP and the Rerun view in one child process.

The one route by which :func:`~otel_proofscope.setup.configure` draws Rerun (issue 29):
whenever a Rerun target is on, the spans' Rerun sink and, with them, the OTLP span
export run here, and a Rerun metric exporter of the same target shares the child (one
recording). The child starts inside ``configure()``, so its start-up (an interpreter and
the Rerun SDK's imports: ~1.3-1.5 s to its first report on two busy CPUs) overlaps the
prover's own work; ``shutdown()`` waits for it within its bound, as for any sink, and a
child with no report yet at the deadline gets a bounded grace
(:data:`MAX_STARTUP_GRACE_S`, at most the bound itself) to start and draw. The
prover's process never imports the Rerun SDK on this route (``rerun/target.py``,
``rerun/exporter_base.py``). OTLP-only runs keep the in-thread fast exporter
unless ``configure(export_process=True)`` / ``PROOFSCOPE_EXPORT_PROCESS=1`` moves them
here too; ``export_process=False`` / ``=0`` keeps OTLP in the prover's process while
Rerun still draws here. The in-process :class:`~otel_proofscope.rerun.exporter.
RerunSpanExporter` stays for the ``OTEL_TRACES_EXPORTER=rerun`` SDK entry point and
explicit use (``configure(span_exporters=...)``).

Why: through the GIL, every export thread in the prover's process adds to the prover
thread's wall time. Measured per prover span on 2 CPUs: the fast OTLP encoder and gRPC
send ~18 µs, the Rerun child route's packing ~6 µs, against a ~65 µs prover span; the
full pipeline (OTLP here, Rerun in a child) then costs ~1.5x the discarding exporter.
With this route the prover's process pays one packing per span
(:func:`~otel_proofscope.rerun.span_wire.pack_spans_full`, the full record) and a pipe
write; :mod:`otel_proofscope.rerun.export_worker` encodes and sends OTLP and translates
for Rerun.

Accounting: one span processor in the parent serves both sinks
(:class:`~otel_proofscope.pipeline.multi_sink.MultiSinkBatchSpanProcessor`); a span it
loses is lost for each sink. The child reports, per sink, what it settled (exported or
counted lost) and its losses under each sink's name; what it never settled when it dies
is counted per sink as ``sink_unavailable``, and when it is killed at the shutdown
deadline as ``unconfirmed`` (it had them: some may have been delivered) beside
``shutdown`` for what it was never handed, so ``delivered`` per sink is only what the
child said it delivered.
OTLP progress is reported every 0.25 s. A Rerun file is settled as it is drawn (the
child counts what its view still holds, and settles the rest between two batches, every
0.25 s at most); a viewer (gRPC, spawn) only at a flush and at close, as on the Rerun
child route. So a child killed at the deadline has what it drew since its last
settlement counted lost, never the reverse.
Metric export stays in the parent (a few points per interval); a Rerun metric exporter
of the same target shares this child (one recording).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.forking import after_fork_in_child
from otel_proofscope.pipeline.privacy import WitnessFilter, strip_witness
from otel_proofscope.rerun import prestart, process
from otel_proofscope.rerun.child_command import child_command
from otel_proofscope.rerun.exporter_base import (
    RerunMetricExporterBase,
    RerunSpanExporterBase,
    env_float,
)
from otel_proofscope.rerun.process import (
    DEFAULT_QUEUE_BYTES,
    Counts,
    RerunWorker,
    WorkerBackend,
)
from otel_proofscope.rerun.target import LEDGER_SINK, parse_target
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)

ENV_SWITCH = "PROOFSCOPE_EXPORT_PROCESS"
#: At most this long (and at most the shutdown bound itself) past the shutdown deadline,
#: the exit waits for an export process that has not started yet (see
#: ``RerunWorker.startup_grace_s``); a started child gets the bound alone.
MAX_STARTUP_GRACE_S = 3.0
OTLP_SINK = "otlp"
#: The OTLP protocols the child's exporter (FastOTLPSpanExporter) speaks.
PROTOCOLS = ("grpc", "http/protobuf")


def switch(explicit: bool | None = None) -> bool | None:
    """``explicit`` if given, else ``PROOFSCOPE_EXPORT_PROCESS`` (``1`` / ``0``), else
    None: the default, OTLP spans in the child exactly when it draws Rerun anyway."""
    if explicit is not None:
        return explicit
    raw = os.environ.get(ENV_SWITCH, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    return None


@dataclass(frozen=True)
class ExportConfig:
    """What the child serves: a Rerun target (``"off"``: none) and/or OTLP."""

    rerun_target: str = "off"
    otlp_protocol: str | None = None  # None: no OTLP
    otlp_timeout_s: float = 10.0
    export_witness: bool = False
    otlp_queue: int = 8192
    rerun_queue: int | None = None

    @property
    def sinks(self) -> tuple[str, ...]:
        rerun = parse_target(self.rerun_target).kind != "off"
        return tuple(name for name, on in ((OTLP_SINK, self.otlp_protocol is not None),
                                           (LEDGER_SINK, rerun)) if on)

    def payload(self) -> dict[str, Any]:
        """What the child reads: as its argument, or a prestarted child's header."""
        otlp = None if self.otlp_protocol is None else {
            "protocol": self.otlp_protocol, "timeout": self.otlp_timeout_s}
        return {"target": parse_target(self.rerun_target).name, "otlp": otlp,
                "export_witness": self.export_witness, "otlp_queue": self.otlp_queue,
                "rerun_queue": self.rerun_queue}

    def argv(self) -> list[str]:
        return child_command(prestart.MODULE, json.dumps(self.payload()))


class _Nowhere(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE


class ExportWorker(RerunWorker):
    """The export child: the Rerun worker's queue, pipe and accounting, for each sink."""

    label = "the export process"
    full_frames = True
    close_hint = True

    def __init__(self, config: ExportConfig, *, queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 ledger: DropLedger = DROPS) -> None:
        self.config = config
        self.span_sinks = config.sinks
        # Witness events the child's OTLP stage withheld, as it reports them: the exit
        # report reads them as it reads every sink's WitnessFilter (never "exported").
        self.witness = WitnessFilter(_Nowhere(), OTLP_SINK)
        super().__init__(parse_target(config.rerun_target), queue_bytes=queue_bytes,
                         ledger=ledger, argv=config.argv())

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        # A child a command started ahead of configure() has its imports behind it.
        return prestart.take(self.config.payload()) or super()._spawn(argv)

    def _applied_report(self, report: dict[str, Any]) -> None:
        withheld = report.get("withheld")
        if type(withheld) is int and withheld > self.witness.withheld_events:
            self.witness.withheld_events = withheld


def _key(config: ExportConfig) -> str:
    # A Rerun metric exporter of the same target finds this child by the target's name.
    target = parse_target(config.rerun_target)
    return target.name if target.kind != "off" else f"export-process:{id(config)}"


def acquire(config: ExportConfig, queue_bytes: int | None = None,
            shutdown_timeout_s: float | None = None) -> ExportWorker:
    worker = process._registry.acquire(  # one child per target, as the Rerun route
        _key(config), lambda: ExportWorker(config, queue_bytes=queue_bytes
                                           or DEFAULT_QUEUE_BYTES))
    if not isinstance(worker, ExportWorker) or worker.config != config:
        process._registry.release(_key(config), worker, 0.0)
        raise ValueError(f"the Rerun target {config.rerun_target!r} already has a "
                         "worker process of another route in this process")
    bound = shutdown_timeout_s or env_float(process.ENV_TIMEOUT, 3.0)
    worker.startup_grace_s = max(worker.startup_grace_s, min(bound, MAX_STARTUP_GRACE_S))
    return worker


class ExportProcessSpanExporter(RerunSpanExporterBase):
    """Spans to the export process: packed once here, OTLP and Rerun in the child.

    ``export()`` never blocks and never raises: a batch is queued for the child, or its
    loss is counted for every sink the child serves.
    """

    def __init__(self, config: ExportConfig, *, capture_witness: bool | None = None,
                 queue_bytes: int | None = None,
                 shutdown_timeout_s: float | None = None) -> None:
        self.config = config
        self.worker = acquire(config, queue_bytes, shutdown_timeout_s)
        super().__init__(parse_target(config.rerun_target), WorkerBackend(self.worker),
                         capture_witness, shutdown_timeout_s)
        self._in_fork = False
        self._fork_lock = threading.Lock()
        self._fork_exporter: SpanExporter | None = None
        self._fork_warned = False
        after_fork_in_child(self._after_fork)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._in_fork:
            return self._export_in_fork(spans)
        if self._closed and spans:
            self.worker.lose(Counts(len(spans), sum(event_count(s) for s in spans)),
                             DropReason.SHUTDOWN)
            return SpanExportResult.SUCCESS  # counted: not again by the processor
        return super().export(spans)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._in_fork:
            return True  # exported synchronously: nothing waits anywhere
        return super().force_flush(timeout_millis)

    def shutdown(self) -> None:
        if self._in_fork and self._fork_exporter is not None:
            self._fork_exporter.shutdown()
        super().shutdown()

    # ── in a forked process (a multiprocessing worker) ───────────────────────────────
    # The parent's child and its pipe belong to the parent (the worker closed this
    # process's copies). The Rerun view stays the parent's: this process's spans are
    # counted as not drawn, as on the Rerun child route. OTLP is exported from here, on
    # the processor's thread: an export process of its own starts too slowly (measured:
    # four forked workers' own export processes missed the 3 s exit bound on 2 busy CPUs
    # and their spans were lost).

    def _after_fork(self) -> None:
        self._in_fork = True
        self._fork_lock = threading.Lock()
        self._fork_exporter = None
        self._fork_warned = False

    def _export_in_fork(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        counts = Counts(len(spans), sum(event_count(s) for s in spans))
        sinks = self.config.sinks
        if LEDGER_SINK in sinks:
            process._lose(DROPS, counts, DropReason.SINK_UNAVAILABLE, (LEDGER_SINK,))
            if not self._fork_warned:
                self._fork_warned = True
                _log.warning("export process: this process was forked from the one that "
                             "owns the Rerun view of %s; its own spans are not drawn "
                             "(counted in proofscope.dropped as sink_unavailable); OTLP "
                             "is exported from this process", self.target.name)
        if OTLP_SINK not in sinks:
            return SpanExportResult.SUCCESS
        try:
            exporter = self._otlp_in_fork()
            out = list(spans)
            if not self.config.export_witness:
                out = [strip_witness(s) for s in spans]
                self.worker.witness.withheld_events += \
                    counts.span_events - sum(event_count(s) for s in out)
            ok = exporter.export(out) == SpanExportResult.SUCCESS
        except Exception as exc:  # never raise into the SDK
            _log.warning("export process: OTLP export from a forked process failed: %r", exc)
            ok = False
        if not ok:
            process._lose(DROPS, counts, DropReason.EXPORT_FAILED, (OTLP_SINK,))
        return SpanExportResult.SUCCESS  # delivered, or counted (not again)

    def _otlp_in_fork(self) -> SpanExporter:
        from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter

        with self._fork_lock:
            if self._fork_exporter is None:
                self._fork_exporter = FastOTLPSpanExporter(
                    protocol=self.config.otlp_protocol, timeout=self.config.otlp_timeout_s,
                    sink=OTLP_SINK)
            return self._fork_exporter


class ExportProcessMetricExporter(RerunMetricExporterBase):
    """Metrics to the Rerun view drawn by the export process of ``config`` (the child
    the span exporter of the same target started, else one of its own): spans and
    metrics of a target land in one recording."""

    def __init__(self, config: ExportConfig, *, queue_bytes: int | None = None,
                 shutdown_timeout_s: float | None = None) -> None:
        self.config = config
        self.worker = acquire(config, queue_bytes, shutdown_timeout_s)
        super().__init__(parse_target(config.rerun_target), WorkerBackend(self.worker),
                         None, None, shutdown_timeout_s)
