"""What the trace view keeps per span (issue 29, decision 6).

A span that waits for its parent, and a span placed (kept for later children and
redraws), are what one large trace keeps: 200,000 spans of one proof against a dead
collector grew the export process past its +64 MB budget. Spans here come as from the
wire: each with its own trace-id int and its own copy of the same names.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections import Counter
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from otel_proofscope.rerun import translate_trace
from otel_proofscope.rerun.columns import Frame
from otel_proofscope.rerun.translate_trace import FLAME, TraceTranslator, _Pending, _Queue

T0 = 1_700_000_000_000_000_000
TRACE = 0x0123456789ABCDEF0123456789ABCDEF


def _wire_span(span_id: int, parent: int | None, start: int, end: int) -> ReadableSpan:
    """A span whose ints and strings are its own objects, as a decoder makes them."""
    fresh = int.from_bytes(TRACE.to_bytes(16, "big"), "big")
    ctx = SpanContext(fresh, span_id, is_remote=False, trace_flags=TraceFlags(1))
    par = None if parent is None else SpanContext(
        int.from_bytes(TRACE.to_bytes(16, "big"), "big"), parent, is_remote=False)
    return ReadableSpan(name="".join(["proof.", "layer"]), context=ctx, parent=par,
                        start_time=start, end_time=end,
                        resource=Resource({"service.name": "".join(["pro", "ver"])}))


def test_waiting_and_placed_spans_of_one_large_trace_cost_little(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(translate_trace, "SEND_ROWS", 1024)
    n, batch = 6_000, 500
    tr = TraceTranslator(wait_s=600.0)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(0, n, batch):  # children first (they end first), freed as sent
            tr.translate([_wire_span(k + 2, 1, T0 + 10 * k, T0 + 10 * k + 5)
                          for k in range(i, i + batch)], Frame(), now=1.0)
        gc.collect()
        waiting = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.reset_peak()
        frame = Frame()
        tr.translate([_wire_span(1, None, T0, T0 + 10 * n)], frame, now=2.0)
        frame.sends()  # what the sink does with it: the columns, built
        peak = tracemalloc.get_traced_memory()[1] - base - waiting
        del frame
        gc.collect()
        placed = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert (tr.pending, tr._placed) == (0, n + 1)
    # tracemalloc, CPython 3.11: 411 B a waiting span, 407 B a placed one, a redraw
    # peak of 168 B a span; before (an OrderedDict queue, a redraw built whole as
    # tuples, ids and names kept per span) 612, 591 and 534.
    assert waiting / n < 500, f"{waiting / n:.0f} B a waiting span"
    assert placed / n < 500, f"{placed / n:.0f} B a placed span"
    assert peak / n < 350, f"{peak / n:.0f} B a span at the redraw's peak"


def test_orphans_of_a_frozen_lane_keep_only_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proof whose root ends last, larger than the wait: its spans are drawn early, and
    past the lane's redraw cap (frozen) they are never moved, so the lane keeps how many
    wait for that parent, not each span (~250 bytes as ``Placed``; the
    200,000-span proof of decision 6 held ~100,000 of them until its root came)."""
    from otel_proofscope.rerun import flame

    monkeypatch.setattr(flame, "MAX_GROUP_SPANS", 1_000)
    n, batch = 12_000, 500
    tr = TraceTranslator(wait_s=600.0, max_pending=100)
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(0, 2_000, batch):  # past the lane cap: frozen
            tr.translate([_wire_span(k + 2, 1, T0 + 10 * k, T0 + 10 * k + 5)
                          for k in range(i, i + batch)], Frame(), now=1.0)
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for i in range(2_000, n, batch):
            tr.translate([_wire_span(k + 2, 1, T0 + 10 * k, T0 + 10 * k + 5)
                          for k in range(i, i + batch)], Frame(), now=1.0)
        gc.collect()
        per_span = (tracemalloc.get_traced_memory()[0] - base) / (n - 2_000)
    finally:
        tracemalloc.stop()
    issues = tr.translate([_wire_span(1, None, T0, T0 + 10 * n)], Frame(), now=2.0)
    # every orphan's parent came: none is an orphan now; drawn early one row under the
    # top, they were where a child of the root goes, frozen or not
    assert issues.orphans == -(n - 100)
    assert (issues.late, issues.stranded) == (n - 100, 0)
    assert per_span < 80, per_span  # the row code, the id filter and the count


