"""Arrival order never changes the flame chart; linked traces read as one tree.

* A root that arrives after its remote children were drawn without it (they waited the
  remote wait, 10 s by default, shortened here through the translator's parameter)
  takes them under it; the summary says "drawn late", never "parent never received";
  the chart's origin is the trace's earliest start (no negative x).
* Any order, any batching, any expiry: the final picture (the entities not shadowed) is
  the picture of the same spans sent parents first.
* sp1-cluster: each task's inner ``task`` span starts a new trace linked to the task
  span (and back): the linked trace is drawn under that span, in its trace's lane.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, TraceFlags

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")
from flame_helpers import live_paths, shadowed, trace_boxes

from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.columns import Frame, Send
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.flame import FLAME_WIDTH
from otel_proofscope.rerun.tally import TALLY
from otel_proofscope.rerun.translate_trace import FLAME, TraceTranslator

T0 = 1_800_000_000_000_000_000
S = 1_000_000_000
TRACE = 0xC0FFEE00_0000_0000_0000_0000_0000_0001
KEY = f"{TRACE:032x}"[:8]
EPS = 1e-3


def _span(name: str, span_id: int, parent: int | None, start: int, end: int, *,
          remote: bool = False, service: str = "app", trace_id: int = TRACE) -> ReadableSpan:
    ctx = SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED))
    par = SpanContext(trace_id, parent, remote, TraceFlags(TraceFlags.SAMPLED)) \
        if parent else None
    return ReadableSpan(name=name, context=ctx, parent=par, start_time=start, end_time=end,
                        resource=Resource({"service.name": service}))


def _late_root_trace() -> tuple[list[ReadableSpan], ReadableSpan]:
    """``proofscope run``'s own span (the root, 8.9 s, exported last) and the app it ran:
    three top-level spans whose parent is that root in another process, two children
    each."""
    app = []
    for i in range(3):
        top = 10 + 10 * i
        start = T0 + S // 2 + i * 2 * S
        app += [_span(f"phase{i}.a", top + 1, top, start, start + S // 2),
                _span(f"phase{i}.b", top + 2, top, start + S // 2, start + S),
                _span(f"phase{i}", top, 1, start, start + S + S // 4, remote=True)]
    root = _span("run", 1, None, T0, T0 + 8_900_000_000, service="proofscope-run")
    return app, root


def test_a_root_after_its_remote_children_takes_them_under_it(tmp_path: Path) -> None:
    TALLY.reset()
    path = tmp_path / "late.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    assert exporter.sink is not None
    exporter.sink.trace.remote_wait_s = 0.3  # the 10 s remote wait, as a parameter
    app, root = _late_root_trace()
    exporter.export(app)  # children first, as their processes export them
    deadline = time.monotonic() + 30
    while exporter.sink.stats.spans_drawn < 9 and time.monotonic() < deadline:
        time.sleep(0.05)
    # drawn without their parent meanwhile, as the old summary said
    assert (exporter.sink.stats.spans_drawn, exporter.sink.stats.orphans) == (9, 3)
    exporter.export([root])  # well after the remote wait
    exporter.shutdown()
    assert TALLY.summary_line(DROPS) == \
        "rerun: drawn 10 spans (3 drawn late: their parent arrived after them); not drawn 0"

    rec = readback.read(path)
    drawn = {b.name: b for svc in ("app", "proofscope-run")
             for b in trace_boxes(rec, svc, KEY)}
    assert len(drawn) == 10
    assert any(shadowed(rec, p) for p in rec.paths())  # the first layout, hidden
    run = drawn["run"]
    # the trace's earliest start at x = 0, its extent the chart's width
    assert (run.x0, run.x1) == pytest.approx((0.0, FLAME_WIDTH))
    for b in drawn.values():
        assert -EPS <= b.x0 <= b.x1 <= FLAME_WIDTH + EPS, b
        assert "orphan" not in b.label and "not received" not in b.label, b.label
    for i in range(3):
        assert drawn[f"phase{i}"].y - run.y == 1
        assert drawn[f"phase{i}.a"].y - run.y == drawn[f"phase{i}.b"].y - run.y == 2
        # x in proportion to time: phase i starts at 0.5 s + 2 s * i of 8.9 s
        assert drawn[f"phase{i}"].x0 == pytest.approx((0.5 + 2 * i) / 8.9 * FLAME_WIDTH)


# ── any order, the same picture ─────────────────────────────────────────────────────────

def _picture(sends: list[Send]) -> list[tuple[str, float, float, float]]:
    """What the viewer draws from these sends: every box of the entities not shadowed."""
    hidden = {s.path for s in sends if s.static is not None}
    out = []
    for s in sends:
        if s.static is not None or s.path in hidden or not s.path.startswith(FLAME):
            continue
        cols = {str(c.component_descriptor()): c.as_arrow_array().to_pylist()
                for c in s.columns}
        if "Boxes2D:centers" not in cols:
            continue
        for [label], [(cx, cy)], [(hw, _)] in zip(  # one box per row
                cols["Boxes2D:labels"], cols["Boxes2D:centers"], cols["Boxes2D:half_sizes"],
                strict=True):
            out.append((label, round(cx - hw, 3), round(cx + hw, 3), round(cy, 3)))
    return sorted(out)


@st.composite
def _tree(draw: st.DrawFn) -> list[ReadableSpan]:
    """A trace: each span inside its parent's interval; the root maybe exported by
    another process (its children then have a remote parent)."""
    n = draw(st.integers(2, 14))
    remote_root = draw(st.booleans())
    spans: list[tuple[int, int, int, int]] = [(1, 0, 0, 1000 * S)]  # id, parent, start, end
    for i in range(2, n + 1):
        pid, _, ps, pe = spans[draw(st.integers(0, len(spans) - 1))]
        a = draw(st.integers(ps, pe))
        b = draw(st.integers(a, pe))
        spans.append((i, pid, a, b))
    out = []
    for sid, pid, a, b in spans:
        out.append(_span(f"s{sid}", sid, pid or None, T0 + a, T0 + b,
                         remote=remote_root and pid == 1))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=_tree(), data=st.data())
def test_any_arrival_order_draws_the_picture_of_parents_first(
        spans: list[ReadableSpan], data: Any) -> None:
    reference = TraceTranslator(wait_s=1.0, remote_wait_s=0.5)
    ref = Frame()
    reference.translate(spans, ref, now=0.0)
    reference.drain(ref)
    want = _picture(ref.sends())

    order = data.draw(st.permutations(spans))
    # a small wait overflows: spans drawn early, one row under the top, moved later
    tr = TraceTranslator(wait_s=1.0, remote_wait_s=0.5,
                         max_pending=data.draw(st.sampled_from([1, 2, 3, 32768])))
    sends: list[Send] = []
    now, i, drawn, late, orphans = 0.0, 0, 0, 0, 0
    while i < len(order):
        k = data.draw(st.integers(1, len(order) - i))
        frame = Frame()
        got = tr.translate(order[i:i + k], frame, now=now)
        i += k
        now += data.draw(st.sampled_from([0.0, 0.3, 2.0]))  # some expire, drawn early
        expired = tr.expire(now, frame)
        sends += frame.sends()
        live = _picture(sends)  # at every moment: origin at the earliest start drawn
        if live:
            assert min(x0 for _, x0, _, _ in live) == 0
            assert all(x0 >= 0 and x1 <= FLAME_WIDTH + EPS for _, x0, x1, _ in live)
        for issues in (got, expired):
            drawn, late, orphans = (drawn + issues.drawn, late + issues.late,
                                    orphans + issues.orphans)
    final = Frame()
    last = tr.drain(final)
    sends += final.sends()
    assert drawn + last.drawn == len(spans)
    assert orphans + last.orphans == 0  # every parent came: none left an orphan
    assert late + last.late >= 0
    got_picture = _picture(sends)
    assert got_picture == want
    assert all(-EPS <= x0 <= x1 <= FLAME_WIDTH + EPS for _, x0, x1, _ in got_picture)


# ── linked traces ───────────────────────────────────────────────────────────────────────

def _cluster_proof(links: str) -> tuple[list[ReadableSpan], int, list[int]]:
    """An sp1-cluster proof: root ``Prove p1``, a task span per shard, each task's inner
    ``task`` span a new trace linked to the task span (``links``: "both", "child" (the
    inner span's link only), "parent" (the task span's only))."""
    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource({"service.name": "sp1-cluster"}))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    tracer = tp.get_tracer("sp1_cluster")
    inner_traces = []
    with tracer.start_as_current_span("Prove p1") as root:
        for shard in range(3):
            with tracer.start_as_current_span("ProveShard") as task:
                ctx = task.get_span_context()
                with tracer.start_as_current_span(
                        "task", context=Context(),
                        links=[Link(ctx)] if links in ("both", "child") else []) as inner:
                    if links in ("both", "parent"):
                        task.add_link(inner.get_span_context())
                    inner_traces.append(inner.get_span_context().trace_id)
                    with tracer.start_as_current_span("prove shard with data",
                                                      attributes={"shard": shard}), \
                            tracer.start_as_current_span("zerocheck"):
                        pass
    tp.shutdown()
    return list(mem.get_finished_spans()), root.get_span_context().trace_id, inner_traces


@pytest.mark.parametrize("links", ["both", "child", "parent"])
def test_a_linked_trace_is_drawn_under_the_span_it_is_linked_to(tmp_path: Path,
                                                                links: str) -> None:
    TALLY.reset()
    spans, proof_trace, inner = _cluster_proof(links)
    assert len({s.context.trace_id for s in spans}) == 4  # four traces, as sp1-cluster
    path = tmp_path / "cluster.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    for span in spans:  # one request per span, in the order they ended (children first)
        exporter.export([span])
    exporter.shutdown()
    assert TALLY.summary_line(DROPS) == "rerun: drawn 13 spans; not drawn 0"

    rec = readback.read(path)
    key = f"{proof_trace:032x}"[:8]
    # one lane: the inner traces' own lanes were drawn, then hidden
    assert [p.rsplit("/", 1)[1].split(".")[0] for p in live_paths(rec)] == [key]
    drawn = trace_boxes(rec, "sp1-cluster", key)
    assert len(drawn) == 13
    rows = {}
    for b in drawn:
        rows.setdefault(b.name, set()).add(b.y - min(x.y for x in drawn))
    assert rows == {"Prove p1": {0}, "ProveShard": {1}, "task": {2},
                    "prove shard with data": {3}, "zerocheck": {4}}
    tasks = sorted((b for b in drawn if b.name == "ProveShard"), key=lambda b: b.x0)
    inners = sorted((b for b in drawn if b.name == "task"), key=lambda b: b.x0)
    for task, sub in zip(tasks, inners, strict=True):  # each under its own task span
        assert task.x0 - EPS <= sub.x0 <= sub.x1 <= task.x1 + EPS
    for t, b in zip(inner, inners, strict=True):
        assert f"trace {f'{t:032x}'[:8]} (linked)" in b.label


# ── bounded ─────────────────────────────────────────────────────────────────────────────

def test_a_lane_over_its_cap_is_frozen_and_lanes_are_evicted_oldest_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_GROUP_SPANS a lane keeps only its spans' rows (its children still nest);
    past max_placed whole lanes go, least recently drawn first."""
    from otel_proofscope.rerun import flame, translate_trace

    monkeypatch.setattr(flame, "MAX_GROUP_SPANS", 8)
    monkeypatch.setattr(translate_trace, "MAX_GROUP_SPANS", 8)
    tr = TraceTranslator(wait_s=60.0, max_placed=40)
    # a chain 30 deep, sent parents first in batches of 5: frozen after 8
    chain = [_span(f"c{i}", i + 1, i or None, T0 + i, T0 + 100 - i) for i in range(30)]
    sends: list[Send] = []
    for k in range(0, 30, 5):
        frame = Frame()
        got = tr.translate(chain[k:k + 5], frame, now=0.0)
        assert (got.drawn, got.orphans) == (5, 0)
        sends += frame.sends()
    rows = sorted((y, label.split(" ")[0]) for label, _, _, y in _picture(sends))
    assert [name for _, name in rows] == [f"c{i}" for i in range(30)]
    assert [y for y, _ in rows] == list(range(30))  # each one row under its parent
    [g] = tr._groups.values()
    assert g.frozen and (len(g.spans), len(g.slim)) == (8, 22)
    # other traces: the chain's lane (least recently drawn) is evicted, then the oldest
    for t in range(2, 6):
        tr.translate([_span(f"t{t}.{i}", i + 1, i or None, T0 + i, T0 + 10, trace_id=t)
                      for i in range(6)], Frame(), now=1.0)
    assert tr._placed <= 40
    assert TRACE not in tr._traces and {2, 3, 4, 5} <= set(tr._traces)
    # a late span of the evicted trace: a fresh entity, the evicted lane left as drawn
    frame = Frame()
    tr.translate([_span("late", 99, 30, T0 + 40, T0 + 41)], frame, now=2.0)
    tr.drain(frame)
    paths = {s.path for s in frame.sends() if s.path.startswith(FLAME)}
    assert paths == {f"{FLAME}/app/{KEY}.1"}


