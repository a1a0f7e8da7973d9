"""Issue 28 item 7: the whole-request deadline measures the client, never serve's own
decode and export. A valid request that takes serve longer than the deadline to
process is answered once, OK, and counted once: never also as a timeout, and the
client never sees its connection cut (a retrying exporter would send it again)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.ledger import DROPS

pytestmark = pytest.mark.chaos

DEADLINE_S = 1.0
PROCESS_S = 2.5  # serve's own work on the request: well past the client's deadline


class Slow(SpanExporter):
    """A sink that takes PROCESS_S per batch (a loaded machine decoding 4 MB)."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        time.sleep(PROCESS_S)
        self.batches.append(len(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_a_request_slow_to_process_is_answered_not_cut_off() -> None:
    sink = Slow()
    receiver = OtlpReceiver([sink], [], grpc_port=None, http_port=0,
                            request_deadline_s=DEADLINE_S)
    receiver.start()
    try:
        results: list[SpanExportResult] = []
        exporter = HttpSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces",
                                    timeout=10)

        class Rec(SpanExporter):
            def export(self, spans):  # type: ignore[no-untyped-def]
                results.append(exporter.export(spans))
                return results[-1]

            def shutdown(self) -> None:
                exporter.shutdown()

        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(Rec()))
        start = time.monotonic()
        with tp.get_tracer("t").start_as_current_span("big"):
            pass
        took = time.monotonic() - start
        tp.shutdown()
        stats = receiver.stats()
    finally:
        receiver.stop()
    assert results == [SpanExportResult.SUCCESS]
    assert took >= PROCESS_S
    assert sink.batches == [1]  # received and exported once: no resend after a cut
    assert stats.get("requests.traces.timeout", 0) == 0, stats
    assert stats["requests.traces.ok"] == 1 and stats["spans_accepted"] == 1
    assert DROPS.total(reason="timeout") == 0
