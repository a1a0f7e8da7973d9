"""One span with end_time = 2**64-1 (valid on the OTLP wire) is refused and counted
alone; the rest of its batch, other provers' spans included, is drawn."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from test_rerun_sink import spans

from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.sink import WALK_SIGNAL, RerunSink
from otel_proofscope.rerun.target import parse_target

pytestmark = pytest.mark.chaos


def poisoned(span: ReadableSpan, **times: int) -> ReadableSpan:
    return ReadableSpan(name=span.name, context=span.context, parent=span.parent,
                        resource=span.resource, attributes=span.attributes,
                        events=span.events, kind=span.kind, status=span.status,
                        start_time=times.get("start", span.start_time),
                        end_time=times.get("end", span.end_time),
                        instrumentation_scope=span.instrumentation_scope)


@pytest.mark.parametrize("times", [{"end": 2**64 - 1}, {"start": 2**63}, {"end": -1}])
def test_poison_span_is_isolated(tmp_path: Path, times: dict[str, int]) -> None:
    first, second = spans(2), spans(3)  # two provers' proofs, one coalesced batch
    victim = first[0]
    bad = poisoned(victim, **times)
    rrd = tmp_path / "p.rrd"
    sink = RerunSink(parse_target(f"file:{rrd}"))
    sink.submit_spans([bad, *first[1:]])
    sink.submit_spans(second)
    assert sink.flush(30)
    sink.close(10)
    assert DROPS.total(signal="spans", sink="rerun", reason="invalid") == 1
    assert DROPS.total(signal="span_events", sink="rerun", reason="invalid") == len(bad.events)
    assert DROPS.total(reason="export_failed") == 0
    assert sink.stats.spans_translated == len(first) - 1 + len(second)
    proofs = {p for p in readback.read(rrd).paths() if p.startswith("/proof/progress/")}
    assert len(proofs) == 2, proofs


def test_unforeseen_translation_error_costs_only_its_span(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    batch = spans(3)
    victim = batch[1]
    sink = RerunSink(parse_target(f"file:{tmp_path / 'u.rrd'}"))
    real = sink.spans.translate

    def fragile(group, frame, *, witness=False):  # type: ignore[no-untyped-def]
        if any(s is victim for s in group):
            raise OverflowError("Python int too large to convert to C long")
        return real(group, frame, witness=witness)

    monkeypatch.setattr(sink.spans, "translate", fragile)
    sink.submit_spans(batch)
    assert sink.flush(30)
    sink.close(10)
    # The walk refuses only the victim (counted); the trace view still draws all three.
    assert DROPS.total(signal=WALK_SIGNAL, sink="rerun", reason="invalid") == 1
    assert DROPS.total(signal="spans") == 0
    assert DROPS.total(reason="export_failed") == 0
    assert sink.stats.spans_translated == len(batch) - 1
    assert sink.stats.spans_drawn == len(batch)