# ── readable: lanes apart, labels on their own rows, only where they fit ────────────────

def test_two_traces_get_their_own_lanes_and_labels_sit_in_their_boxes(tmp_path: Path) -> None:
    from otel_proofscope.rerun.flame import (
        BOX_HALF_HEIGHT,
        LABEL_PAD_PX,
        PX_PER_CHAR,
        PX_PER_UNIT,
    )

    path = tmp_path / "two.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    deep = [_span(f"level{i}", i + 1, i or None, T0 + i * S, T0 + 100 * S - i * S)
            for i in range(6)]
    other = 0xBEEF << 112
    wide = [_span("root", 1, None, T0, T0 + 10 * S, trace_id=other)] + [
        _span(f"phase {i} with a long name", 10 + i, 1, T0 + i * S, T0 + (i + 1) * S,
              trace_id=other) for i in range(10)]
    exporter.export(deep)
    exporter.export(wide)
    exporter.shutdown()
    rec = readback.read(path)
    lanes = []
    for trace in (TRACE, other):
        drawn = trace_boxes(rec, "app", f"{trace:032x}"[:8])
        assert all(-EPS <= b.x0 <= b.x1 <= FLAME_WIDTH + EPS for b in drawn)
        assert max(b.x1 for b in drawn) == pytest.approx(FLAME_WIDTH)  # the full width
        lanes.append((min(b.y for b in drawn), max(b.y for b in drawn)))
    (top0, bottom0), (top1, bottom1) = lanes
    assert (bottom0 - top0, bottom1 - top1) == (5, 1)  # each as deep as its tree
    assert top1 >= bottom0 + 2  # below the first, a blank row between
    # Each shown label hangs from the top edge of its own box (Rerun draws a label below
    # its anchor), and fits the box at the reference scale; the rest show on hover.
    shown = 0
    for p in live_paths(rec):
        for r in rec.rows(p):
            labels = r.values.get("Points2D:labels") or []
            for label, (ax, ay) in zip(labels, r.values["Points2D:positions"], strict=True):
                [(cx, cy)] = r.values["Boxes2D:centers"]
                [(hw, _)] = r.values["Boxes2D:half_sizes"]
                assert (ax, ay) == pytest.approx((cx, cy - BOX_HALF_HEIGHT))
                assert len(label) * PX_PER_CHAR + LABEL_PAD_PX <= 2 * hw * PX_PER_UNIT
                assert r.values["Boxes2D:labels"][0].startswith(label.rstrip("…"))
                shown += 1
    # the deep chain (≥ 5 units wide) is labelled whole; the 3.2-unit phases cut short
    assert shown == 6 + 1 + 10
    cut = [lab for p in live_paths(rec) for r in rec.rows(p)
           for lab in r.values.get("Points2D:labels") or [] if lab.startswith("phase")]
    assert cut and all(lab.endswith("…") for lab in cut)


