"""Child side of the out-of-process Rerun exporter.

Run as ``python -m otel_proofscope.rerun.worker TARGET`` by
:mod:`otel_proofscope.rerun.process`.

Why a child: translating a span for Rerun costs ~60 µs of Python and Rerun's encoding
more; in the prover's process that time competes for the prover's GIL. Here it runs in
its own interpreter, at ~90 µs per span in all, faster than a Python prover makes them.

Reads frames (:mod:`otel_proofscope.rerun.process` defines them) from stdin: span frames
are unpacked by :mod:`otel_proofscope.rerun.span_wire`, metric frames are OTLP, converted
with the OTLP receiver's pure conversion. Both feed one
:class:`~otel_proofscope.rerun.sink.RerunSink`, exactly as the in-process exporters do.
Memory stays bounded: one frame is read at a time (at most ``MAX_FRAME`` bytes) and the
sink's queue is drained before it could overflow, so a slow Rerun pushes back through
the pipe to the parent's bounded queue.

Its own losses go to a private ledger, reported on stdout as JSON lines (cumulative,
with the items settled so far) after each flush and at exit; the parent adds the
differences to its ``DROPS``. Nothing else may write to the real stdout, so it is moved
to a private descriptor and fd 1 points at stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import BinaryIO, Protocol

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp import decode
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.deadline import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    ENV_SHUTDOWN_TIMEOUT,
    parse_timeout,
)
from otel_proofscope.pipeline.gc_policy import CollectWhenIdle
from otel_proofscope.rerun import sink as sinks
from otel_proofscope.rerun import span_wire
from otel_proofscope.rerun.process import (
    FLUSH,
    HEADER,
    MAX_FRAME,
    METRICS,
    SPANS,
    SPANS_WITNESS,
    Counts,
)
from otel_proofscope.rerun.sink import RerunSink, SinkStats
from otel_proofscope.rerun.target import LEDGER_SINK, parse_target
from otel_proofscope.semconv import DropReason

_log = logging.getLogger("otel_proofscope.rerun.worker")

ENV_NICE = "PROOFSCOPE_RERUN_NICE"
#: Scheduling niceness added to the child (0 keeps the parent's priority).
DEFAULT_NICE = 10
#: Bound on the sink flush done to drain its queue (backpressure) and on request.
DRAIN_TIMEOUT_S = 30.0


class FrameSink(Protocol):
    """What the frame loop feeds: a :class:`RerunSink`, or the export process's pair."""

    @property
    def stats(self) -> SinkStats: ...

    def submit_spans(self, spans: Sequence[ReadableSpan], *, witness: bool = False) -> int: ...

    def submit_metrics(self, data: MetricsData) -> bool: ...

    def flush(self, timeout_s: float) -> bool: ...

    def close(self, timeout_s: float) -> None: ...


