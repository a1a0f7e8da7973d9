"""The JSON-lines span file: the very lines the upstream FileSpanExporter writes, from
the span fields (round records read without building their events)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.otlp import sdk_fields
from otel_proofscope.otlp.encode_json import encode_json_line
from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter
from tests.test_fast_otlp import _make_spans, _span_plan
from tests.test_round_records import _where_events_are_built
from tests.test_span_wire_full import _prover_spans as _prover_spans_of


def _prover_spans(limits: dict[str, int]) -> list[ReadableSpan]:
    """ProofTracer spans whose round records nobody has read, a user's event among them."""
    return _prover_spans_of(limits, 3, True)


def _upstream(spans: list[ReadableSpan]) -> str | None:
    request = encode_spans(spans)
    if not request.resource_spans:
        return None
    return json.dumps(request.to_dict(), separators=(",", ":")) + "\n"


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_span_plan(), max_size=6), st.randoms(use_true_random=False))
def test_the_line_is_the_upstream_exporters_on_random_sdk_spans(
        plans: list[dict[str, Any]], rnd: random.Random) -> None:
    spans = _make_spans(plans)
    rnd.shuffle(spans)  # interleave resources and scopes within the batch
    assert encode_json_line(spans) == _upstream(spans)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([{}, {"max_events": 2}, {"max_event_attributes": 2},
                        {"max_attribute_length": 4}]))
def test_round_records_are_written_without_building_their_events(
        limits: dict[str, int]) -> None:
    spans = _prover_spans(limits)
    with _where_events_are_built() as built:
        line = encode_json_line(spans)
    layers = [s for s in spans if s.name == "proof.layer"]
    if not limits.keys() & {"max_attribute_length", "max_event_attributes"}:
        assert built == []  # (under those limits the SDK's own constructor truncates)
        assert all(sdk_fields.unbuilt_events(s) is not None for s in layers)
    assert line == _upstream(spans)  # reads span.events: the SDK's own events


def test_the_file_is_the_upstream_exporters_line_for_line(tmp_path: Path) -> None:
    batches = [_prover_spans({}), _make_spans([]), _prover_spans({"max_events": 2})]
    ours, theirs = JsonLinesSpanExporter(tmp_path / "ours.jsonl"), FileSpanExporter(
        tmp_path / "theirs.jsonl")
    for batch in batches:
        assert ours.export(batch) == SpanExportResult.SUCCESS
        assert theirs.export(batch) == SpanExportResult.SUCCESS
    ours.shutdown()
    theirs.shutdown()
    text = (tmp_path / "ours.jsonl").read_text(encoding="utf-8")
    assert text == (tmp_path / "theirs.jsonl").read_text(encoding="utf-8")
    assert len(text.splitlines()) == 2  # an empty batch writes nothing


def test_it_appends_and_refuses_a_batch_after_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text("earlier\n", encoding="utf-8")
    exporter = JsonLinesSpanExporter(path)
    assert exporter.export(_prover_spans({})) == SpanExportResult.SUCCESS
    assert exporter.force_flush()
    exporter.shutdown()
    exporter.shutdown()  # twice: harmless
    assert exporter.export(_prover_spans({})) == SpanExportResult.FAILURE
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "earlier" and len(lines) == 2
    assert json.loads(lines[1])["resourceSpans"][0]["scopeSpans"][0]["spans"]


def test_an_unencodable_attribute_is_skipped_as_upstream_does(tmp_path: Path) -> None:
    class Weird:
        pass

    keep = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(keep))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attribute("ok", 1)
    spans = list(keep.get_finished_spans())
    # The SDK refuses such values itself; a foreign ReadableSpan may still carry one.
    spans[0]._attributes = {"ok": 1, "bad": Weird(), "also": "fine"}  # type: ignore[attr-defined]
    line = encode_json_line(spans)
    assert line == _upstream(spans)
    assert line is not None and '"bad"' not in line


def test_concurrent_batches_never_interleave_within_a_line(tmp_path: Path) -> None:
    exporter = JsonLinesSpanExporter(tmp_path / "t.jsonl")
    batch = _prover_spans({})

    def write() -> None:
        for _ in range(20):
            exporter.export(batch)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exporter.shutdown()
    lines = (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 80 and all(json.loads(line) for line in lines)