def test_linked_traces_through_serve_over_otlp_grpc(tmp_path: Path) -> None:
    """The same cluster proof from the official OTLP/gRPC exporter to ``proofscope
    serve``: links survive the wire, one lane."""
    import os
    import signal
    import subprocess
    import sys

    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from serve_helpers import read_until

    rrd = tmp_path / "serve.rrd"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "0", "--rerun", f"file:{rrd}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        spans, proof_trace, _ = _cluster_proof("both")
        exporter = OTLPSpanExporter(endpoint=f"http://{endpoint}", insecure=True, timeout=30)
        for span in spans:  # children first, one request each
            assert exporter.export([span]).name == "SUCCESS"
        exporter.shutdown()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert "rerun: drawn 13 spans; not drawn 0" in "".join(lines) + out
    rec = readback.read(rrd)
    key = f"{proof_trace:032x}"[:8]
    assert [p.rsplit("/", 1)[1].split(".")[0] for p in live_paths(rec)] == [key]
    assert sum(b.name == "task" for b in trace_boxes(rec, "sp1-cluster", key)) == 3


def test_traces_linked_in_a_cycle_are_drawn_once_each() -> None:
    """Two roots each linked to a span of the other trace (hostile or confused links):
    one lane, every span drawn once, the cycle cut at one link."""
    other = 0xBEEF << 112
    a = [_span("a", 1, None, T0, T0 + 10 * S), _span("a.child", 2, 1, T0, T0 + 5 * S)]
    b = [_span("b", 1, None, T0, T0 + 10 * S, trace_id=other),
         _span("b.child", 2, 1, T0, T0 + 5 * S, trace_id=other)]
    a[0] = ReadableSpan(name="a", context=a[0].context, parent=None, start_time=T0,
                        end_time=T0 + 10 * S, resource=a[0].resource,
                        links=[Link(b[1].context)])
    b[0] = ReadableSpan(name="b", context=b[0].context, parent=None, start_time=T0,
                        end_time=T0 + 10 * S, resource=b[0].resource,
                        links=[Link(a[1].context)])
    tr = TraceTranslator(wait_s=1.0)
    sends: list[Send] = []
    for batch in (a, b):
        frame = Frame()
        assert tr.translate(batch, frame, now=0.0).drawn == 2
        sends += frame.sends()
    final = Frame()
    tr.drain(final)
    sends += final.sends()
    picture = _picture(sends)
    assert sorted(label.split(" ")[0] for label, *_ in picture) == \
        ["a", "a.child", "b", "b.child"]
    assert len({y for *_, y in picture}) == 4  # one chain: a root, three rows under it
