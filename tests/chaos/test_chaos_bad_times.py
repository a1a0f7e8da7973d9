"""Issue 28 item 4: one span with a time OTLP cannot carry (start -5, end >= 2**64, an
event at -3, a float) among 50 good ones. Before: the protobuf encoder raised and all 51
were lost (gRPC, HTTP, the export process); the JSON file route wrote "-5" and said it
dropped nothing. Now every route refuses that one span, counts it (``invalid``) and
delivers the other 50."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_fast_otlp import _GrpcReceiver, _HttpReceiver

from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp.encode import encode_export_request
from otel_proofscope.otlp.encode_json import encode_json_line
from otel_proofscope.otlp.times import InvalidSpan, check_times, time_ok
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter
from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.rerun.span_wire import pack_spans, pack_spans_full, unpack_spans

pytestmark = pytest.mark.chaos

# Times OTLP cannot carry: negative, 2**64 and beyond, floats (even integral ones).
BAD = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64, max_value=2**200),
                st.floats(allow_nan=False, min_value=1.0, max_value=1e30))
WHERE = st.sampled_from(["start", "end", "event"])


def _batch(bad: Any, where: str, position: int) -> list[ReadableSpan]:
    """50 good spans (with an event each) and one bad one at ``position``."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "prover"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    good: list[ReadableSpan] = []
    for i in range(50):
        with tracer.start_as_current_span(f"layer{i}") as span:
            span.add_event("round", {"i": i})
    good = list(memory.get_finished_spans())
    memory.clear()
    span = tracer.start_span("bad", start_time=bad if where == "start" else None)
    if where == "event":
        span.add_event("round", timestamp=bad)
    span.end(end_time=bad if where == "end" else None)
    (victim,) = memory.get_finished_spans()
    return [*good[:position], victim, *good[position:]]


def _names_pb(body: bytes) -> list[str]:
    request = ExportTraceServiceRequest.FromString(body)
    return [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _names_json(line: str | None) -> list[str]:
    assert line is not None
    doc = json.loads(line)
    return [s["name"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
            for s in ss["spans"]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad=BAD, where=WHERE, position=st.integers(0, 50))
def test_every_encoder_refuses_the_one_span(bad: Any, where: str, position: int) -> None:
    spans = _batch(bad, where, position)
    good = [s.name for s in spans if s.name != "bad"]
    for encode, names in ((encode_export_request, _names_pb),
                          (encode_json_line, _names_json)):
        refused: list[ReadableSpan] = []
        assert names(encode(spans, refused)) == good  # type: ignore[operator]
        assert [s.name for s in refused] == ["bad"]
    for pack in (pack_spans, pack_spans_full):
        frame, refused = pack(spans)
        assert [s.name for s in refused] == ["bad"]
        assert [s.name for s in unpack_spans(frame).spans] == good
    with pytest.raises(InvalidSpan, match=r"'bad'.*not integer nanoseconds"):
        victim = next(s for s in spans if s.name == "bad")
        check_times(victim.name, victim.start_time, victim.end_time,
                    [e.timestamp for e in victim.events])


@given(value=st.integers(0, 2**64 - 1))
def test_the_whole_range_is_kept(value: int) -> None:
    assert time_ok(value)
    assert not time_ok(value - 2**64)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_delivers_fifty_and_counts_one(protocol: str) -> None:
    spans = _batch(-5, "start", 25)
    ledger = DropLedger()
    if protocol == "grpc":
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        receiver = _GrpcReceiver()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        delivered = receiver.requests
        close = lambda: server.stop(0)  # noqa: E731
    else:
        http = _HttpReceiver()
        endpoint = f"http://127.0.0.1:{http.port}/v1/traces"
        delivered = http.delivered
        close = http.close
    try:
        exporter = FastOTLPSpanExporter(endpoint, protocol=protocol, timeout=10,
                                        ledger=ledger)
        processor = BoundedBatchSpanProcessor(exporter, sink="otlp", ledger=ledger)
        for span in spans:
            processor.on_end(span)
        processor.shutdown(10_000)
    finally:
        close()
    names = [s.name for req in delivered for rs in req.resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    assert len(names) == 50 and "bad" not in names
    assert ledger.snapshot() == {k: v for k, v in ledger.snapshot().items()
                                 if k.reason == "invalid"}
    assert ledger.total(signal="spans", sink="otlp", reason="invalid") == 1
    assert processor.stats.delivered(ledger, "otlp") == (50, 50)


def test_file_route_writes_fifty_and_counts_one(tmp_path: Path) -> None:
    spans = _batch(2**64, "end", 0)
    ledger = DropLedger()
    exporter = JsonLinesSpanExporter(tmp_path / "traces.jsonl", ledger=ledger)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    exporter.shutdown()
    text = (tmp_path / "traces.jsonl").read_text()
    assert len(_names_json(text)) == 50
    assert "18446744073709551616" not in text
    assert ledger.total(signal="spans", sink="file", reason="invalid") == 1
    assert ledger.total(signal="span_events", sink="file", reason="invalid") == 0


def test_configure_report_names_the_refused_span(tmp_path: Path) -> None:
    from otel_proofscope.setup import configure

    telemetry = configure(out_dir=tmp_path, set_global=False, handle_sigterm=False)
    tracer = telemetry.tracer_provider.get_tracer("t")
    for i in range(50):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    tracer.start_span("bad", start_time=-5).end()
    report = telemetry.shutdown()
    assert report.spans_exported["file"] == 50
    assert "  1 spans → file (invalid)" in report.lines()
    lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert sum(len(_names_json(line)) for line in lines) == 50


def test_export_process_delivers_fifty_and_counts_one(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The export process: the span is refused where it is packed (span_wire), in the
    prover's process, and counted under the sinks the child serves."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    from otel_proofscope.ledger import DROPS
    from otel_proofscope.setup import configure

    receiver = _GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    try:
        telemetry = configure(out_dir=tmp_path, rerun="off", export_process=True,
                              set_global=False, handle_sigterm=False, shutdown_timeout_s=20)
        tracer = telemetry.tracer_provider.get_tracer("t")
        for i in range(50):
            with tracer.start_as_current_span(f"s{i}"):
                pass
        tracer.start_span("bad", start_time=-5).end()
        report = telemetry.shutdown()
    finally:
        server.stop(0)
    names = [s.name for req in receiver.requests for rs in req.resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    assert len(names) == 50 and "bad" not in names, report.lines()
    assert DROPS.total(signal="spans", sink="otlp", reason="invalid") == 1
    assert report.spans_exported["otlp"] == 50
