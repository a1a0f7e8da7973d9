"""The trace view: every span drawn in Rerun, whatever it is called and whenever it arrives.

A foreign trace with the span names of a Rust zkVM prover (SP1's ``prove`` →
``prove_shards`` → ``prove_shard`` …) goes through the official OTel exporters, over gRPC
and over HTTP, to ``proofscope serve``; the ``.rrd`` read back holds every span; the
summary line accounts for each. Arrival order (children first, across requests, a
parent that never comes) and hostile input go through the pure translation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")
from flame_helpers import boxes, trace_boxes
from serve_helpers import read_until

from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.columns import Frame
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.tally import TALLY
from otel_proofscope.rerun.translate_trace import (
    DURATIONS,
    FLAME,
    LOGS,
    SOURCE_NAME,
    TraceTranslator,
    part,
)

PROCESS_TIMEOUT_S = 90
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "foreign_prover.py"
#: prove, execute, shard_record, prove_shards, 4 × (prove_shard + 3 phases), compress, verify
SPANS_PER_PROOF = 22
NAMES = {"prove", "execute", "shard_record", "prove_shards", "prove_shard", "generate_traces",
         "commit_main", "open", "compress", "verify"}


def _example() -> Any:
    """examples/foreign_prover.py as a module (the one definition of the trace's shape)."""
    spec = importlib.util.spec_from_file_location("foreign_prover", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rust_prover_trace(exporter: SpanExporter, service: str, *, batch: bool) -> int:
    """A proof as a Rust zkVM prover traces it (SP1's span names); its trace id."""
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(BatchSpanProcessor(exporter) if batch
                          else SimpleSpanProcessor(exporter))
    trace_id: int = _example().prove(tp)
    tp.shutdown()
    return trace_id


def _labels(rec: readback.Recording, path: str) -> list[str]:
    return [b.label for b in boxes(rec, path)]


def _check_proof(rec: readback.Recording, service: str, trace_id: int) -> None:
    key = f"{trace_id:032x}"[:8]
    svc = part(service)
    labels = _labels(rec, f"/{FLAME}/{svc}/{key}")
    assert len(labels) == SPANS_PER_PROOF
    assert {lab.split(" ")[0] for lab in labels} == NAMES
    [error] = [lab for lab in labels if "ERROR" in lab]
    assert error.startswith("open ") and error.endswith(" ERROR")
    # depth: prove 0, prove_shards 1, prove_shard 2, its phases 3 (y = lane + depth)
    y = {b.name: b.y for b in trace_boxes(rec, service, key)}
    lane = y["prove"]
    assert (y["prove_shards"] - lane, y["prove_shard"] - lane, y["commit_main"] - lane) \
        == (1, 2, 3)
    assert len(rec.rows(f"/{DURATIONS}/{svc}/prove_shard")) == 4
    texts = [r.values["TextLog:text"][0] for r in rec.rows(f"/{LOGS}/{svc}")]
    assert any("shard.checkpoint" in t and "rows=4096" in t for t in texts)
    assert any(t.startswith("open ") and "ERROR: opening proof failed" in t for t in texts)
    assert any(t.startswith("prove_shard ") and "shard=3" in t and "cycles=300003" in t
               for t in texts)


def test_foreign_trace_over_grpc_and_http_through_serve(tmp_path: Path) -> None:
    rrd = tmp_path / "x.rrd"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "0", "--rerun", f"file:{rrd}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(PROCESS_TIMEOUT_S, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        grpc_endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        http_endpoint = read_until(proc, "OTLP/HTTP listening on", lines)
        # gRPC: the example prover, run as a user would (another process, batched).
        ran = subprocess.run(
            [sys.executable, str(EXAMPLE)], capture_output=True, text=True, check=True,
            timeout=PROCESS_TIMEOUT_S,
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{grpc_endpoint}",
                 "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_SERVICE_NAME": "sp1-prover"})
        via_grpc = int(ran.stdout.split("of trace ", 1)[1].split()[0], 16)
        # HTTP: one request per span, children before their parents (another request);
        # a second service in the same recording.
        via_http = rust_prover_trace(HttpSpanExporter(endpoint=f"{http_endpoint}/v1/traces",
                                                      timeout=10), "sp1/cluster", batch=False)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    total = 2 * SPANS_PER_PROOF
    assert f"spans_accepted={total}" in summary
    assert f"rerun: drawn {total} spans; not drawn 0\n" in summary
    assert "dropped: nothing" in summary
    rec = readback.read(rrd)
    _check_proof(rec, "sp1-prover", via_grpc)
    _check_proof(rec, "sp1/cluster", via_http)
    # two services, two entities: kept apart (the slash is escaped, not a path level)
    assert f"/{FLAME}/sp1\\/cluster/{f'{via_http:032x}'[:8]}" in rec.paths()


# ── arrival order ──────────────────────────────────────────────────────────────────────

T0 = 1_800_000_000_000_000_000
TRACE = 0xFEED_0000_0000_0000_0000_0000_0000_0001


def _span(name: str, span_id: int, parent: int | None, start: int, end: int, *,
          trace_id: int = TRACE, attrs: dict[str, Any] | None = None,
          service: str = "prover") -> ReadableSpan:
    ctx = SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED))
    par = SpanContext(trace_id, parent, False, TraceFlags(TraceFlags.SAMPLED)) \
        if parent else None
    return ReadableSpan(name=name, context=ctx, parent=par, attributes=attrs or {},
                        start_time=start, end_time=end,
                        resource=Resource({"service.name": service}))


