"""Witness data never leaves the process through an extra exporter unless it is marked
local explicitly; the withheld count is exact per sink and never counted as exported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import semconv
from otel_proofscope.instrumentation import ActivationStats
from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.pipeline.privacy import local
from otel_proofscope.setup import configure

pytestmark = pytest.mark.chaos


def test_backup_exporter_gets_no_witness_and_counts_are_per_sink(tmp_path: Path) -> None:
    received = InMemorySpanExporter()
    receiver = OtlpReceiver([received], [], grpc_port=None, http_port=0)
    receiver.start()
    mine = InMemorySpanExporter()
    try:
        t = configure(out_dir=tmp_path, set_global=False, capture_witness=True, rerun="off",
                      span_exporters=[
                          ("backup", OTLPSpanExporter(
                              endpoint=f"{receiver.http_endpoint}/v1/traces", timeout=5)),
                          ("mine", local(mine))])
        with t.tracer.proof(system="gkr"), t.tracer.layer(index=0, kind="Attention"):
            t.tracer.sumcheck_round(0, poly=[1, 2], claim=3)
            t.tracer.layer_activation(ActivationStats(0.5, 0.1, 0.0, 1.0, 0.2, [0.3]))
            t.tracer.attention_heatmap(0, 1, [[0.5, 0.5], [0.1, 0.9]])
        report = t.shutdown()
    finally:
        receiver.stop()
    backup = [e.name for s in received.get_finished_spans() for e in s.events]
    assert backup == [semconv.EventName.SUMCHECK_ROUND], backup
    assert sorted(e.name for s in mine.get_finished_spans() for e in s.events) == sorted(
        [semconv.EventName.SUMCHECK_ROUND, *semconv.WITNESS_EVENTS])
    files = [e["name"] for line in (tmp_path / "traces.jsonl").read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"] for e in s.get("events", [])]
    assert files == [semconv.EventName.SUMCHECK_ROUND]
    assert report.witness_by_sink == {"file": 2, "backup": 2}
    assert report.witness_events_withheld == 4
    # withheld events are not exported events
    assert report.events_exported == {"file": 1, "backup": 1, "mine": 3}
    assert "witness events kept out of OTLP: 4 (backup: 2, file: 2)" in report.lines()