class Worker:
    """Frame loop around one sink; ``ledger`` holds this process's losses."""

    #: The frame kinds this loop reads; any other means the stream is out of step.
    KINDS: tuple[int, ...] = (SPANS, SPANS_WITNESS, METRICS, FLUSH)

    def __init__(self, sink: FrameSink, ledger: DropLedger, report: BinaryIO,
                 capacity: int) -> None:
        self.sink = sink
        self.ledger = ledger
        self._report = report
        self._capacity = capacity
        self._pending = 0  # items submitted to the sink since it was last drained
        self.received = Counts()
        #: This process's garbage collection (main() starts one); paused for the close.
        self.collector: CollectWhenIdle | None = None

    def activity(self) -> tuple[int, ...]:
        """Changes while there is work: frames arriving, batches drawn."""
        return self.received.spans, self.received.metric_points, self.sink.stats.batches

    def closing(self) -> None:
        """From here on every second goes to drawing what is left: no collections, and
        the priority the prover had (it is done; best effort, see restore_priority)."""
        if self.collector is not None:
            self.collector.pause()
        restore_priority()

    def run(self, frames: BinaryIO, close_timeout_s: float) -> int:
        rc = 0
        while True:
            header = frames.read(HEADER.size)
            if len(header) < HEADER.size:
                break  # EOF (a torn header can only follow the parent's death)
            kind, count, extra, length = HEADER.unpack(header)
            if kind not in self.KINDS or length > MAX_FRAME:
                # The stream is out of step: nothing after this can be trusted. The
                # parent counts everything unsettled when it sees us exit.
                _log.warning("rerun worker: corrupt frame header (kind %d, %d bytes); "
                             "stopping", kind, length)
                rc = 2
                break
            payload = frames.read(length) if length else b""
            if len(payload) < length:
                break  # torn frame: the parent counts it (it never finished sending it)
            self.handle(kind, count, extra, payload)
        self.closing()
        self.close_sinks(close_timeout_s)
        self.report(final=True)
        return rc

    def close_sinks(self, timeout_s: float) -> None:
        self.sink.close(timeout_s)

    def handle(self, kind: int, count: int, extra: int, payload: bytes) -> None:
        if kind == FLUSH:
            with waited_on():
                ok = self.sink.flush(extra / 1000)
            self._pending = 0
            self.report(flush=count, ok=ok)
            return
        if kind == METRICS:
            self._metrics(count, payload)
        else:
            self._spans(count, extra, payload, witness=kind == SPANS_WITNESS)

    def _receive(self, spans: int, events: int, points: int = 0) -> None:
        """Count a frame as received (before it is unpacked, refused or handed on)."""
        self.received.spans += spans
        self.received.span_events += events
        self.received.metric_points += points

    def _spans(self, count: int, events: int, payload: bytes, *, witness: bool) -> None:
        self._receive(count, events)
        try:
            batch = span_wire.unpack_spans(payload)
        except span_wire.FrameError as exc:  # count the frame, keep going
            _log.warning("rerun worker: %s", exc)
            self._lose_spans(count, events, DropReason.INVALID)
            return
        if batch.first_error:
            _log.warning("rerun worker: %s (%d record(s) with %d event(s) refused)",
                         batch.first_error, batch.rejected_spans, batch.rejected_events)
        got_events = sum(map(event_count, batch.spans))
        self._lose_spans(count - len(batch.spans), events - got_events, DropReason.INVALID)
        self._make_room(len(batch.spans))
        self._submit_spans(batch.spans, payload, witness, clean=not batch.rejected_spans)

    def _submit_spans(self, spans: Sequence[ReadableSpan], payload: bytes,
                      witness: bool, *, clean: bool = False) -> None:
        self.sink.submit_spans(spans, witness=witness)

    def _metrics(self, points: int, payload: bytes) -> None:
        self._receive(0, 0, points)
        try:
            batch = decode.metrics_from_request(ExportMetricsServiceRequest.FromString(payload))
        except Exception as exc:
            _log.warning("rerun worker: undecodable metric frame: %r", exc)
            self.ledger.record("metric_points", LEDGER_SINK, DropReason.INVALID, points)
            return
        self.ledger.record("metric_points", LEDGER_SINK, DropReason.INVALID, points - batch.points)
        if batch.points:
            self._make_room(batch.points)
            self.sink.submit_metrics(batch.data)

    def _lose_spans(self, spans: int, events: int, reason: str) -> None:
        self.ledger.record("spans", LEDGER_SINK, reason, spans)
        self.ledger.record("span_events", LEDGER_SINK, reason, events)

    def _make_room(self, n: int) -> None:
        # Drain the sink before its queue could overflow: the pipe then fills and the
        # parent's bounded queue decides what is dropped, in one place.
        self._pending += n
        if self._pending > self._capacity:
            self.sink.flush(DRAIN_TIMEOUT_S)
            self._pending = n
            self.report()

    def report(self, *, flush: int | None = None, ok: bool = True, final: bool = False) -> None:
        # Losses, and what a display cap left out (not lost: the parent counts it apart).
        drops = [[k.signal, k.sink, k.reason, n] for k, n in (
            *self.ledger.snapshot().items(), *self.ledger.not_drawn().items())]
        stats = self.sink.stats
        line = {"settled": self.received.as_dict(), "drops": drops, "flush": flush, "ok": ok,
                "final": final, "drawn": stats.drawn_counts()}
        try:
            self._report.write(json.dumps(line).encode() + b"\n")
            self._report.flush()
        except OSError:
            pass  # the parent is gone; nobody is left to tell


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m otel_proofscope.rerun.worker TARGET", file=sys.stderr)
        return 64
    report, frames = child_pipes("rerun worker")
    target = parse_target(args[0])
    capacity = max(1, int(os.environ.get("PROOFSCOPE_RERUN_QUEUE", "") or sinks.DEFAULT_QUEUE))
    timeout = shutdown_timeout()
    # The parent's ledger logs these losses once they are reported; not twice.
    logging.getLogger("otel_proofscope.drops").disabled = True
    ledger = DropLedger()
    sink = RerunSink(target, queue_size=capacity, queue_bytes=sinks.CHILD_QUEUE_BYTES,
                     ledger=ledger)
    worker = Worker(sink, ledger, report, capacity // 2)
    worker.report()  # ready: the parent tells a child that never started from one that hung
    lower_priority()
    worker.collector = CollectWhenIdle(worker.activity).start()
    return worker.run(frames, timeout)


def child_pipes(what: str) -> tuple[BinaryIO, BinaryIO]:
    """Set up a child of the prover: deaf to Ctrl-C, logging to stderr; returns its
    private report (stdout) and frame (stdin) pipes. Niced once started
    (lower_priority)."""
    # Ctrl-C reaches the whole process group; the parent decides when we stop (EOF).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format=f"proofscope {what}: %(message)s")
    # Private, non-inheritable copies of the pipes: a viewer spawned by Rerun must not
    # hold them open (the parent would never see EOF or EPIPE), and nothing but the
    # reports may reach the parent's reader.
    report = os.fdopen(os.dup(1), "wb")
    frames = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return report, frames


#: How much lower_priority lowered our priority (restore_priority undoes it), and from what.
_niced = 0
_priority_before = 0


def lower_priority() -> None:
    """Drawing is background work: where cores are scarce the prover goes first. Called
    once the child has started (its imports and sinks built, the ready report sent):
    niced from its first instruction, beside two CPU hogs the child took ~2 s longer to
    start, and a short run's exit waited for it (`proofscope demo`: +0.57 s against
    the thread route, issue 29's budget is +0.3 s)."""
    global _niced, _priority_before
    if _niced > 0:
        return
    with contextlib.suppress(OSError, ValueError):
        wanted = int(os.environ.get(ENV_NICE, "") or DEFAULT_NICE)
        _priority_before = os.getpriority(os.PRIO_PROCESS, 0)
        target = min(_priority_before + max(wanted, 0), 19)
        if target > _priority_before and _set_every_thread(target):
            _niced = target - _priority_before


def restore_priority() -> None:
    """Undo lower_priority once the prover is done with its work. Niced under two
    busy processes on two CPUs, this process got about a tenth of a CPU for its close
    and missed the shutdown bound with a handful of spans. Lowering niceness needs
    privilege (root, CAP_SYS_NICE or RLIMIT_NICE): elsewhere the close stays niced."""
    global _niced
    if _niced > 0 and _set_every_thread(_priority_before):
        _niced = 0


@contextlib.contextmanager
def waited_on() -> Iterator[None]:
    """The prover's priority while it waits on us (a flush it asked for: the first step
    of its shutdown, or a force_flush): then nothing of the prover's runs on the thread
    the niceness protects. Beside two CPU hogs, `proofscope demo`'s shutdown flush took
    ~1 s niced, and the demo waited for it."""
    was_niced = _niced > 0
    restore_priority()
    try:
        yield
    finally:
        if was_niced and _niced == 0:  # restored (unprivileged, it stays niced)
            lower_priority()


def _set_every_thread(priority: int) -> bool:
    """Every thread's niceness, not only the caller's: on Linux niceness is per thread,
    and the drawing happens in the sink's sender and the Rerun SDK's own threads
    (measured beside two CPU hogs: with the calling thread alone restored, the close
    still took ~2 s; 0.4-0.6 s with every thread). Threads started later inherit it
    from the thread that starts them."""
    try:
        tasks = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: niceness is per process (macOS)
        try:
            os.setpriority(os.PRIO_PROCESS, 0, priority)
        except OSError:
            return False
        return True
    done = False
    for tid in tasks:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile; no privilege
            os.setpriority(os.PRIO_PROCESS, tid, priority)
            done = True
    return done


def shutdown_timeout() -> float:
    """The shutdown bound the parent was given (``PROOFSCOPE_SHUTDOWN_TIMEOUT``)."""
    try:
        return parse_timeout(os.environ.get(ENV_SHUTDOWN_TIMEOUT))
    except ValueError as exc:
        _log.warning("%s; using %s s", exc, DEFAULT_SHUTDOWN_TIMEOUT_S)
        return DEFAULT_SHUTDOWN_TIMEOUT_S


if __name__ == "__main__":
    sys.exit(main())