def test_children_before_parents_and_an_orphan_at_shutdown(tmp_path: Path) -> None:
    TALLY.reset()
    path = tmp_path / "order.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    leaf = _span("open", 3, 2, T0 + 20, T0 + 30)
    mid = _span("prove_shard", 2, 1, T0 + 10, T0 + 40)
    root = _span("prove", 1, None, T0, T0 + 100)
    lost_parent = _span("late_child", 9, 77, T0 + 50, T0 + 60)  # parent 77 never sent
    for batch in ([leaf], [lost_parent], [mid], [root]):  # separate batches, leaf first
        exporter.export(batch)
    assert exporter.force_flush(30_000)
    assert exporter.sink is not None
    assert exporter.sink.trace.pending == 1  # only the orphan still waits
    exporter.shutdown()
    rec = readback.read(path)
    drawn = trace_boxes(rec, "prover", f"{TRACE:032x}"[:8])
    got = {b.name: b.y for b in drawn}
    assert set(got) == {"prove", "prove_shard", "open", "late_child"}
    assert (got["prove_shard"] - got["prove"], got["open"] - got["prove"]) == (1, 2)
    [orphan] = [b.label for b in drawn if b.name == "late_child"]
    assert f"orphan: parent {77:016x} not received" in orphan
    # in the orphan rows, a blank row below the tree (rows 0-2): apart from it
    assert got["late_child"] - got["prove"] == 4
    assert TALLY.summary_line(DROPS) == \
        "rerun: drawn 4 spans (1 as orphans: parent never received); not drawn 0"


def test_a_bounded_wait_then_an_orphan_and_a_bounded_buffer() -> None:
    tr = TraceTranslator(wait_s=5.0, max_pending=2)
    frame = Frame()
    first = tr.translate([_span("a", 11, 10, T0, T0 + 1)], frame, now=100.0)
    assert (first.drawn, first.pending) == (0, 1)
    assert tr.next_expiry(101.0) == pytest.approx(4.0)
    assert tr.expire(104.9, Frame()).drawn == 0
    expired = tr.expire(105.0, Frame())
    assert (expired.drawn, expired.orphans, expired.pending) == (1, 1, 0)
    # a full buffer draws its oldest span early, as an orphan, and counts it
    full = tr.translate([_span(f"s{i}", 20 + i, 99, T0, T0 + 1) for i in range(5)], Frame(),
                        now=200.0)
    assert (full.pending_overflow, full.orphans, full.pending) == (3, 3, 2)
    # the parent arrives: its two waiting children are drawn under it, and the three
    # drawn early move under it too: no longer orphans, drawn late
    parent = tr.translate([_span("p", 99, None, T0, T0 + 2)], Frame(), now=202.0)
    assert (parent.drawn, parent.orphans, parent.late, parent.pending) == (3, -3, 3, 0)
    assert tr.drain(Frame()).drawn == 0


