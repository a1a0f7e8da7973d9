"""The trace view's span log: one row per span, its events summarized (issue 29, decision 3).

A layer span of a real ``ProofTracer`` carries one event per sumcheck round. Those rounds
are drawn whole in the walk and its series; in the span log they are summarized on the
span's own row (how many, the first, the last). A log line or an exception keeps a row of
its own, at its own time and level. The recording is written by the real exporter and
read back from the ``.rrd``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.translate_trace import LOGS, part
from otel_proofscope.semconv import Attr, EventName, SpanName

ROUNDS = 100  # under the SDK's 128 events per span
SERVICE = "span-log"


def _record(path: Path) -> tuple[readback.Recording, str]:
    exporter = RerunSpanExporter(f"file:{path}")
    tp = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = ProofTracer(tp)
    with tracer.proof(system="gkr", layers=1), \
            tracer.layer(index=0, kind="MatMul", rounds=ROUNDS) as layer:
        for r in range(ROUNDS):
            tracer.sumcheck_round(r, [r, r + 1], r + 7)
        span = layer.span
        span.add_event(EventName.LOG, {Attr.LOG_MESSAGE: "folding the claim",
                                       Attr.LOG_LEVEL: "Warn"})
        span.add_event("exception", {"exception.type": "ValueError",
                                     "exception.message": "bad row"})
    tp.shutdown()
    return readback.read(path), f"/{LOGS}/{part(SERVICE)}"


def test_one_row_per_span_with_its_events_summarized(tmp_path: Path) -> None:
    rec, logs = _record(tmp_path / "log.rrd")
    rows = rec.rows(logs)
    texts = [r.values["TextLog:text"][0] for r in rows]
    levels = [r.values["TextLog:level"][0] for r in rows]
    # the proof, the layer, and the two events that are logs: never a row per round
    assert len(texts) == 4, texts
    [layer_row] = [t for t in texts if t.startswith(f"{SpanName.LAYER} ") and "›" not in t]
    assert f" · {ROUNDS} events, first: {EventName.SUMCHECK_ROUND} (" in layer_row
    first, last = layer_row.split(", first: ", 1)[1].split("; last: ")
    assert first.endswith(f"{Attr.SUMCHECK_ROUND}=0)"), first
    assert last.endswith(f"{Attr.SUMCHECK_ROUND}={ROUNDS - 1})"), last
    # the log line: its message and level; the exception: ERROR
    [log_row] = [(t, lv) for t, lv in zip(texts, levels, strict=True) if "folding" in t]
    assert log_row == (f"{SpanName.LAYER} › folding the claim", "WARN")
    [exc_row] = [(t, lv) for t, lv in zip(texts, levels, strict=True) if "bad row" in t]
    assert exc_row[0].startswith(f"{SpanName.LAYER} › exception · ") and exc_row[1] == "ERROR"
    # the rounds are drawn whole elsewhere: the walk's own rows and series
    assert any(p.startswith("/gkr/") for p in rec.paths())


def test_a_single_event_is_shown_whole(tmp_path: Path) -> None:
    path = tmp_path / "one.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    tp = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    with tp.get_tracer("t").start_as_current_span("prove_shard") as span:
        span.add_event("shard.checkpoint", {"rows": 4096})
    tp.shutdown()
    rec = readback.read(path)
    [text] = [r.values["TextLog:text"][0] for r in rec.rows(f"/{LOGS}/{part(SERVICE)}")]
    assert text.startswith("prove_shard ") and text.endswith(
        " · 1 event: shard.checkpoint (rows=4096)"), text