def _rows(frame: Frame) -> Counter[tuple[Any, ...]]:
    """Every flame row of a frame, whichever send carries it: (path, time, values)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for s in frame.sends():
        if not s.path.startswith(FLAME) or not s.indexes:
            continue
        times = s.indexes[0].as_arrow_array().cast("int64").to_pylist()
        cols = {str(c.component_descriptor()): c.as_arrow_array().to_pylist()
                for c in s.columns}
        for i, t in enumerate(times):  # a send without in-box labels has no Points2D
            out[(s.path, t, *(f"{k}={v[i]!r}" for k, v in sorted(cols.items())
                              if v[i] not in (None, [])))] += 1
    return out


def test_a_lane_sent_in_parts_draws_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    spans = [_wire_span(i + 2, 1, T0 + 10 * i, T0 + 10 * i + 5) for i in range(23)]
    spans.append(_wire_span(1, None, T0, T0 + 1_000))

    def draw() -> tuple[Counter[tuple[Any, ...]], int]:
        frame = Frame()
        tr = TraceTranslator(wait_s=600.0)
        tr.translate(spans[:10], frame, now=1.0)
        tr.translate(spans[10:], frame, now=1.0)  # the root: a redraw of every span
        return _rows(frame), sum(1 for s in frame.sends() if s.path.startswith(FLAME))

    whole, sends = draw()
    monkeypatch.setattr(translate_trace, "SEND_ROWS", 5)
    parts, part_sends = draw()
    assert sum(whole.values()) == 24 and parts == whole
    assert part_sends > sends  # it was cut into parts


def test_the_waiting_queue_keeps_order_and_few_dead_entries() -> None:
    q = _Queue()
    items = [_Pending(None, float(i), i) for i in range(5_000)]  # type: ignore[arg-type]
    for p in items:
        q.push(p)
    for p in items[1:]:  # all but the head stop waiting: none reaches the head
        q.remove(p)
    assert len(q) == 1 and q.head() is items[0]
    assert len(q._items) <= 2 * len(q) + 1024  # the dead ones were dropped
    q.remove(items[0])
    q.remove(items[0])  # twice: counted once
    assert len(q) == 0 and q.head() is None and list(q) == []


def _single(trace: int, service: str) -> ReadableSpan:
    ctx = SpanContext(trace, 1, is_remote=False, trace_flags=TraceFlags(1))
    return ReadableSpan(name="work", context=ctx, parent=None, start_time=T0 + trace,
                        end_time=T0 + trace + 500, resource=Resource({"service.name": service}))


def test_the_span_log_of_many_traces_takes_one_entity_per_service(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 11: the Rerun SDK keeps native memory for every entity path it has
    seen, so the log rows of a long session's traces share their service's entity."""
    tr = TraceTranslator(wait_s=600.0)
    frame = Frame()
    tr.translate([_single(t + 1, f"svc-{t % 3}") for t in range(300)], frame, now=1.0)
    logs = [s for s in frame.sends() if s.path.startswith("trace/logs/")]
    assert sorted(s.path for s in logs) == [f"trace/logs/svc-{i}" for i in range(3)]
    assert sum(s.rows for s in logs) == 300  # every span's row, in its service's log
    monkeypatch.setattr(translate_trace, "MAX_LOG_SERVICES", 2)
    tr = TraceTranslator(wait_s=600.0)
    frame = Frame()
    issues = tr.translate([_single(t + 1, f"svc-{t % 3}") for t in range(30)], frame,
                          now=1.0)
    paths = {s.path for s in frame.sends() if s.path.startswith("trace/logs/")}
    assert paths == {"trace/logs/svc-0", "trace/logs/svc-1", "trace/logs/_other"}
    assert issues.capped["trace_log_services"] == 10
