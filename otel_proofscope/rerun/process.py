"""The worker-process machinery behind the export process, and Rerun exporters that
translate in a Rerun-only child.

:class:`RerunWorker` (a child, its bounded byte queue, writer and reader threads and
their accounting) is the base of the export process's worker
(:mod:`otel_proofscope.rerun.export_process`), the one route by which ``configure()``
draws Rerun (issue 29). :class:`RerunProcessSpanExporter` /
:class:`RerunProcessMetricExporter` (a Rerun-only child running
:mod:`otel_proofscope.rerun.worker`) are no longer a ``configure()`` route
(``PROOFSCOPE_RERUN_PROCESS`` is retired); they stay for explicit use and benchmarks.

Why a child at all: the Rerun translation (~60 µs of Python per span, plus Rerun's own
encoding) in a thread of the prover's process competes for the prover's GIL (the full
pipeline measured 1.75-1.94x the discarding baseline). Here the prover's process only
packs spans into compact marshal frames (:mod:`otel_proofscope.rerun.span_wire`, ~6 µs
per span) and hands them to a writer thread; the child
(:mod:`otel_proofscope.rerun.worker`) unpacks them (~11 µs per span) and feeds the same
:class:`~otel_proofscope.rerun.sink.RerunSink` the in-process exporters use. Metrics, a
few points per second, travel as OTLP. A span and a metric exporter with the same target
share one child, so both land in one recording.

Wire format on the child's stdin: frames of ``HEADER`` (kind, item count, span events or
a timeout, payload length) followed by the payload. On its stdout the child answers JSON
lines with what it has settled (handled, whether drawn or counted lost) and its
cumulative losses.

Accounting (sink ``rerun`` in ``DROPS``), each item exactly once: the parent's bounded
queue counts ``queue_full``; the child's losses arrive in its reports; when the child
dies, everything sent but not yet settled, and everything still queued, is counted
``sink_unavailable`` with one warning; when it was killed at the shutdown deadline,
what was still queued here is ``shutdown`` and what it had but never settled
``unconfirmed`` (an upper bound: it may have drawn some). ``export()`` never blocks on
the child and never raises.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from opentelemetry.sdk.metrics.export import (
    MetricsData,
)
from opentelemetry.sdk.metrics.view import Aggregation
from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.otlp.encode import encode_metrics_request
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.forking import after_fork_in_child
from otel_proofscope.rerun.child_command import child_command
from otel_proofscope.rerun.exporter_base import (
    RerunMetricExporterBase,
    RerunSpanExporterBase,
)
from otel_proofscope.rerun.shared import SharedByTarget
from otel_proofscope.rerun.span_wire import pack_spans, pack_spans_full
from otel_proofscope.rerun.tally import TALLY
from otel_proofscope.rerun.target import LEDGER_SINK, Target, parse_target
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)

ENV_TIMEOUT = "PROOFSCOPE_SHUTDOWN_TIMEOUT"

#: kind (u8), items (u32), span events or flush timeout ms (u32), payload bytes (u32)
HEADER = struct.Struct("<BIII")
SPANS, SPANS_WITNESS, METRICS, FLUSH = 1, 2, 3, 4
#: The time (ms, in the third header field) the child has left to close once the
#: stream ends, and as payload the parent's deadline itself (``CLOSE_DEADLINE``);
#: only the export process (rerun/export_worker.py) is sent it.
CLOSE = 5
#: A CLOSE frame's payload: the ``time.monotonic()`` by which the child must have sent
#: its final report. CLOCK_MONOTONIC is one clock for the processes of a machine, so
#: the child's deadline does not move with how late it reads the frame (a child still
#: importing at the parent's close read CLOSE 1.4 s late on two busy CPUs, then took
#: its full share again and was killed with its .rrd unfinished).
CLOSE_DEADLINE = struct.Struct("<d")
#: Largest payload the child accepts; a larger length means the stream is corrupt.
MAX_FRAME = 256 << 20
#: Encoded bytes queued in the parent before new batches are dropped and counted.
DEFAULT_QUEUE_BYTES = 32 << 20


@dataclass
class Counts:
    spans: int = 0
    span_events: int = 0
    metric_points: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"spans": self.spans, "span_events": self.span_events,
                "metric_points": self.metric_points}

    def add(self, other: Counts) -> None:
        self.spans += other.spans
        self.span_events += other.span_events
        self.metric_points += other.metric_points

    def sub(self, other: Counts) -> None:
        self.spans -= other.spans
        self.span_events -= other.span_events
        self.metric_points -= other.metric_points


def _lose(ledger: DropLedger, counts: Counts, reason: str,
          span_sinks: Sequence[str] = (LEDGER_SINK,)) -> None:
    # Spans reach every sink the child serves; metric points only the Rerun view.
    for sink in span_sinks:
        ledger.record("spans", sink, reason, counts.spans)
        ledger.record("span_events", sink, reason, counts.span_events)
    ledger.record("metric_points", LEDGER_SINK, reason, counts.metric_points)


@dataclass
class _Frame:
    data: bytes
    counts: Counts


class RerunWorker:
    """One child process per target: a bounded byte queue, a writer and a reader thread."""

    #: What the warnings call the child.
    label = "rerun: the worker process"
    #: The span sinks the child serves (ledger names); each span is lost or settled in each.
    span_sinks: tuple[str, ...] = (LEDGER_SINK,)
    #: Whether span frames carry everything OTLP needs (span_wire version 2).
    full_frames = False
    #: Whether close() tells the child how long it has (a CLOSE frame before EOF).
    close_hint = False
    #: Seconds past its deadline that close() waits for a child still starting (no
    #: report yet): its start-up is an interpreter and the Rerun SDK's imports, which
    #: on two busy CPUs outlasted a short run plus the whole 3 s bound, losing the view.
    startup_grace_s = 0.0

    def __init__(self, target: Target, *, queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 ledger: DropLedger = DROPS, argv: Sequence[str] | None = None) -> None:
        self.target = target
        self._ledger = ledger
        self._capacity = queue_bytes
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[_Frame | None] = collections.deque()  # None: close
        self._queued_bytes = 0
        self._sent = Counts()  # fully written to the pipe
        # As of the child's latest report, per span sink (metric points: the Rerun one).
        self._settled = {sink: Counts() for sink in self.span_sinks}
        # Spans the child drew (of those orphans, late, stranded), as reported.
        self._drawn: tuple[int, ...] = (0, 0, 0, 0)
        self._applied: dict[tuple[str, str, str], int] = {}  # child losses already recorded
        self._flushes: dict[int, tuple[threading.Event, list[bool]]] = {}
        self._next_flush = 0
        self._closing = False
        self._killed = False
        self._dead = False  # the child can no longer take frames
        self._gone = False  # the child exited and what it left unsettled is counted
        self._final = False  # the child's final report arrived
        #: Set by the child's first report: it has started and built its sinks.
        self.ready = threading.Event()
        self._warned = False
        self.proc = self._spawn(
            list(argv) if argv is not None
            else child_command("otel_proofscope.rerun.worker", target.name))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._writer = threading.Thread(target=self._write_loop, args=(self.proc.stdin,),
                                        daemon=True, name="proofscope-rerun-proc-writer")
        self._reader = threading.Thread(target=self._read_loop, args=(self.proc.stdout,),
                                        daemon=True, name="proofscope-rerun-proc-reader")
        self._writer.start()
        self._reader.start()
        self._forked = False
        after_fork_in_child(self._after_fork_in_child)

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                close_fds=True)

    def _after_fork_in_child(self) -> None:
        # A forked process (a multiprocessing worker) inherits this object but not its
        # threads, and holds the pipe to the parent's child open: the parent's child
        # would then never see EOF and be killed at the shutdown deadline, losing spans.
        # The fork closes its copies and counts its own spans as sink_unavailable; what
        # was queued belongs to the parent, which sends it.
        self._cond = threading.Condition(threading.Lock())
        self._forked = self._dead = self._gone = True
        self._queue.clear()
        self._queued_bytes = 0
        self._flushes.clear()
        # dup2 over the descriptors rather than closing them: the file objects still
        # own those numbers, and closing them later must not hit an unrelated file.
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_RDWR)
            try:
                for pipe in (self.proc.stdin, self.proc.stdout):
                    if pipe is not None:
                        os.dup2(null, pipe.fileno(), inheritable=False)
            finally:
                os.close(null)

    # ── producer side (exporter threads): never blocks on the child ──────────────────

    def submit(self, kind: int, payload: bytes, counts: Counts) -> bool:
        items = counts.metric_points if kind == METRICS else counts.spans
        data = HEADER.pack(kind, items, counts.span_events, len(payload)) + payload
        with self._cond:
            if self._dead or self._closing:
                reason: str | None = DropReason.SHUTDOWN if self._closing and not self._dead \
                    else DropReason.SINK_UNAVAILABLE
            elif self._queued_bytes + len(data) > self._capacity:
                reason = DropReason.QUEUE_FULL
            else:
                reason = None
                self._queue.append(_Frame(data, counts))
                self._queued_bytes += len(data)
                self._cond.notify()
        if reason is not None:
            self.lose(counts, reason)
            if self._forked and not self._warned:
                self._warned = True
                _log.warning("rerun: this process was forked from the one that owns the Rerun "
                             "worker for %s; its own spans and metrics are not drawn "
                             "(counted in proofscope.dropped as sink_unavailable); OTLP "
                             "export is unaffected", self.target.name)
            return False
        return True

    def lose(self, counts: Counts, reason: str) -> None:
        """Count ``counts`` lost in every sink the child serves."""
        _lose(self._ledger, counts, reason, self.span_sinks)

    def flush(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the child drew everything queued so far."""
        done = threading.Event()
        result = [False]
        with self._cond:
            if self._dead or self._closing:
                return not self._dead
            self._next_flush += 1
            fid = self._next_flush
            self._flushes[fid] = (done, result)
            ms = max(1, min(int(timeout_s * 1000), 0xFFFFFFFF))
            # Control frames bypass the byte bound: they are 13 bytes.
            self._queue.append(_Frame(HEADER.pack(FLUSH, fid, ms, 0), Counts()))
            self._cond.notify()
        done.wait(max(timeout_s, 0.0))
        with self._cond:
            self._flushes.pop(fid, None)
        return result[0]

    def close(self, timeout_s: float) -> None:
        """Let the child draw what is queued within ``timeout_s``, then kill it.

        A second call (the exit's last close while a metric exporter's release, on a
        reader thread, is still closing) waits as the first does, within its own
        ``timeout_s``: returning at once let the report be made while the first call
        was still about to count the child's losses (a metric sink that hung)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if self._forked:
            return  # the process and threads belong to the parent
        if self.startup_grace_s > 0 and not self.ready.is_set():
            # Still importing: a bounded grace (the prover's exit waits at most this
            # much longer), so a short run on a busy machine keeps its view.
            deadline += self.startup_grace_s
            timeout_s = deadline - time.monotonic()
        with self._cond:
            if not self._closing:
                self._closing = True
                self._send_close(timeout_s)
        self._reader.join(max(0.0, deadline - time.monotonic()))
        if self._reader.is_alive() or self.proc.poll() is None:
            with self._cond:
                self._killed = not self._final
            self.proc.kill()
            self._reader.join(2.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(2.0)
        self._writer.join(2.0)

    def _send_close(self, timeout_s: float) -> None:
        """The end of the stream (and with ``close_hint`` the child's deadline first);
        under ``self._cond``."""
        if self.close_hint:
            # Ahead of the frames still queued: the child learns its deadline now,
            # not after unpacking them (measured: 8-10 MB queued at the close, read
            # 1.1-1.4 s later, the child then overran the bound half the time). It
            # keeps a fifth of the time, at most 0.25 s, for its final report to
            # reach us (a line of JSON; a late-started child needs the rest).
            bound = max(timeout_s, 0.0)
            share = bound - min(0.2 * bound, 0.25)
            ms = max(1, min(int(share * 1000), 0xFFFFFFFF))
            by = CLOSE_DEADLINE.pack(time.monotonic() + share)
            self._queue.appendleft(_Frame(
                HEADER.pack(CLOSE, 0, ms, CLOSE_DEADLINE.size) + by, Counts()))
        self._queue.append(None)
        self._cond.notify()

    # ── writer thread ────────────────────────────────────────────────────────────────

    def _write_loop(self, pipe: IO[bytes]) -> None:
        fd = pipe.fileno()
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                frame = self._queue.popleft()
                if frame is not None:
                    self._queued_bytes -= len(frame.data)
                    broken = self._dead
                    if not broken:
                        # Counted as sent before the write: if the child exits meanwhile,
                        # _child_gone settles this frame together with the others.
                        self._sent.add(frame.counts)
            if frame is None:
                break
            if broken:
                self._drop_unsent(frame)
                continue
            try:
                view = memoryview(frame.data)
                while view:  # os.write releases the GIL while the pipe is full
                    view = view[os.write(fd, view):]
            except OSError:
                with self._cond:
                    self._dead = True
                    mine = not self._gone  # else _child_gone counted it already
                    if mine:
                        self._sent.sub(frame.counts)
                if mine:
                    self._drop_unsent(frame)
        with contextlib.suppress(OSError):
            pipe.close()  # EOF: the child draws what it has, reports and exits

    def _drop_unsent(self, frame: _Frame) -> None:
        self.lose(frame.counts,
                  DropReason.SHUTDOWN if self._killed else DropReason.SINK_UNAVAILABLE)

    # ── reader thread ────────────────────────────────────────────────────────────────

    def _read_loop(self, pipe: IO[bytes]) -> None:
        for line in pipe:
            try:
                report = json.loads(line)
                self._apply(report)
            except (ValueError, TypeError, KeyError) as exc:
                _log.debug("rerun worker: unreadable report %r: %r", line[:200], exc)
        with contextlib.suppress(OSError):
            pipe.close()  # EOF: the child is gone; nothing else reads this pipe
        self._child_gone()

    def _apply(self, report: dict[str, Any]) -> None:
        settled = Counts(**{k: int(v) for k, v in report["settled"].items()})
        # A child serving several sinks says what each has settled (else: all the same).
        by_sink = {sink: Counts(**{k: int(v) for k, v in counts.items()})
                   for sink, counts in (report.get("sink_settled") or {}).items()}
        news: list[tuple[tuple[str, str, str], int]] = []
        with self._cond:
            for signal, sink, reason, total in report["drops"]:
                key = (str(signal), str(sink), str(reason))
                delta = int(total) - self._applied.get(key, 0)
                if delta > 0:
                    self._applied[key] = int(total)
                    news.append((key, delta))
            self._settled = {sink: by_sink.get(sink, settled) for sink in self.span_sinks}
            self._final = self._final or bool(report.get("final"))
            # The child's running count of spans drawn in the trace view (cumulative).
            drawn = (*(int(v) for v in report.get("drawn", ())), 0, 0, 0, 0)[:4]
            last, self._drawn = self._drawn, drawn
            TALLY.add(*(now - before for now, before in zip(drawn, last, strict=True)))
            waiter = self._flushes.get(report.get("flush") or -1)
        self.ready.set()
        for (signal, sink, reason), n in news:
            self._ledger.record(signal, sink, reason, n)
        self._applied_report(report)
        if waiter is not None:
            waiter[1][0] = bool(report.get("ok"))
            waiter[0].set()

    def _applied_report(self, report: dict[str, Any]) -> None:
        """A subclass's hook for what else the child reports (after the losses)."""

    def _child_gone(self) -> None:
        """The child closed its stdout (it exited): settle everything it did not."""
        with self._cond:
            self._dead = self._gone = True
            sent = self._sent
            # Per sink: what was sent and that sink never settled (a sink that is slower
            # than another, OTLP to a dead collector, has more of it).
            lost_by_sink = {sink: Counts(max(0, sent.spans - done.spans),
                                         max(0, sent.span_events - done.span_events), 0)
                            for sink, done in self._settled.items()}
            rerun_done = self._settled.get(LEDGER_SINK, next(iter(self._settled.values())))
            metric_points = sent.metric_points - rerun_done.metric_points
            unsent = [f for f in self._queue if f is not None]
            self._queue = collections.deque(f for f in self._queue if f is None)
            self._queued_bytes = 0
            expected = self._closing and not self._killed
            waiters = list(self._flushes.values())
            self._cond.notify_all()
        unsent_counts = Counts()
        for frame in unsent:
            unsent_counts.add(frame.counts)
        # Never written to the child: lost. Written but not settled: a child that died
        # lost them; one stopped at the deadline may have delivered some (an OTLP batch
        # sent after its last report), so they are counted apart, as unconfirmed.
        reason = DropReason.SHUTDOWN if self._killed else DropReason.SINK_UNAVAILABLE
        # A child stopped before its first report was still starting: it handled
        # nothing, so nothing it was sent can have been delivered.
        started = self.ready.is_set()
        in_child = (DropReason.UNCONFIRMED if started else DropReason.SHUTDOWN) \
            if self._killed else DropReason.SINK_UNAVAILABLE
        for sink, sink_lost in lost_by_sink.items():
            _lose(self._ledger, Counts(sink_lost.spans, sink_lost.span_events, 0), in_child,
                  (sink,))
            _lose(self._ledger, Counts(unsent_counts.spans, unsent_counts.span_events, 0),
                  reason, (sink,))
        _lose(self._ledger, Counts(metric_points=metric_points), in_child, ())
        _lose(self._ledger, Counts(metric_points=unsent_counts.metric_points), reason, ())
        lost = Counts(max(c.spans for c in lost_by_sink.values()) + unsent_counts.spans, 0,
                      metric_points + unsent_counts.metric_points)
        for done, _ in waiters:
            done.set()
        if not expected and not self._warned:
            self._warned = True
            rc = self.proc.poll()
            unconfirmed = max(c.spans for c in lost_by_sink.values()) \
                if self._killed and started else 0
            how = "died"
            if self._killed:
                how = "was stopped at the shutdown deadline" if started else \
                    "had not started by the shutdown deadline (a busy machine: its " \
                    "start-up takes ~1 s of CPU)"
            _log.warning("%s for %s %s (exit status %s); %d span(s) "
                         "and %d metric point(s) it had not drawn, and any sent later, are "
                         "dropped and counted in proofscope.dropped%s; %s", self.label,
                         self.target.name, how,
                         rc, lost.spans, lost.metric_points,
                         f" ({unconfirmed} span(s) of them as unconfirmed: the process had "
                         "them and may have delivered some)" if unconfirmed else "",
                         "in every sink it served" if self.span_sinks != (LEDGER_SINK,)
                         else "OTLP export is unaffected")


# ── one worker per target, shared by the span and metric exporters ───────────────────

_registry: SharedByTarget[RerunWorker] = SharedByTarget()


def acquire(target: Target, **kwargs: Any) -> RerunWorker:
    return _registry.acquire(target.name, lambda: RerunWorker(target, **kwargs))


def release(worker: RerunWorker, timeout_s: float) -> None:
    """Drop one reference: the last one closes the child, earlier ones only flush."""
    _registry.release(worker.target.name, worker, timeout_s)


def _open(target: str | None, queue_bytes: int | None) -> tuple[Target, RerunWorker | None]:
    t = parse_target(target)
    if t.kind == "off":
        return t, None
    return t, acquire(t, queue_bytes=queue_bytes or DEFAULT_QUEUE_BYTES)


class WorkerBackend:
    """The child-process backend: the target's shared :class:`RerunWorker`."""

    def __init__(self, worker: RerunWorker) -> None:
        self.worker = worker
        self._warned_refused = False

    def send_spans(self, spans: Sequence[ReadableSpan], witness: bool) -> None:
        counts = Counts(spans=len(spans), span_events=sum(event_count(s) for s in spans))
        try:
            payload, refused = (pack_spans_full if self.worker.full_frames
                                else pack_spans)(spans)
            if refused:
                lost = Counts(spans=len(refused), span_events=sum(event_count(s) for s in refused))
                self.worker.lose(lost, DropReason.INVALID)
                counts.sub(lost)
                if not self._warned_refused:
                    self._warned_refused = True
                    _log.warning("rerun: %d span(s) carry attribute values that cannot "
                                 "be sent to the Rerun worker; dropped and counted (once "
                                 "logged)", len(refused))
            self.worker.submit(SPANS_WITNESS if witness else SPANS, payload, counts)
        except Exception as exc:  # never let the exporter raise into the SDK
            self.worker.lose(counts, DropReason.EXPORT_FAILED)
            _log.warning("rerun span export failed: %r", exc)

    def send_metrics(self, data: MetricsData, points: int) -> None:
        counts = Counts(metric_points=points)
        try:
            self.worker.submit(METRICS, encode_metrics_request(data), counts)
        except Exception as exc:
            self.worker.lose(counts, DropReason.EXPORT_FAILED)
            _log.warning("rerun metric export failed: %r", exc)

    def flush(self, timeout_s: float) -> bool:
        return self.worker.flush(timeout_s)

    def release(self, timeout_s: float) -> None:
        release(self.worker, timeout_s)


class RerunProcessSpanExporter(RerunSpanExporterBase):
    """:class:`~otel_proofscope.rerun.exporter.RerunSpanExporter`, translating in a child.

    Args:
        target: as ``PROOFSCOPE_RERUN`` (``None`` reads it).
        capture_witness: as for the in-process exporter.
        queue_bytes: encoded bytes queued for the child before batches are dropped and
            counted (only the first exporter of a target sets it).
        shutdown_timeout_s: bound on ``shutdown()`` (``PROOFSCOPE_SHUTDOWN_TIMEOUT``, 3 s).
    """

    def __init__(self, target: str | None = None, *, capture_witness: bool | None = None,
                 queue_bytes: int | None = None, shutdown_timeout_s: float | None = None) -> None:
        parsed, self.worker = _open(target, queue_bytes)
        super().__init__(parsed, WorkerBackend(self.worker) if self.worker is not None
                         else None, capture_witness, shutdown_timeout_s)


class RerunProcessMetricExporter(RerunMetricExporterBase):
    """:class:`~otel_proofscope.rerun.exporter.RerunMetricExporter`, translating in the
    child of the same target (one recording for spans and metrics)."""

    def __init__(self, target: str | None = None, *,
                 preferred_temporality: dict[type, object] | None = None,
                 preferred_aggregation: dict[type, Aggregation] | None = None,
                 queue_bytes: int | None = None, shutdown_timeout_s: float | None = None) -> None:
        parsed, self.worker = _open(target, queue_bytes)
        super().__init__(parsed, WorkerBackend(self.worker) if self.worker is not None
                         else None, preferred_temporality, preferred_aggregation,
                         shutdown_timeout_s)
