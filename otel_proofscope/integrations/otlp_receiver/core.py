"""Transport-neutral core of the OTLP receiver: admission, auth, size cap, decode, export.

The gRPC and HTTP front ends only translate between their wire and an :class:`Outcome`;
every decision (and every count in the drop ledger) is made here, once, so both
transports reject the same request the same way.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from google.protobuf.message import Message  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.integrations.otlp_receiver import codec, feed, limits
from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.otlp import decode
from otel_proofscope.semconv import DropReason

_log = logging.getLogger("otel_proofscope.serve")

#: The ``proofscope.sink`` label of this receiver's entries in the drop ledger.
LEDGER_SINK = "otlp_receiver"
#: Prefix of the :meth:`Ingest.stats` keys for what senders declared dropped.
SENDER_DROPPED = "sender_dropped."
#: Drop reason for a request without the right bearer token (not yet in semconv.DropReason).
REASON_UNAUTHENTICATED = "unauthenticated"
#: Drop reason for a request turned away because the receiver was busy.
REASON_BUSY = DropReason.QUEUE_FULL.value

#: 16 MiB: the largest batch an OTLP SDK sends with its default batch processor (512
#: spans) of layer spans with 128 round events is ~12.3 MB (official JS SDK, measured by
#: benchmarks/bench_node_fleet.py); gRPC's own 4 MiB default refused every full batch.
#: What is decoded at once stays bound by the in-flight byte budget, not by this cap.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_CONCURRENT = 8
#: How long a request waits for a free slot before it is turned away as busy.
ADMISSION_TIMEOUT_S = 5.0
#: Bound on one downstream export call (the SDK exporters' own timeout argument).
EXPORT_TIMEOUT_MS = 10_000.0
#: How long a trace request may wait for room in the span queues, chunk after chunk,
#: before the rest of it is answered as rejected (partial success). Below the OTLP
#: exporters' default 10 s timeout, so the sender is still there to hear it.
REPLY_WITHIN_S = 8.0
#: Poll interval while a chunk waits for room in a span queue.
QUEUE_POLL_S = 0.02
#: How often a request waiting for an admission slot checks whether the receiver stops.
STOP_POLL_S = 0.1
#: How long a request's first chunk, converted already, waits for room in a span queue
#: before the whole request is refused (the sender retries). Why not 0: a refused
#: request has been parsed and its first chunk converted for nothing, and the sink
#: drains a chunk in well under this (a 512-span chunk of 16-round spans ~0.3 s of CPU);
#: refusing at once made serve refuse ~2 requests for each one it took
#: (benchmarks/bench_trace.py: 206 refusals for 100 requests) and sit idle between
#: its senders' retries.
FIRST_CHUNK_WAIT_S = 1.0

_ITEM_SIGNAL = {codec.Signal.TRACES: "spans", codec.Signal.METRICS: "metric_points"}


class Outcome(StrEnum):
    """What happened to one request; each front end maps it to its status codes."""

    OK = "ok"
    INVALID = "invalid"
    TOO_LARGE = "too_large"
    UNAUTHENTICATED = "unauthenticated"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    BUSY = "busy"
    #: Past the in-flight byte budget: refused at once with a retry hint.
    OVER_BUDGET = "over_budget"
    #: The client did not finish sending its request within the deadline.
    TIMEOUT = "timeout"


_REASON = {
    Outcome.INVALID: DropReason.INVALID.value,
    Outcome.TOO_LARGE: DropReason.SIZE_CAP.value,
    Outcome.UNAUTHENTICATED: REASON_UNAUTHENTICATED,
    Outcome.UNSUPPORTED_MEDIA_TYPE: DropReason.INVALID.value,
    Outcome.BUSY: REASON_BUSY,
    Outcome.OVER_BUDGET: REASON_BUSY,
    Outcome.TIMEOUT: DropReason.TIMEOUT.value,
}


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    message: str = ""
    #: The export response (OK only); carries partial success when items were rejected.
    response: Message | None = None


def requests_signal(signal: codec.Signal) -> str:
    """Drop-ledger signal for whole requests refused before their items were known."""
    return f"otlp_{signal.value}_requests"


class Ingest:
    """Checks, decodes and converts OTLP requests and feeds SDK exporters."""

    def __init__(self, span_exporters: Sequence[SpanExporter] = (),
                 metric_exporters: Sequence[MetricExporter] = (), *,
                 token: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT,
                 admission_timeout_s: float = ADMISSION_TIMEOUT_S,
                 max_inflight_bytes: int = limits.DEFAULT_MAX_INFLIGHT_BYTES,
                 request_deadline_s: float = limits.DEFAULT_REQUEST_DEADLINE_S,
                 reply_within_s: float = REPLY_WITHIN_S,
                 ledger: DropLedger = DROPS) -> None:
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
        if max_concurrent <= 0:
            raise ValueError(f"max_concurrent must be positive, got {max_concurrent}")
        self.span_exporters = list(span_exporters)
        self.metric_exporters = list(metric_exporters)
        self.max_message_bytes = max_message_bytes
        self.max_concurrent = max_concurrent
        self.admission_timeout_s = admission_timeout_s
        if token is not None and not token.strip():
            # It could never authenticate (credentials are stripped): refuse it at start.
            raise ValueError("the token is empty or whitespace; give a real token or none")
        self._token = f"Bearer {token}".encode() if token else None
        self._ledger = ledger
        self._admission = threading.BoundedSemaphore(max_concurrent)
        if not request_deadline_s > 0:
            raise ValueError(f"request_deadline_s must be positive, got {request_deadline_s}")
        self.request_deadline_s = request_deadline_s
        if not reply_within_s > 0:
            raise ValueError(f"reply_within_s must be positive, got {reply_within_s}")
        self.reply_within_s = reply_within_s
        self.budget = limits.ByteBudget(max_inflight_bytes)
        # Set when the receiver stops: a request waiting for room (a held gRPC one waits
        # up to its deadline) is refused and counted now, before the sinks shut down and
        # the summary is written, not answered after them.
        self._stopping = threading.Event()
        # SDK exporters are not promised to be thread-safe; requests arrive concurrently.
        self._export_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._requests: Counter[tuple[str, str]] = Counter()
        self._items: Counter[str] = Counter()

    # ── checks the front ends run before they have the body ─────────────────────────

    def authorized(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries the configured bearer token."""
        if self._token is None:
            return True
        if not authorization:
            return False
        scheme, _, credentials = authorization.strip().partition(" ")
        presented = f"Bearer {credentials.strip()}".encode()
        return scheme.lower() == "bearer" and hmac.compare_digest(presented, self._token)

    def authorized_all(self, values: Sequence[str]) -> bool:
        """One rule for both transports: exactly one ``authorization`` header, carrying
        the token. Several are refused (gRPC used to take the last and HTTP the first,
        so a proxy and a client could each pick a different one)."""
        if self._token is None:
            return True
        return len(values) == 1 and self.authorized(values[0])

    def admit(self, wait_until: float | None = None) -> bool:
        """Take one of ``max_concurrent`` slots, waiting at most ``admission_timeout_s``
        or, when given, until ``wait_until`` (monotonic: a held gRPC request's reply_by)."""
        until = time.monotonic() + self.admission_timeout_s if wait_until is None \
            else wait_until
        while not self._stopping.is_set():
            if self._admission.acquire(timeout=max(0.0, min(until - time.monotonic(),
                                                            STOP_POLL_S))):
                return True
            if time.monotonic() >= until:
                return False
        return False

    def stop_waiting(self) -> None:
        """The receiver is stopping: every request waiting for a slot, budget or room in
        the span queues is refused (and counted) at once, and no new one waits."""
        self._stopping.set()
        self.budget.stop_waiting()

    def release(self) -> None:
        self._admission.release()

    def timed_out(self, signal: codec.Signal | None) -> None:
        """Count a request closed at its deadline (``signal`` None: before its path)."""
        name = requests_signal(signal) if signal is not None else "otlp_requests"
        self._ledger.record(name, LEDGER_SINK, _REASON[Outcome.TIMEOUT])
        if signal is not None:
            self._count(signal, Outcome.TIMEOUT)
        _log.info("closed an OTLP/HTTP request not finished within %.0f s",
                  self.request_deadline_s)

    def reject(self, signal: codec.Signal, outcome: Outcome, message: str) -> Result:
        """Count a refused request and build its result."""
        self._ledger.record(requests_signal(signal), LEDGER_SINK, _REASON[outcome])
        self._count(signal, outcome)
        _log.info("rejected OTLP %s request (%s): %s", signal.value, outcome.value, message)
        return Result(outcome, message)

    # ── the request itself ──────────────────────────────────────────────────────────

    def too_large(self, signal: codec.Signal, size: int) -> Result | None:
        """The refusal of a body over the cap (counted), or None when it is within."""
        if size <= self.max_message_bytes:
            return None
        return self.reject(signal, Outcome.TOO_LARGE,
                           f"request of {size} bytes exceeds the cap of "
                           f"{self.max_message_bytes} bytes")

    def handle(self, signal: codec.Signal, body: bytes, encoding: codec.Encoding, *,
               reply_by: float | None = None) -> Result:
        """Decode, convert and export one request body (auth already checked).

        ``reply_by``: the monotonic time by which the sender needs its answer (a gRPC
        client's deadline). Such a request is *held* until then for room in the span
        queues instead of being refused at once: some OTLP/gRPC exporters never retry
        (the JS one reports every gRPC error as final), so a refusal is a lost export,
        while a sender with a deadline is still there to hear a late answer. Spans the
        sinks could not take by then are answered as rejected (OTLP partial success)
        instead of being dropped after an OK.
        """
        refused = self.too_large(signal, len(body))
        if refused is not None:
            return refused
        try:
            request = codec.decode(signal, body, encoding)
        except codec.BadRequest as exc:
            return self.reject(signal, Outcome.INVALID, str(exc))
        del body  # the parsed request is all that is needed from here on
        if signal is codec.Signal.TRACES:
            assert isinstance(request, ExportTraceServiceRequest)
            return self.handle_traces(request, reply_by=reply_by)
        assert isinstance(request, ExportMetricsServiceRequest)
        return self.handle_metrics(request)

    def handle_traces(self, request: ExportTraceServiceRequest, *,
                      reply_by: float | None = None) -> Result:
        total = feed.span_count(request)
        # Pushed back before anything is accepted when the request does not fit beside
        # what is queued; a queue that is empty takes it a chunk at a time below. A
        # request with a deadline is not: its first chunk waits for room below, as later
        # chunks do.
        if reply_by is None and self._backlog_full(max(total, 1)):
            return self._refuse_full(total)
        # Room is waited for while the sender is still there to hear the answer: until
        # its own deadline (gRPC), else reply_within_s (OTLP/HTTP has no deadline).
        give_up = time.monotonic() + self.reply_within_s if reply_by is None else reply_by
        invalid = feed.Rejections()
        accepted = failed_spans = not_taken = 0
        errors: list[str] = []
        done = seen_invalid = 0
        for chunk, wire in feed.chunks(request, self._chunk_size(), invalid):
            chunk_invalid, seen_invalid = invalid.count - seen_invalid, invalid.count
            if chunk:
                # The first chunk waits briefly (FIRST_CHUNK_WAIT_S), then the sender is
                # pushed back (retry) before anything of its request is accepted; later
                # chunks wait for room while the sender can still hear the answer.
                held = done or reply_by is not None
                failed = self._feed_spans(chunk, give_up if held else min(
                    give_up, time.monotonic() + FIRST_CHUNK_WAIT_S))
                if failed is None:
                    if not done:  # counted once, as a refused request; the sender retries
                        return self._refuse_full(len(chunk))
                    not_taken = total - done - chunk_invalid
                    break
                if failed:
                    failed_spans += len(chunk)
                    if failed not in errors:
                        errors.append(failed)
                else:
                    accepted += len(chunk)
            done += wire
        self._count_declared(request)
        rejected = invalid.count + failed_spans
        if invalid.count:
            self._ledger.record("spans", LEDGER_SINK, DropReason.INVALID.value, invalid.count)
        if not_taken:
            # Spans of this request the sinks never saw (rejected ones past the stop
            # included): refused, told to the sender, counted here.
            rejected = invalid.count + failed_spans + not_taken
            self._ledger.record("spans", LEDGER_SINK, REASON_BUSY, not_taken)
            errors.append(f"{not_taken} of {total} spans not taken: the span queue stayed "
                          "full until the answer was due; send them again later")
            _log.info("OTLP trace request: %d of %d spans not taken (queue full)",
                      not_taken, total)
        message = "; ".join(m for m in (invalid.message, *errors) if m)
        self._count(codec.Signal.TRACES, Outcome.OK, accepted=accepted, rejected=rejected)
        return Result(Outcome.OK, message,
                      codec.response(codec.Signal.TRACES, rejected, message))

    def handle_metrics(self, request: ExportMetricsServiceRequest) -> Result:
        batch = decode.metrics_from_request(request)
        rejected, message = batch.rejected, batch.error_message
        if rejected:
            self._ledger.record("metric_points", LEDGER_SINK, DropReason.INVALID.value, rejected)
        accepted = batch.points
        if batch.points:
            failed = self._export_metrics(batch.data, batch.points)
            if failed:
                rejected += batch.points
                accepted = 0
                message = "; ".join(m for m in (message, failed) if m)
        self._count(codec.Signal.METRICS, Outcome.OK, accepted=accepted, rejected=rejected)
        return Result(Outcome.OK, message,
                      codec.response(codec.Signal.METRICS, rejected, message))

    def _backlog_full(self, spans: int) -> bool:
        """Whether a span exporter that says how full it is (``backlog()``: spans
        queued, capacity; the Rerun exporter) cannot take ``spans`` more now. A queue
        that is empty takes any request (what does not fit is counted there)."""
        for exporter in self.span_exporters:
            backlog = getattr(exporter, "backlog", None)
            got = backlog() if callable(backlog) else None
            if isinstance(got, tuple) and len(got) == 2 and all(type(x) is int for x in got):
                queued, capacity = got
                if queued > 0 and queued + spans > capacity:
                    return True
        return False

    def _cannot_take(self, spans: list[ReadableSpan]) -> bool:
        """Whether a span exporter that can tell (``can_take``: the Rerun exporter, in
        spans and in estimated bytes) cannot queue ``spans`` now; else the count alone."""
        for exporter in self.span_exporters:
            can_take = getattr(exporter, "can_take", None)
            got = can_take(spans) if callable(can_take) else None
            if got is False:
                return True
        return self._backlog_full(len(spans))

    def _refuse_full(self, spans: int) -> Result:
        # A sender that outpaces the drawing is told to retry (UNAVAILABLE / 503 with a
        # retry hint, as for a busy receiver) rather than have its spans dropped by a
        # full queue: an OTLP exporter retries, so a burst is drawn late, not lost.
        what = f"{spans} spans" if spans else "spans"
        return self.reject(codec.Signal.TRACES, Outcome.BUSY,
                           f"the span queue cannot take {what} now, retry later")

    def _chunk_size(self) -> int:
        """Spans per chunk: at most a quarter of the smallest sink queue that says its
        capacity, so a chunk always fits beside what is queued."""
        size = feed.CHUNK_SPANS
        for exporter in self.span_exporters:
            backlog = getattr(exporter, "backlog", None)
            got = backlog() if callable(backlog) else None
            if isinstance(got, tuple) and len(got) == 2 and type(got[1]) is int:
                size = min(size, max(1, got[1] // 4))
        return size

    def _feed_spans(self, spans: list[ReadableSpan], wait_until: float | None) -> str | None:
        """Export one chunk once every sink can take it, waiting for room until
        ``wait_until`` (None: not at all). None when the room never came."""
        while True:
            with self._export_lock:
                if not self._cannot_take(spans):
                    return self._export_spans(spans)
            if wait_until is None or time.monotonic() >= wait_until \
                    or self._stopping.is_set():
                return None
            time.sleep(QUEUE_POLL_S)

    # Returns an error message when every sink failed (the items are then lost for good
    # and reported as rejected); a sink that fails while another succeeds is only counted.
    # Called under the export lock, once the sinks said they can take the spans.
    def _export_spans(self, spans: list[ReadableSpan]) -> str:
        if not self.span_exporters:
            return ""
        errors: list[str] = []
        for exporter in self.span_exporters:
            try:
                ok = exporter.export(spans) is SpanExportResult.SUCCESS
                why = "export failed"
            except Exception as exc:
                ok, why = False, f"{type(exc).__name__}: {exc}"
                _log.exception("span exporter %s raised", type(exporter).__name__)
            if not ok:
                name = type(exporter).__name__
                self._ledger.record("spans", f"{LEDGER_SINK}:{name}",
                                    DropReason.EXPORT_FAILED.value, len(spans))
                errors.append(f"{name}: {why}")
        return "; ".join(errors) if len(errors) == len(self.span_exporters) else ""

    def _export_metrics(self, data: MetricsData, points: int) -> str:
        if not self.metric_exporters:
            return ""
        errors: list[str] = []
        with self._export_lock:
            for exporter in self.metric_exporters:
                try:
                    result = exporter.export(data, timeout_millis=EXPORT_TIMEOUT_MS)
                    ok = result is MetricExportResult.SUCCESS
                    why = "export failed"
                except Exception as exc:
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                    _log.exception("metric exporter %s raised", type(exporter).__name__)
                if not ok:
                    name = type(exporter).__name__
                    self._ledger.record("metric_points", f"{LEDGER_SINK}:{name}",
                                        DropReason.EXPORT_FAILED.value, points)
                    errors.append(f"{name}: {why}")
        return "; ".join(errors) if len(errors) == len(self.metric_exporters) else ""

    # ── bookkeeping ─────────────────────────────────────────────────────────────────

    def _count(self, signal: codec.Signal, outcome: Outcome, accepted: int = 0,
               rejected: int = 0) -> None:
        with self._stats_lock:
            self._requests[(signal.value, outcome.value)] += 1
            item = _ITEM_SIGNAL[signal]
            self._items[f"{item}_accepted"] += accepted
            self._items[f"{item}_rejected"] += rejected

    def _count_declared(self, request: ExportTraceServiceRequest) -> None:
        """What the senders say they dropped before sending (OTLP ``dropped_*_count``,
        e.g. span events beyond their SDK's limit): lost upstream, never received, so
        only reported, under ``sender_dropped.*`` in :meth:`stats`."""
        # Plain sums (a Counter update per span and kind was ~1 µs a span of serve's CPU).
        events = attributes = links = event_attributes = 0
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for pb in ss.spans:
                    events += pb.dropped_events_count
                    attributes += pb.dropped_attributes_count
                    links += pb.dropped_links_count
                    for e in pb.events:
                        event_attributes += e.dropped_attributes_count
        declared = {"span_events": events, "span_attributes": attributes,
                    "span_links": links, "event_attributes": event_attributes}
        if events or attributes or links or event_attributes:
            with self._stats_lock:
                for what, n in declared.items():
                    if n:
                        self._items[f"{SENDER_DROPPED}{what}"] += n

    def stats(self) -> dict[str, int]:
        """Counts so far: ``requests.<signal>.<outcome>`` and ``<items>_accepted|rejected``."""
        with self._stats_lock:
            out = {f"requests.{s}.{o}": n for (s, o), n in self._requests.items()}
            out.update(self._items)
            return out

    def shutdown(self) -> None:
        with self._export_lock:
            exporters: list[SpanExporter | MetricExporter] = [*self.span_exporters,
                                                              *self.metric_exporters]
            for exp in exporters:
                try:
                    exp.shutdown()
                except Exception:
                    _log.exception("exporter %s failed to shut down", type(exp).__name__)
