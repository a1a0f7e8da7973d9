"""One byte budget shared by the export process's queues (issue 29, decision 6): what
one queue does not hold another may use, a reserve stays its holder's, and each queue
counts what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.ledger import DropLedger
from otel_proofscope.pipeline.budget import ByteBudget
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor, estimate_bytes
from otel_proofscope.rerun.backlog import PackedBacklog
from otel_proofscope.rerun.sink import RerunSink
from otel_proofscope.rerun.target import parse_target
from tests.test_rerun_backlog import _frames, _Gate, _proof


class _Held:
    def __init__(self) -> None:
        self.bytes = 0


def test_a_reserve_is_kept_for_its_holder() -> None:
    budget = ByteBudget(100)
    view, otlp = _Held(), _Held()
    view_share = budget.share(lambda: view.bytes, reserve=30)
    otlp_share = budget.share(lambda: otlp.bytes)
    assert otlp_share.room() == 70 and view_share.room() == 100
    otlp.bytes = 70
    assert otlp_share.room() == 0  # the view's 30 are not for it
    assert view_share.room() == 30
    view.bytes = 50  # past its reserve, it takes what is free
    otlp.bytes = 40
    assert view_share.room() == 10 and otlp_share.room() == 10
    assert budget.held() == 90


def test_bad_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 1 byte"):
        ByteBudget(0)
    with pytest.raises(ValueError, match="within the budget"):
        ByteBudget(10).share(lambda: 0, reserve=11)


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-40, 60)), max_size=60),
       st.integers(0, 100))
def test_queues_that_ask_first_never_hold_more_than_the_budget(
        steps: list[tuple[int, int]], reserve: int) -> None:
    """Whatever the order, queues that admit only what ``room()`` allows hold at most
    the limit together, and a reserved holder can always take its unused reserve."""
    budget = ByteBudget(100)
    held = [_Held(), _Held(), _Held()]
    shares = [budget.share(lambda h=h: h.bytes, reserve=reserve if i == 0 else 0)
              for i, h in enumerate(held)]
    reserve = min(reserve, 100)
    for who, delta in steps:
        h, share = held[who], shares[who]
        if delta < 0:
            h.bytes = max(0, h.bytes + delta)
        elif delta <= share.room():
            h.bytes += delta
        assert budget.held() <= budget.limit
        assert shares[0].room() >= reserve - held[0].bytes


class _Never(SpanExporter):
    """A collector that never answers within the test (the batch stays in flight)."""

    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None


def test_the_otlp_queue_stops_at_what_the_budget_leaves_it() -> None:
    spans = _proof(40)
    size = estimate_bytes(spans[0])
    budget = ByteBudget(size * 10)
    other = _Held()
    budget.share(lambda: other.bytes, reserve=size * 6)  # the view's reserve
    ledger = DropLedger()
    proc = BoundedBatchSpanProcessor(_Never(), sink="otlp", ledger=ledger, budget=budget,
                                     schedule_delay_s=60, max_batch_size=10_000)
    try:
        for span in spans[:10]:
            proc.on_end(span)
        kept = 10 - ledger.total(signal="spans", sink="otlp", reason="queue_full")
        # The first always fits (an empty queue takes anything); then up to 4 spans'
        # worth: the whole budget less the reserve (estimates vary a little by span).
        assert 3 <= kept <= 5
    finally:
        proc.shutdown(100)


def test_the_backlog_refuses_a_frame_the_budget_has_no_room_for() -> None:
    gate, ledger = _Gate(), DropLedger()
    frames = _frames(_proof(6), 1)
    otlp = _Held()
    budget = ByteBudget(len(frames[0][1]) * 3)
    budget.share(lambda: otlp.bytes)
    backlog = PackedBacklog(gate, ledger, poll_s=0.001, budget=budget)
    otlp.bytes = len(frames[0][1]) * 2  # a dead collector holds two thirds
    for batch, payload in frames:
        backlog.submit(batch, payload)
    assert backlog.peak_bytes <= len(frames[0][1]) * 1.2  # one frame (sizes vary a little)
    assert ledger.total(signal="spans", sink="rerun", reason="queue_full") >= 4
    gate.open.set()
    assert backlog.drain(5.0)
    backlog.close(1.0)


def test_the_rerun_queue_keeps_its_reserve_against_the_others(tmp_path: object) -> None:
    spans = _proof(20)
    size = estimate_bytes(spans[0])
    budget = ByteBudget(size * 30)
    otlp = _Held()
    budget.share(lambda: otlp.bytes)
    sink = RerunSink(parse_target("off"), queue_bytes=size * 8, budget=budget,
                     budget_reserve=size * 8, ledger=DropLedger())
    otlp.bytes = size * 22  # all the others may hold
    assert sink.fits(spans) >= 7  # its own reserve: ~8 spans (estimates vary a little)
    otlp.bytes = size * 29  # an overshoot by the others still leaves the reserve
    assert sink.fits(spans) >= 7


def test_the_rerun_queue_takes_no_more_than_the_budget_leaves() -> None:
    spans = _proof(30)
    size = estimate_bytes(spans[0])
    budget = ByteBudget(size * 30)
    otlp = _Held()
    budget.share(lambda: otlp.bytes)
    sink = RerunSink(parse_target("off"), queue_bytes=size * 25, budget=budget,
                     budget_reserve=size * 2, ledger=DropLedger())
    assert sink.fits(spans) >= 24  # its own bound (estimates vary a little by span)
    otlp.bytes = size * 25
    assert 4 <= sink.fits(spans) <= 6  # what the budget leaves: ~5 spans