@pytest.mark.parametrize("lane_cap", [1 << 16, 5, 2], ids=["redrawn", "frozen", "slim"])
@pytest.mark.parametrize("under", ["root", "phase"])
def test_a_full_wait_draws_early_and_the_summary_says_where_they_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lane_cap: int, under: str) -> None:
    """A proof whose root ends last overflows the wait once it has more spans than the
    wait holds: those spans are drawn early, one row under the lane's top, not lost (no
    drop is recorded). When their parent comes they are under it: in place if it is the
    root, moved by a redraw otherwise; a lane too large to redraw leaves them where they
    were drawn, and the summary says how many."""
    from otel_proofscope.rerun import flame

    monkeypatch.setattr(flame, "MAX_GROUP_SPANS", lane_cap)
    TALLY.reset()
    dropped, shared = DROPS.total(), dict(DROPS.not_drawn())
    path = tmp_path / "wait.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    exporter.export([])  # opens the sink
    assert exporter.sink is not None
    exporter.sink.trace.max_pending = 2
    parent = 1 if under == "root" else 2
    exporter.export([_span(f"layer{i}", 10 + i, parent, T0 + i, T0 + i + 1) for i in range(6)])
    assert exporter.force_flush(30_000)
    last = [_span("prove", 1, None, T0, T0 + 100)]
    if under == "phase":
        last.insert(0, _span("phase", 2, 1, T0, T0 + 50))
    exporter.export(last)
    assert exporter.force_flush(30_000)
    exporter.shutdown()
    assert DROPS.total() == dropped and dict(DROPS.not_drawn()) == shared
    spans = 7 + (under == "phase")
    stays = under == "phase" and lane_cap < 1 << 16
    note = ("4 left where they were drawn before their parent arrived: its lane had grown "
            "too large to redraw" if stays else "4 drawn late: their parent arrived after them")
    assert TALLY.summary_line(DROPS) == f"rerun: drawn {spans} spans ({note}); not drawn 0"
    rec = readback.read(path)
    drawn = trace_boxes(rec, "prover", f"{TRACE:032x}"[:8])
    assert len(drawn) == spans
    y = {b.name: b.y - min(d.y for d in drawn) for b in drawn}
    depth = 1 if under == "root" else 2
    early = [b for b in drawn if "the wait was full" in b.label]
    if stays:  # the four drawn early kept their row and say why
        assert sorted(y[f"layer{i}"] for i in range(6)) == [1, 1, 1, 1, 2, 2]
        assert len(early) == 4
        assert all(f"drawn before its parent {2:016x}: the wait was full" in b.label
                   for b in early)
    else:
        assert {y[f"layer{i}"] for i in range(6)} == {depth}
        assert not any("orphan" in b.label for b in drawn)


