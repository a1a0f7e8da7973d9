"""The per-span event limit keeps the first rounds (round 0 anchors the claim chain) and
counts the dropped newest ones; the SDK on its own drops the oldest."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import instrumentation
from otel_proofscope.ledger import DROPS
from otel_proofscope.pipeline.privacy import local
from otel_proofscope.semconv import Attr, EventName, SpanName
from otel_proofscope.setup import configure

pytestmark = pytest.mark.chaos


def test_round_zero_survives_the_event_limit(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    t = configure(out_dir=tmp_path, set_global=False, rerun="off", max_events_per_span=80,
                  span_exporters=[("memory", local(memory))])
    try:
        with t.tracer.proof(system="gkr"), t.tracer.layer(index=0, kind="MatMul", rounds=200):
            for r in range(200):
                t.tracer.sumcheck_round(r, poly=[1, 2], claim=3)
        t.force_flush(5)
    finally:
        t.shutdown()
        instrumentation.set_max_events_per_span(None)
    layer = next(s for s in memory.get_finished_spans() if s.name == SpanName.LAYER)
    rounds = [e.attributes[Attr.SUMCHECK_ROUND] for e in layer.events
              if e.name == EventName.SUMCHECK_ROUND]
    assert rounds[0] == 0 and rounds == list(range(len(rounds)))  # the first ones, in order
    assert len(rounds) == 80 - 80 // 8
    assert DROPS.total(signal="span_events", reason="span_limit") == 200 - len(rounds)
    assert layer.dropped_events == 0  # nothing left for the SDK to drop silently
