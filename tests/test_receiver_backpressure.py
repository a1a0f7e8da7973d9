"""A full span queue (the Rerun sink's) makes the receiver ask the sender to retry."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.integrations.otlp_receiver import codec
from otel_proofscope.integrations.otlp_receiver.core import LEDGER_SINK, Ingest, Outcome
from otel_proofscope.ledger import DropLedger
from otel_proofscope.rerun.sink import RerunSink
from otel_proofscope.rerun.target import parse_target


class Queue(InMemorySpanExporter):
    """An exporter with a bounded queue that says how full it is."""

    def __init__(self, queued: int, capacity: int) -> None:
        super().__init__()
        self.queued, self.capacity = queued, capacity

    def backlog(self) -> tuple[int, int]:
        return self.queued, self.capacity

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.queued += len(spans)
        return super().export(spans)


def _body(n: int) -> bytes:
    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    return bytes(encode_spans(memory.get_finished_spans()).SerializeToString())


@settings(deadline=None)
@given(st.integers(0, 20), st.integers(1, 20), st.integers(1, 8))
def test_refused_exactly_when_the_queue_cannot_take_the_request(
        queued: int, capacity: int, n: int) -> None:
    queued = min(queued, capacity)
    ledger = DropLedger()
    queue = Queue(queued, capacity)  # never drains
    ingest = Ingest([queue], ledger=ledger, reply_within_s=0.05)
    result = ingest.handle(codec.Signal.TRACES, _body(n), codec.Encoding.PROTOBUF)
    full = queued > 0 and queued + n > capacity
    if full:
        assert result.outcome is Outcome.BUSY
        assert queue.get_finished_spans() == ()
        assert ledger.total() == 1  # the request, once, as queue_full; no spans counted
        assert ingest.stats().get("spans_accepted", 0) == 0
    elif queued + n <= capacity:
        assert result.outcome is Outcome.OK
        assert len(queue.get_finished_spans()) == n
        assert ledger.total() == 0
        assert ingest.stats()["spans_accepted"] == n
    else:
        # An empty queue smaller than the request: it is handed only what it takes
        # (chunk by chunk), the rest is refused in the answer (OTLP partial success)
        # and counted, never dropped behind an OK.
        assert result.outcome is Outcome.OK
        taken = len(queue.get_finished_spans())
        assert 1 <= taken <= capacity
        assert queue.queued <= capacity
        response = ExportTraceServiceResponse.FromString(bytes(
            result.response.SerializeToString()))  # type: ignore[union-attr]
        assert response.partial_success.rejected_spans == n - taken
        assert "not taken" in response.partial_success.error_message
        assert ledger.total(signal="spans", reason="queue_full") == n - taken
        assert ingest.stats()["spans_accepted"] == taken
        assert ingest.stats()["spans_rejected"] == n - taken
    assert all(k.sink == LEDGER_SINK for k in ledger.snapshot())


def test_exporters_without_a_backlog_are_not_asked() -> None:
    plain = InMemorySpanExporter()
    result = Ingest([plain]).handle(codec.Signal.TRACES, _body(3), codec.Encoding.PROTOBUF)
    assert result.outcome is Outcome.OK and len(plain.get_finished_spans()) == 3


def test_the_rerun_sink_reports_its_backlog(tmp_path: object) -> None:
    sink = RerunSink(parse_target(f"file:{tmp_path}/b.rrd"), queue_size=5)
    try:
        assert sink.backlog() == (0, 5)
        with sink._cond:  # queued, not yet taken by the sender thread (not started)
            sink._queued = 3
        assert sink.backlog() == (3, 5)
    finally:
        with sink._cond:
            sink._queued = 0
        sink.close(1)