@pytest.mark.parametrize("lane_cap", [1 << 16, 2], ids=["redrawn", "frozen"])
def test_a_full_wait_draws_the_top_of_what_waits_so_the_subtree_keeps_its_shape(
        monkeypatch: pytest.MonkeyPatch, lane_cap: int) -> None:
    """The oldest waiting span is a round whose layer and phase wait too: drawing the
    round alone would cut it from them. The phase (whose parent, the root, has not
    come) is drawn early instead, its layers and rounds under it, and when the root
    comes it is already in place, frozen lane or not."""
    from otel_proofscope.rerun import flame

    monkeypatch.setattr(flame, "MAX_GROUP_SPANS", lane_cap)
    tr = TraceTranslator(wait_s=600.0, max_pending=7)
    batches = [[_span(f"round{i}", 10 + i, 3 + i // 2, T0 + 10 + i, T0 + 11 + i)
                for i in range(4)],
               [_span("layer0", 3, 2, T0 + 10, T0 + 12), _span("layer1", 4, 2, T0 + 12, T0 + 14)],
               [_span("phase", 2, 1, T0 + 5, T0 + 20)]]
    for batch in batches:
        assert tr.translate(batch, Frame(), now=1.0).drawn == 0
    other = tr.translate([_span("x", 99, 98, T0, T0 + 1, trace_id=TRACE + 1)], Frame(),
                         now=2.0)
    assert (other.pending_overflow, other.drawn, other.orphans) == (1, 7, 1)
    root = tr.translate([_span("prove", 1, None, T0, T0 + 30)], Frame(), now=3.0)
    assert (root.drawn, root.orphans, root.late, root.stranded) == (1, -1, 1, 0)
    rows = {sid: (p.tree, p.row) for sid in (1, 2, 3, 4, 10, 11, 12, 13)
            if (p := tr._find(TRACE, sid)) is not None}
    assert rows == {1: (True, 0), 2: (True, 1), 3: (True, 2), 4: (True, 2), 10: (True, 3),
                    11: (True, 3), 12: (True, 3), 13: (True, 3)}


def test_a_large_lane_that_grows_batch_by_batch_is_redrawn_fewer_times() -> None:
    """Each redraw draws every span of the lane again: growing a 20,000-span trace by a
    quarter each time drew it 5.8x over (the last, tight draw included); a big lane
    doubles its room instead: 3.1x. The last call still draws it tight, and every span
    is drawn in the end."""
    n, per = 20_000, 512
    tr = TraceTranslator(wait_s=600.0)
    spans = [_span("prove", 1, None, T0, T0 + 10)]
    spans += [_span(f"layer{i}", 10 + i, 1, T0 + 10 * i, T0 + 10 * i + 9)
              for i in range(1, n)]
    redrawn = drawn = 0
    for i in range(0, n, per):
        issues = tr.translate(spans[i:i + per], Frame(), now=1.0)
        redrawn += issues.redrawn
        drawn += issues.drawn
    last = tr.drain(Frame())
    assert drawn == n and last.drawn == 0
    assert redrawn + last.redrawn <= 3.5 * n, redrawn + last.redrawn
    (lane,) = tr._groups.values()
    assert lane.slack() == 0 and lane.t1 - lane.t0 == 10 * (n - 1) + 9


def test_a_waiting_span_keeps_only_what_its_box_needs() -> None:
    """Spans that wait for their parent hold a few hundred bytes each, not their events
    and attributes (16-round layer spans held ~17 KB each: 32,768 could wait)."""
    import gc
    import tracemalloc

    def heavy(i: int) -> ReadableSpan:
        ctx = SpanContext(TRACE, 1000 + i, False, TraceFlags(TraceFlags.SAMPLED))
        par = SpanContext(TRACE, 7, False, TraceFlags(TraceFlags.SAMPLED))
        events = [Event("proof.sumcheck.round", {"proof.sumcheck.round": r,
                                                 "proof.sumcheck.poly": f"{r:0300d}",
                                                 "proof.claim": f"{r:0200d}"},
                        timestamp=T0 + r) for r in range(16)]
        attrs = {f"proof.layer.attr{k}": f"value-{i}-{k:060d}" for k in range(8)}
        return ReadableSpan(name="proof.layer", context=ctx, parent=par, attributes=attrs,
                            events=events, start_time=T0 + i, end_time=T0 + i + 1,
                            resource=Resource({"service.name": "prover"}))

    n = 500
    tr = TraceTranslator(wait_s=600.0)
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        batch = [heavy(i) for i in range(n)]
        payload = tracemalloc.get_traced_memory()[0] - before
        tr.translate(batch, Frame(), now=1.0)
        del batch
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert tr.pending == n
    assert payload / n > 10_000  # what each span carried
    assert held / n < 1_500, f"{held / n:.0f} bytes per waiting span"
    drawn = tr.translate([_span("parent", 7, None, T0, T0 + 10_000)], Frame(), now=2.0)
    assert (drawn.drawn, drawn.orphans, tr.pending) == (n + 1, 0, 0)


def test_mapped_span_label_names_source_and_contract() -> None:
    tr = TraceTranslator(wait_s=1.0)
    frame = Frame()
    tr.translate([_span("proof.layer", 1, None, T0, T0 + 2_000_000,
                        attrs={SOURCE_NAME: "prove_shard", "shard": 3})], frame, now=0.0)
    sends = {s.path: s for s in frame.sends()}
    flame = sends[f"{FLAME}/prover/{f'{TRACE:032x}'[:8]}"]
    labels = [c for c in flame.columns if "labels" in str(c.component_descriptor())]
    assert "prove_shard → proof.layer 2.00 ms" in str(labels[0].as_arrow_array().to_pylist())


# ── hostile input ──────────────────────────────────────────────────────────────────────

_text = st.text(max_size=40)
_value = st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans(), _text,
                   st.lists(st.integers(), max_size=5), st.lists(_text, max_size=3))


