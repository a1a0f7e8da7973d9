"""A request's first chunk waits briefly for room in a span queue before the request is
refused (issue 29, decision 5): a refusal had already cost the parse and the conversion
of that chunk, and a sink draining its queue makes room within the wait. A request with
a deadline (gRPC) is held for room until its answer is due instead."""

from __future__ import annotations

import time
from collections.abc import Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_proofscope.integrations.otlp_receiver import codec, core
from otel_proofscope.integrations.otlp_receiver.core import Ingest, Outcome
from otel_proofscope.ledger import DropLedger


class Draining:
    """A queue whose room comes ``after_s`` after the first ask (None: never)."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.first_ask: float | None = None
        self.spans: list[ReadableSpan] = []

    def can_take(self, spans: Sequence[ReadableSpan]) -> bool:
        now = time.monotonic()
        if self.first_ask is None:
            self.first_ask = now
        return self.after_s is not None and now - self.first_ask >= self.after_s

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _body(n: int) -> bytes:
    request = ExportTraceServiceRequest()
    ss = request.resource_spans.add().scope_spans.add()
    for i in range(n):
        ss.spans.append(trace_pb2.Span(trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"),
                                       name="s"))
    return request.SerializeToString()


def test_room_within_the_wait_takes_the_request_without_a_refusal() -> None:
    queue = Draining(after_s=0.25)  # a sink drawing a chunk: well inside the wait
    ingest = Ingest([queue], ledger=DropLedger())  # type: ignore[list-item]
    result = ingest.handle(codec.Signal.TRACES, _body(5), codec.Encoding.PROTOBUF)
    assert result.outcome is Outcome.OK and len(queue.spans) == 5
    assert ingest.stats().get("requests.traces.busy", 0) == 0


def test_no_room_refuses_the_request_after_the_wait_not_at_once() -> None:
    queue = Draining(after_s=None)
    ledger = DropLedger()
    ingest = Ingest([queue], ledger=ledger)  # type: ignore[list-item]
    start = time.monotonic()
    result = ingest.handle(codec.Signal.TRACES, _body(5), codec.Encoding.PROTOBUF)
    took = time.monotonic() - start
    assert result.outcome is Outcome.BUSY and queue.spans == []
    assert 0.5 <= core.FIRST_CHUNK_WAIT_S * 0.9 <= took < core.FIRST_CHUNK_WAIT_S + 2.0
    assert ledger.total() == 1  # the request, once


def test_the_wait_never_outlasts_the_senders_deadline() -> None:
    queue = Draining(after_s=None)
    ingest = Ingest([queue], ledger=DropLedger())  # type: ignore[list-item]
    start = time.monotonic()
    result = ingest.handle(codec.Signal.TRACES, _body(5), codec.Encoding.PROTOBUF,
                           reply_by=start + 0.1)
    assert result.outcome is Outcome.BUSY
    assert time.monotonic() - start < 0.5


class FullFor(Draining):
    """A queue that says it is full (``backlog()``) for ``after_s`` after the first ask."""

    def backlog(self) -> tuple[int, int]:
        now = time.monotonic()
        if self.first_ask is None:
            self.first_ask = now
        full = self.after_s is None or now - self.first_ask < self.after_s
        return (100, 100) if full else (0, 100)

    def can_take(self, spans: Sequence[ReadableSpan]) -> bool:
        return self.backlog()[0] == 0


def test_a_request_with_a_deadline_is_held_for_room_past_the_first_chunk_wait() -> None:
    # Some gRPC exporters never retry (the official JS one): a refusal would be a lost
    # export, so a sender with a deadline is held until its answer is due, not pushed back.
    for queue in (Draining(after_s=core.FIRST_CHUNK_WAIT_S + 0.5),
                  FullFor(after_s=core.FIRST_CHUNK_WAIT_S + 0.5)):
        ingest = Ingest([queue], ledger=DropLedger())  # type: ignore[list-item]
        start = time.monotonic()
        result = ingest.handle(codec.Signal.TRACES, _body(5), codec.Encoding.PROTOBUF,
                               reply_by=start + 5.0)
        assert result.outcome is Outcome.OK and len(queue.spans) == 5, type(queue)
        assert ingest.stats().get("requests.traces.busy", 0) == 0
        # without a deadline (OTLP/HTTP) the same queue pushes the sender back
        queue.first_ask, queue.spans = None, []
        result = ingest.handle(codec.Signal.TRACES, _body(5), codec.Encoding.PROTOBUF)
        assert result.outcome is Outcome.BUSY and queue.spans == [], type(queue)


def test_a_held_request_is_refused_once_its_answer_is_due() -> None:
    queue = FullFor(after_s=None)
    ledger = DropLedger()
    ingest = Ingest([queue], ledger=ledger)  # type: ignore[list-item]
    start = time.monotonic()
    result = ingest.handle(codec.Signal.TRACES, _body(5), codec.Encoding.PROTOBUF,
                           reply_by=start + 0.6)
    took = time.monotonic() - start
    assert result.outcome is Outcome.BUSY and queue.spans == []
    assert 0.6 <= took < 2.0
    assert ledger.total() == 1