@st.composite
def _spans(draw: st.DrawFn) -> list[ReadableSpan]:
    n = draw(st.integers(1, 25))
    traces = draw(st.lists(st.integers(1, (1 << 128) - 1), min_size=1, max_size=3))
    out = []
    for i in range(n):
        span_id = i + 1
        # parents: none, an earlier or later span of the batch, or one never sent
        parent = draw(st.one_of(st.none(), st.integers(1, n + 3)))
        start = draw(st.integers(0, 1 << 62))
        end = draw(st.one_of(st.none(), st.integers(0, 1 << 62)))
        events = [Event(draw(_text), draw(st.dictionaries(_text, _value, max_size=3)),
                        timestamp=draw(st.integers(0, 1 << 62)))
                  for _ in range(draw(st.integers(0, 2)))]
        ctx = SpanContext(draw(st.sampled_from(traces)), span_id, False)
        par = SpanContext(ctx.trace_id, parent, False) if parent else None
        status = Status(draw(st.sampled_from(list(StatusCode))),
                        draw(st.one_of(st.none(), _text)))
        if status.status_code is not StatusCode.ERROR:
            status = Status(status.status_code)
        out.append(ReadableSpan(
            name=draw(_text), context=ctx, parent=par,
            attributes=draw(st.dictionaries(_text, _value, max_size=6)),
            events=events, start_time=start, end_time=end, status=status,
            # links to any span of any trace of the batch (or none): cycles included
            links=[Link(SpanContext(draw(st.sampled_from(traces)), draw(st.integers(1, n)),
                                    False)) for _ in range(draw(st.integers(0, 2)))],
            resource=Resource({"service.name": draw(_text)})))
    return out


def _parts(path: str) -> list[str]:
    """Entity-path parts: split on slashes, a backslash escaping the next character."""
    parts, cur, escaped = [], "", False
    for ch in path:
        if escaped:
            cur, escaped = cur + ch, False
        elif ch == "\\":
            cur, escaped = cur + ch, True
        elif ch == "/":
            parts, cur = [*parts, cur], ""
        else:
            cur += ch
    assert not escaped, path  # a dangling backslash would escape the next part's slash
    return [*parts, cur]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(_spans(), min_size=1, max_size=3))
def test_any_spans_translate_without_raising_and_paths_stay_escaped(
        batches: list[list[ReadableSpan]]) -> None:
    tr = TraceTranslator(wait_s=0.5, max_pending=8)
    drawn = received = 0
    for k, batch in enumerate(batches):
        frame = Frame()
        issues = tr.translate(batch, frame, now=float(k))
        received += issues.received - issues.invalid
        drawn += issues.drawn
        for send in frame.sends():
            parts = _parts(send.path)
            assert len(parts) == (3 if parts[1] == "logs" else 4) and all(parts), send.path
            assert parts[0] == "trace" and parts[1] in ("flame", "logs", "durations")
    final = Frame()
    drawn += tr.drain(final).drawn
    assert drawn == received  # every drawable span is drawn exactly once
    assert tr.pending == 0


def test_no_viewer_every_span_counted_once_never_drawn(tmp_path: Path) -> None:
    """A viewer that is not there: each span is 'not drawn' exactly once, including the
    children that were waiting for their parent when their batch was lost."""
    import socket

    TALLY.reset()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = RerunSpanExporter(f"rerun+http://127.0.0.1:{port}/proxy")
    leaf = _span("open", 3, 2, T0 + 20, T0 + 30)
    mid = _span("prove_shard", 2, 1, T0 + 10, T0 + 40)
    root = _span("prove", 1, None, T0, T0 + 100)
    stray = _span("late_child", 9, 77, T0 + 50, T0 + 60)
    for batch in ([leaf, stray], [mid], [root]):
        exporter.export(batch)
    assert exporter.force_flush(10_000) is not None
    exporter.shutdown()
    assert TALLY.summary_line(DROPS) == "rerun: drawn 0 spans; not drawn 4 (sink_unavailable 4)"


def test_configure_exit_report_says_what_was_drawn(tmp_path: Path) -> None:
    from otel_proofscope.setup import configure

    TALLY.reset()
    rrd = tmp_path / "cfg.rrd"
    # Drawn by the export process, configure()'s one Rerun route (issue 29).
    telemetry = configure(out_dir=tmp_path, rerun=f"file:{rrd}", set_global=False,
                          service_name="my-prover")
    tracer = telemetry.tracer_provider.get_tracer("my_prover")
    with tracer.start_as_current_span("prove"):
        for shard in range(3):
            with tracer.start_as_current_span("prove_shard", attributes={"shard": shard}):
                pass
    report = telemetry.shutdown(timeout_s=20)
    assert "rerun: drawn 4 spans; not drawn 0" in report.lines()
    labels = [lab for p in readback.read(rrd).paths() if p.startswith(f"/{FLAME}/my-prover/")
              for lab in _labels(readback.read(rrd), p)]
    assert sorted(lab.split(" ")[0] for lab in labels) == ["prove"] + ["prove_shard"] * 3


def test_duration_series_are_capped_and_the_rest_share_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_proofscope.rerun import translate_trace

    monkeypatch.setattr(translate_trace, "MAX_SERIES", 2)
    tr = TraceTranslator(wait_s=1.0)
    frame = Frame()
    issues = tr.translate([_span(f"phase{i}", i + 1, None, T0, T0 + 5, service=f"svc{i}")
                           for i in range(5)], frame, now=0.0)
    series = {s.path for s in frame.sends() if s.path.startswith(f"{DURATIONS}/")}
    assert series == {f"{DURATIONS}/svc0/phase0", f"{DURATIONS}/svc1/phase1",
                      f"{DURATIONS}/_other/_other"}
    assert issues.capped == {"trace_duration_series": 3}
    assert issues.drawn == 5


def test_names_beyond_the_series_cap_are_drawn_shared_not_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """viztracer names every function with its file and line: past the cap the points
    go to the shared series, and the summary must not call them dropped (issue 27)."""
    from otel_proofscope.rerun import translate_trace

    monkeypatch.setattr(translate_trace, "MAX_SERIES", 2)
    path = tmp_path / "cap.rrd"
    dropped = DROPS.total()
    shared = DROPS.not_drawn()
    exporter = RerunSpanExporter(f"file:{path}")
    exporter.export([_span(f"f{i} (toy.py:{i})", i + 1, None, T0 + i, T0 + i + 5)
                     for i in range(5)])
    assert exporter.force_flush(30_000)
    exporter.shutdown()
    assert DROPS.total() == dropped
    beyond = {k.signal: n - shared.get(k, 0) for k, n in DROPS.not_drawn().items()}
    assert beyond.get("trace_duration_series") == 3
    rec = readback.read(path)
    assert len(rec.rows(f"/{DURATIONS}/_other/_other")) == 3


def _remote_child(span_id: int, parent: int, start: int, end: int) -> ReadableSpan:
    """The first span of a process that joined a trace begun elsewhere (TRACEPARENT)."""
    ctx = SpanContext(TRACE, span_id, False, TraceFlags(TraceFlags.SAMPLED))
    par = SpanContext(TRACE, parent, True, TraceFlags(TraceFlags.SAMPLED))
    return ReadableSpan(name="prove", context=ctx, parent=par, start_time=start, end_time=end,
                        resource=Resource({"service.name": "rust-prover"}))


def test_a_parent_in_another_process_is_waited_for_briefly() -> None:
    from otel_proofscope.rerun.translate_trace import REMOTE_WAIT_S

    tr = TraceTranslator(wait_s=600.0)
    frame = Frame()
    # a child of the remote-rooted span, and a stray local orphan, arrive first
    first = tr.translate([_span("prove_shard", 2, 1, T0 + 10, T0 + 20,
                                service="rust-prover"),
                          _span("stray", 7, 66, T0, T0 + 1, service="rust-prover")],
                         frame, now=0.0)
    assert first.pending == 2
    second = tr.translate([_remote_child(1, 0xABC, T0, T0 + 30)], frame, now=1.0)
    assert (second.drawn, second.pending) == (0, 3)  # waits for 0xabc, briefly
    assert tr.next_expiry(1.0) == pytest.approx(REMOTE_WAIT_S)
    late = tr.expire(1.0 + REMOTE_WAIT_S, frame)
    assert (late.drawn, late.orphans, late.pending) == (2, 1, 1)  # the stray still waits
    flame = next(s for s in frame.sends() if s.path.startswith(f"{FLAME}/"))
    rows = {lab[0].split(" ")[0]: (lab[0], c[0][1]) for lab, c in zip(
        next(c for c in flame.columns if "labels" in str(c.component_descriptor()))
        .as_arrow_array().to_pylist(),
        next(c for c in flame.columns if "centers" in str(c.component_descriptor()))
        .as_arrow_array().to_pylist(), strict=True)}
    label, y_root = rows["prove"]
    assert f"parent {0xABC:016x} in another process" in label
    assert rows["prove_shard"][1] - y_root == 1  # its own children nest under it


def test_the_remote_parent_flag_crosses_to_the_child_translator() -> None:
    from otel_proofscope.rerun import span_wire

    data, refused = span_wire.pack_spans([_remote_child(1, 0xABC, T0, T0 + 30),
                                          _span("local", 2, 1, T0, T0 + 5)])
    assert refused == []
    remote, local = span_wire.unpack_spans(data).spans
    assert remote.parent is not None and remote.parent.is_remote
    assert local.parent is not None and not local.parent.is_remote
    assert remote.resource.attributes["service.name"] == "rust-prover"


def test_a_viewer_that_goes_away_every_span_counted_once() -> None:
    """Children sent (confirmed, waiting for their parent) while a viewer listens; it goes
    away; a stray child of another trace and then the parent arrive: each span ends up
    'not drawn' exactly once, none drawn, none twice."""
    import socket

    TALLY.reset()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept() -> None:
        # A live viewer as the sink's liveness probe sees one: it answers the HTTP/2
        # preface with a SETTINGS frame (an HTTP/2 server's own preface).
        with contextlib.suppress(OSError):
            while True:
                conn = listener.accept()[0]
                accepted.append(conn)
                conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")

    threading.Thread(target=accept, daemon=True).start()
    exporter = RerunSpanExporter(f"rerun+http://127.0.0.1:{port}/proxy")
    assert exporter.sink is not None
    exporter.sink._probe_interval = 0.2
    exporter.export([_span("open", 3, 2, T0 + 20, T0 + 30),
                     _span("prove_shard", 2, 1, T0 + 10, T0 + 40)])
    exporter.force_flush(3_000)  # probes the viewer: this batch is delivered
    assert exporter.sink.trace.pending == 2
    listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(): stops listening
    listener.close()
    for conn in accepted:
        conn.close()
    time.sleep(0.3)
    other = TRACE + 1
    exporter.export([_span("stray", 9, 50, T0, T0 + 1, trace_id=other)])  # lost: probe fails
    exporter.force_flush(3_000)
    exporter.export([_span("prove", 1, None, T0, T0 + 100)])  # its children drawn, unsent
    exporter.shutdown()
    assert TALLY.summary_line(DROPS) == "rerun: drawn 0 spans; not drawn 4 (sink_unavailable 4)"
