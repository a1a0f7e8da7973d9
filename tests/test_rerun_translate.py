"""Rerun span translation, end to end: real SDK spans → RerunSpanExporter → .rrd → read back.

Spans come from ProofTracer on an SDK TracerProvider (the API provers use); the
recording is read back with ``rerun.chunk.RrdReader`` (through ``readback``) and the
entity paths, archetypes, timelines and values are checked against what was emitted.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import rerun as rr
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from rerun.chunk import RrdReader

from otel_proofscope import instrumentation
from otel_proofscope.instrumentation import ActivationStats, CircuitNode, ProofTracer
from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import layout, readback
from otel_proofscope.rerun.columns import LAYER, PROOF_TIME, SUMCHECK_ROUND
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.translate import (
    M31,
    MAX_CIRCUIT_NODES,
    NODES,
    ROUNDS,
    TRAIL,
    claim_fingerprint,
    is_layer,
)
from otel_proofscope.semconv import (
    LAYER_KIND_COLOURS,
    Attr,
    EventName,
    LayerKind,
    SpanName,
)

KINDS = ("MatMul", "Add", "Activation", "Mul", "Attention")
ROUNDS_PER_LAYER = 4


@pytest.fixture(autouse=True)
def _strict_rerun() -> Iterator[None]:
    # Rerun logs conversion problems as warnings by default; here they must fail.
    previous = rr.strict_mode()
    rr.set_strict_mode(True)
    yield
    rr.set_strict_mode(previous)


def prove(tracer: ProofTracer, layers: int = 5, *, witness: bool = False,
          verified: bool = True) -> None:
    """A small GKR-shaped proof: circuit, layers output → input with rounds, verify."""
    nodes = [CircuitNode(i, KINDS[i % 5], 100 * (i + 1), [i - 1] if i else [])
             for i in range(layers)]
    with tracer.proof(system="gkr", backend="cpu", model_name="toy", layers=layers,
                      input_shape=[4, 8], output_shape=[4, 8]) as proof:
        with tracer.circuit_compile(nodes=nodes):
            pass
        for i in reversed(range(layers)):
            with tracer.layer(index=i, kind=KINDS[i % 5], rounds=ROUNDS_PER_LAYER,
                              claim_initial=(i, 1, 2, 3), trace_cost=100 * (i + 1)) as layer:
                if witness:
                    tracer.layer_activation(ActivationStats(0.5 * i, 1.0, -2.0, 2.0, 0.25,
                                                            [1.0, 2.0, 3.0]))
                    if KINDS[i % 5] == "Attention":
                        tracer.attention_heatmap(0, 1, [[0.5, 0.5], [0.25, 0.75]])
                for r in range(ROUNDS_PER_LAYER):
                    time.sleep(0.0002)
                    tracer.sumcheck_round(r, [r, r + 1, r + 2], (1000 * i + r, 7, 8, 9))
                layer.set_final_claim((5, 6, 7, 8))
        with tracer.verify() as verify:
            verify.set_verified(verified)
        proof.set_result(layer_proofs=layers, weight_openings=0, size=1234, verified=verified)


def record(**kwargs: object) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    prove(ProofTracer(provider), **kwargs)  # type: ignore[arg-type]
    return list(memory.get_finished_spans())


def export(path: Path, batches: Sequence[Sequence[ReadableSpan]], *,
           witness: bool = False) -> readback.Recording:
    exporter = RerunSpanExporter(f"file:{path}", capture_witness=witness)
    for batch in batches:
        exporter.export(batch)
    assert exporter.force_flush(30_000)
    exporter.shutdown()
    return readback.read(path)


def key_of(spans: Sequence[ReadableSpan]) -> str:
    ctx = spans[0].context
    assert ctx is not None
    return f"{ctx.trace_id:032x}"[:8]


def test_known_span_set(tmp_path: Path) -> None:
    spans = record()
    p = key_of(spans)
    rec = export(tmp_path / "proof.rrd", [spans])
    assert DROPS.total() == 0
    assert rec.application_id == "otel_proofscope"
    assert rec.blueprints == 1
    for path in (f"/circuit/{p}/nodes", f"/circuit/{p}/edges", f"/circuit/{p}/backbone",
                 f"/gkr/walk/{p}/cursor", f"/{NODES}", f"/{ROUNDS}", f"/{TRAIL}",
                 f"/gkr/claim/{p}", f"/gkr/remaining/{p}", f"/gkr/round_ms/{p}",
                 f"/proof/progress/{p}", f"/logs/proof/{p}", f"/logs/gkr/{p}"):
        assert path in rec.paths(), path
    assert not any(path.startswith("/inference") for path in rec.paths())  # witness off

    # Archetypes are the right ones.
    assert rec.archetypes[f"/circuit/{p}/nodes"]["Points3D:positions"] == \
        "rerun.archetypes.Points3D"
    assert rec.archetypes[f"/{ROUNDS}"]["Boxes3D:centers"] == "rerun.archetypes.Boxes3D"
    assert rec.archetypes[f"/gkr/claim/{p}"]["Scalars:scalars"] == "rerun.archetypes.Scalars"
    assert rec.archetypes[f"/logs/gkr/{p}"]["TextLog:text"] == "rerun.archetypes.TextLog"
    for kind in KINDS:
        assert rec.archetypes[f"/proof/layer_seconds/{p}/{kind}"]["BarChart:values"] == \
            "rerun.archetypes.BarChart"

    # Circuit: 5 nodes on the helix, coloured by kind.
    [positions] = rec.values(f"/circuit/{p}/nodes", "Points3D:positions")
    [colours] = rec.values(f"/circuit/{p}/nodes", "Points3D:colors")
    assert len(positions) == 5
    for i, (pos, colour) in enumerate(zip(positions, colours, strict=True)):
        assert pos == pytest.approx(layout.node_position(i, KINDS[i % 5]), abs=1e-5)
        assert colour >> 8 == LAYER_KIND_COLOURS[LayerKind(KINDS[i % 5])]
    [edges] = rec.values(f"/circuit/{p}/edges", "LineStrips3D:strips")
    assert len(edges) == 4

    # Every round: one bar, a claim fingerprint, the variables left; stamped with the
    # event's own timestamp on proof_time plus the layer and sumcheck_round timelines.
    layers = {s.attributes[Attr.LAYER_INDEX]: s for s in spans if s.name == SpanName.LAYER}
    events = sorted(((ev.timestamp, idx, ev.attributes[Attr.SUMCHECK_ROUND],
                      ev.attributes[Attr.CLAIM]) for idx, s in layers.items()
                     for ev in s.events), key=lambda e: e[0])
    assert len(events) == 5 * ROUNDS_PER_LAYER
    claim_rows = rec.rows(f"/gkr/claim/{p}")
    assert [(r.times[PROOF_TIME], r.times[LAYER], r.times[SUMCHECK_ROUND]) for r in claim_rows] \
        == [(t, i, rnd) for t, i, rnd, _ in events]
    assert [r.values["Scalars:scalars"][0] for r in claim_rows] == pytest.approx(
        [((1000 * i + rnd) % M31) / M31 for _, i, rnd, _ in events])
    remaining = [r.values["Scalars:scalars"][0] for r in rec.rows(f"/gkr/remaining/{p}")]
    assert remaining == pytest.approx(
        [(ROUNDS_PER_LAYER - rnd - 1) / ROUNDS_PER_LAYER for _, _, rnd, _ in events])
    bars = rec.rows(f"/{ROUNDS}")
    assert [r.times for r in bars] == [{PROOF_TIME: t} for t, _, _, _ in events]
    for row, (_, i, _, _) in zip(bars, events, strict=True):
        [centre] = row.values["Boxes3D:centers"]
        [half] = row.values["Boxes3D:half_sizes"]
        node = layout.node_position(i, KINDS[i % 5])
        assert half[1] > 0 and centre[1] - half[1] > node[1]  # an upright bar above its node
        assert abs(centre[0] - node[0]) < 1.3  # fanned out around it
        assert row.values["Boxes3D:fill_mode"] == [3]  # solid
    # Round wall times are the gaps between the events (or the layer start).
    round_ms = [r.values["Scalars:scalars"][0] for r in rec.rows(f"/gkr/round_ms/{p}")]
    for (t, i, rnd, _), ms in zip(events, round_ms, strict=True):
        prev = layers[i].start_time if rnd == 0 else next(
            e.timestamp for e in layers[i].events if e.attributes[Attr.SUMCHECK_ROUND] == rnd - 1)
        assert ms == pytest.approx((t - prev) / 1e6)

    # Nodes: a row at each layer's start and end, on its own timestamps.
    node_rows = rec.rows(f"/{NODES}")
    assert sorted((r.times[PROOF_TIME], r.times[LAYER]) for r in node_rows) == sorted(
        [(s.start_time, i) for i, s in layers.items()] + [(s.end_time, i) for i, s in
                                                          layers.items()])
    # Trail: one segment per pair of adjacent proved layers, closed by the later one.
    trail = rec.rows(f"/{TRAIL}")
    assert sorted(r.times[PROOF_TIME] for r in trail) == sorted(
        max(layers[i].end_time, layers[i + 1].end_time) for i in range(4))

    # Progress: 0 at the proof's start, then one step per layer, ending at 1.
    progress = rec.rows(f"/proof/progress/{p}")
    root = next(s for s in spans if s.name == SpanName.PROOF)
    assert progress[0].times[PROOF_TIME] == root.start_time
    assert [r.values["Scalars:scalars"][0] for r in progress] == pytest.approx(
        [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    # The cursor is dismissed when the proof ends.
    cursor = rec.rows(f"/gkr/walk/{p}/cursor")
    assert cursor[-1].times[PROOF_TIME] == root.end_time
    assert cursor[-1].values["Points3D:positions"] == []

    # Per-layer seconds by kind: x = layer index, height = the span's duration.
    for kind in KINDS:
        [[values]] = rec.values(f"/proof/layer_seconds/{p}/{kind}", "BarChart:values")
        assert values["shape"] == [5]
        assert values["buffer"] == pytest.approx(
            [(s.end_time - s.start_time) / 1e9 if KINDS[i % 5] == kind else 0.0
             for i, s in sorted(layers.items())], rel=1e-5)
    texts = [r.values["TextLog:text"][0] for r in rec.rows(f"/logs/gkr/{p}")]
    assert any(t.startswith("[3] proved Mul") for t in texts)
    assert any("verification verified" in r.values["TextLog:text"][0]
               for r in rec.rows(f"/logs/proof/{p}"))
    # Static per-proof series styles name what is plotted, and the blueprint is there.
    # Short names without the proof's trace-id hash (issue 30: legends in a corner).
    assert rec.static(f"/gkr/claim/{p}")["SeriesPoints:names"] == ["claim fingerprint"]
    for path in (q for q in rec.paths() if not q.startswith("/trace/")):  # the walk's
        for key in ("SeriesPoints:names", "SeriesLines:names"):
            for name in rec.static(path).get(key) or []:
                assert p not in name and len(name) <= 24, (path, name)
    assert RrdReader(tmp_path / "proof.rrd").blueprints()


def _resolved(rec: readback.Recording) -> dict[str, list[tuple[object, ...]]]:
    """What the viewer resolves: per entity, the newest values at each time point.

    The per-kind layer-seconds chart is a summary updated once per export batch, so
    only its final state is independent of how the spans were batched.
    """
    out = {}
    for path in rec.paths():
        points = sorted((key, repr(sorted(v.items()))) for key, v in rec.latest(path).items())
        out[path] = points[-1:] if "/layer_seconds/" in path else points
    return out  # type: ignore[return-value]


def test_out_of_order_arrival_renders_the_same(tmp_path: Path) -> None:
    spans = record(layers=6)
    in_order = _resolved(export(tmp_path / "a.rrd", [spans]))
    # Parents first (the reverse of what processors do), layers shuffled, in one batch.
    shuffled = list(reversed(spans))
    random.Random(1).shuffle(shuffled)
    assert _resolved(export(tmp_path / "b.rrd", [shuffled])) == in_order
    # Children before parents across batches, layers in any order, one span per batch.
    layers = [s for s in spans if s.name == SpanName.LAYER]
    others = [s for s in spans if s.name != SpanName.LAYER]
    random.Random(2).shuffle(layers)
    batches = [[s] for s in layers] + [[s] for s in others]
    assert _resolved(export(tmp_path / "c.rrd", batches)) == in_order
    assert DROPS.total() == 0


def test_two_interleaved_proofs_never_overwrite(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    threads = [threading.Thread(target=prove, args=(tracer, n)) for n in (5, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    spans = list(memory.get_finished_spans())
    by_trace: dict[int, int] = {}
    for s in spans:
        assert s.context is not None
        by_trace[s.context.trace_id] = by_trace.get(s.context.trace_id, 0) + 1
    assert len(by_trace) == 2
    rec = export(tmp_path / "two.rrd", [spans[i:i + 3] for i in range(0, len(spans), 3)])
    keys = {f"{t:032x}"[:8]: n for t, n in by_trace.items()}
    layers_of = {k: n - 3 for k, n in keys.items()}  # proof, circuit, verify
    assert sorted(layers_of.values()) == [5, 7]
    for p, n in layers_of.items():
        assert len(rec.rows(f"/gkr/claim/{p}")) == n * ROUNDS_PER_LAYER
        assert rec.rows(f"/proof/progress/{p}")[-1].values["Scalars:scalars"] == [1.0]
        assert len(rec.values(f"/circuit/{p}/nodes", "Points3D:positions")[0]) == n
    # Shared walk entities keep both proofs, each on its own helix (stacked along y).
    node_rows = rec.rows(f"/{NODES}")
    assert len(node_rows) == 2 * (5 + 7)
    labels = {r.values["Points3D:labels"][0].split(" · ")[1].split()[0] for r in node_rows}
    assert labels == set(keys)
    offsets = {round(r.values["Points3D:positions"][0][1] - layout.node_position(
        r.times[LAYER], KINDS[r.times[LAYER] % 5])[1], 3) for r in node_rows}
    assert offsets == {0.0, -layout.PROOF_SPACING}
    assert len(rec.rows(f"/{ROUNDS}")) == 12 * ROUNDS_PER_LAYER
    assert DROPS.total() == 0


def _ctx(trace_id: int = 0xABCDEF, span_id: int = 1) -> SpanContext:
    return SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED))


def _span(name: str, attrs: dict[str, object], events: Sequence[Event] = (),
          ctx: SpanContext | None = None, start: int = 1_700_000_000_000_000_000,
          status: Status | None = None) -> ReadableSpan:
    return ReadableSpan(name=name, context=ctx if ctx is not None else _ctx(),
                        attributes=attrs, events=tuple(events), start_time=start,  # type: ignore[arg-type]
                        end_time=start + 1_000_000, status=status or Status(StatusCode.UNSET))


def test_malformed_and_foreign_spans_are_counted_not_fatal(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000_000_000
    good_round = Event(EventName.SUMCHECK_ROUND, {Attr.SUMCHECK_ROUND: 0, Attr.CLAIM: "(1,2,3,4)"},
                       timestamp=t0 + 10)
    bad_round = Event(EventName.SUMCHECK_ROUND, {Attr.SUMCHECK_ROUND: "zero"}, timestamp=t0 + 20)
    huge = MAX_CIRCUIT_NODES + 10
    spans = [
        _span(SpanName.LAYER, {Attr.LAYER_KIND: "MatMul"}),  # no index: skipped
        _span(SpanName.LAYER, {Attr.LAYER_INDEX: "3", Attr.LAYER_KIND: "MatMul"}),  # wrong type
        _span(SpanName.LAYER, {Attr.LAYER_INDEX: 2, Attr.LAYER_KIND: "Conv2D",  # unknown kind
                               Attr.SUMCHECK_ROUNDS: "many"}, [good_round, bad_round]),
        _span(SpanName.CIRCUIT_COMPILE, {Attr.CIRCUIT_NODE_INDEX: list(range(huge)),
                                         Attr.CIRCUIT_NODE_KIND: ["Add"] * 3,
                                         Attr.CIRCUIT_EDGE_FROM: [0, 99_999_999],
                                         Attr.CIRCUIT_EDGE_TO: [1]}),
        ReadableSpan(name=SpanName.PROOF, context=None),  # no context at all
        _span("db.query", {}, ctx=_ctx(span_id=9)),  # foreign, in a known proof
        _span("http.get", {}, ctx=_ctx(trace_id=0x999, span_id=5)),  # foreign, unrelated
    ]
    rec = export(tmp_path / "bad.rrd", [spans])
    drops = {(k.signal, k.reason): n for k, n in DROPS.snapshot().items() if k.sink == "rerun"}
    # Three contract spans the walk cannot use; two of them are still drawn in the trace
    # view, the one without a context cannot be drawn anywhere.
    assert drops[("proof_walk_spans", "invalid")] == 3
    assert drops[("spans", "invalid")] == 1
    assert drops[("span_events", "invalid")] == 1
    assert drops[("circuit_nodes", "size_cap")] == 10
    p = f"{0xABCDEF:032x}"[:8]
    # The unknown kind is drawn, in the Unknown colour; its valid round too.
    [start, _] = rec.rows(f"/{NODES}")
    assert start.values["Points3D:colors"][0] >> 8 == LAYER_KIND_COLOURS[LayerKind.UNKNOWN]
    assert len(rec.rows(f"/{ROUNDS}")) == 1
    assert len(rec.values(f"/circuit/{p}/nodes", "Points3D:positions")[0]) == MAX_CIRCUIT_NODES
    assert any("span db.query" in r.values["TextLog:text"][0]
               for r in rec.rows(f"/logs/proof/{p}"))
    # The unrelated foreign span is not mixed into the proof's logs, but it is drawn in
    # the trace view under its own trace (nothing lost silently).
    assert not any("http.get" in str(r.values) for path, rows in rec.entities.items()
                   if not path.startswith("/trace/") for r in rows)
    flames = [p for p in rec.paths() if p.startswith("/trace/flame/")]
    assert len(flames) == 2  # two traces (sharing their first 8 hex digits) kept apart
    labels = {path: [lab for r in rec.rows(path) for lab in r.values["Boxes2D:labels"]]
              for path in flames}
    [http] = [path for path, ls in labels.items() if any(x.startswith("http.get ") for x in ls)]
    assert labels[http] == [labels[http][0]]  # alone in its trace


def test_a_span_with_layer_attributes_is_a_layer_under_its_own_name(tmp_path: Path) -> None:
    # What `proofscope run --map snarkjs` emits: groth16.fft / groth16.msm phases that
    # keep their names and carry proof.layer.index + proof.layer.kind.
    t0 = 1_700_000_000_000_000_000
    ms = 1_000_000
    phases = [("groth16.fft", LayerKind.FFT, 3 * ms), ("groth16.msm", LayerKind.MSM, 7 * ms),
              ("groth16.msm", LayerKind.MSM, 5 * ms)]
    spans = [ReadableSpan(name=SpanName.PROOF, context=_ctx(span_id=1), attributes={
        Attr.PROOF_SYSTEM: "groth16"}, start_time=t0, end_time=t0 + 100 * ms)]
    t = t0 + ms
    for i, (name, kind, took) in enumerate(phases):
        spans.append(ReadableSpan(name=name, context=_ctx(span_id=10 + i), attributes={
            Attr.LAYER_INDEX: i, Attr.LAYER_KIND: kind.value}, start_time=t,
            end_time=t + took))
        t += took
    # Not layers: one attribute alone, and a contract span keeps its own role.
    spans.append(_span("groth16.qap", {Attr.LAYER_INDEX: 7}, ctx=_ctx(span_id=30), start=t))
    spans.append(_span(SpanName.WEIGHT_OPENING, {Attr.LAYER_INDEX: 8,
                                                Attr.LAYER_KIND: LayerKind.MSM.value},
                       ctx=_ctx(span_id=31), start=t))
    assert [is_layer(s) for s in spans] == [False, True, True, True, False, False]
    rec = export(tmp_path / "named.rrd", [spans])
    assert DROPS.total() == 0
    p = f"{0xABCDEF:032x}"[:8]
    node_rows = rec.rows(f"/{NODES}")
    assert sorted(r.times[LAYER] for r in node_rows) == [0, 0, 1, 1, 2, 2]
    labels = [r.values["Points3D:labels"][0] for r in node_rows]
    assert sum(lb.startswith("groth16.fft [0]") and "proved" in lb for lb in labels) == 1
    assert sum(lb.startswith("groth16.msm [") and "proved" in lb for lb in labels) == 2
    colours = {r.times[LAYER]: r.values["Points3D:colors"][0] >> 8 for r in node_rows
               if "proved" not in r.values["Points3D:labels"][0]}
    assert colours == {0: LAYER_KIND_COLOURS[LayerKind.FFT],
                       1: LAYER_KIND_COLOURS[LayerKind.MSM], 2: LAYER_KIND_COLOURS[LayerKind.MSM]}
    # Per-kind time: the measured durations, one bar per phase, MSM apart from FFT.
    [[fft]] = rec.values(f"/proof/layer_seconds/{p}/FFT", "BarChart:values")
    [[msm]] = rec.values(f"/proof/layer_seconds/{p}/MSM", "BarChart:values")
    assert fft["buffer"] == pytest.approx([0.003, 0.0, 0.0])
    assert msm["buffer"] == pytest.approx([0.0, 0.007, 0.005])
    assert not any("/layer_seconds/" in path and path.endswith("/Unknown")
                   for path in rec.paths())
    texts = [r.values["TextLog:text"][0] for r in rec.rows(f"/logs/gkr/{p}")]
    assert any(tx.startswith("[1] proved groth16.msm in 7.0") for tx in texts)
    proof_logs = [r.values["TextLog:text"][0] for r in rec.rows(f"/logs/proof/{p}")]
    assert any("span groth16.qap" in tx for tx in proof_logs)


def test_witness_data_only_when_enabled(tmp_path: Path) -> None:
    instrumentation.set_capture_witness(True)
    spans = record(witness=True)
    p = key_of(spans)
    hidden = export(tmp_path / "off.rrd", [spans], witness=False)
    assert not any(path.startswith("/inference") for path in hidden.paths())
    shown = export(tmp_path / "on.rrd", [spans], witness=True)
    means = shown.rows(f"/inference/stats/{p}/mean")
    assert sorted((r.times[LAYER], r.values["Scalars:scalars"][0]) for r in means) == \
        [(i, 0.5 * i) for i in range(5)]
    [[heat]] = shown.values(f"/inference/{p}/layer_4/attn_head_0", "Tensor:data")
    assert heat["shape"] == [2, 2]
    assert heat["buffer"] == pytest.approx([0.5, 0.5, 0.25, 0.75])
    assert DROPS.total() == 0


def test_attention_heatmap_shape_is_checked(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000_000_000

    def heat(side: int, n: int) -> Event:
        return Event(EventName.ATTENTION_HEATMAP, {
            Attr.LAYER_INDEX: 1, Attr.ATTENTION_HEAD: 0, Attr.ATTENTION_HEADS: 1,
            Attr.ATTENTION_SEQ_LEN: side, Attr.ATTENTION_SCORES: [0.5] * n}, timestamp=t0 + n)

    layer = _span(SpanName.LAYER, {Attr.LAYER_INDEX: 1, Attr.LAYER_KIND: "Attention"},
                  [heat(3, 6), heat(65, 65 * 65), heat(3, 9)])
    rec = export(tmp_path / "heat.rrd", [[layer]], witness=True)
    p = f"{0xABCDEF:032x}"[:8]
    [[ok]] = rec.values(f"/inference/{p}/layer_1/attn_head_0", "Tensor:data")
    assert ok["shape"] == [3, 3]
    warnings = [r.values["TextLog:text"][0] for r in rec.rows(f"/logs/gkr/{p}")
                if r.values["TextLog:level"] == ["WARN"]]
    assert len(warnings) == 2
    assert any("not a square" in w for w in warnings)
    assert any("exceed the 64×64 cap" in w for w in warnings)
    assert DROPS.total(sink="rerun", reason="invalid") == 2


def test_gpu_events_become_warnings_and_a_gap_table(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000_000_000
    events = [
        Event(EventName.GPU_ADAPTER_ACQUIRED, {Attr.GPU_BACKEND: "wgpu", Attr.HW_ID: "gpu0",
                                               Attr.HW_NAME: "llvmpipe"}, timestamp=t0 + 1),
        Event(EventName.GPU_CAPABILITY_UNSUPPORTED, {
            Attr.GPU_BACKEND: "wgpu", Attr.HW_ID: "gpu0", Attr.GPU_CAPABILITY: "occupancy",
            Attr.GPU_CAPABILITY_REASON: "unsupported"}, timestamp=t0 + 2),
        Event(EventName.GPU_FAULT, {Attr.GPU_BACKEND: "wgpu", Attr.HW_ID: "gpu0",
                                    Attr.GPU_FAULT_KIND: "device_lost"}, timestamp=t0 + 3),
    ]
    layer = _span(SpanName.LAYER, {Attr.LAYER_INDEX: 0, Attr.LAYER_KIND: "MatMul",
                                   Attr.HW_ID: "gpu0"}, events,
                  status=Status(StatusCode.ERROR, "device lost"))
    rec = export(tmp_path / "gpu.rrd", [[layer]])
    p = f"{0xABCDEF:032x}"[:8]
    logs = {r.values["TextLog:text"][0]: r.values["TextLog:level"][0]
            for r in rec.rows(f"/logs/gpu/{p}")}
    assert logs["GPU capability unavailable: occupancy (unsupported) on wgpu device gpu0"] == \
        "WARN"
    assert any(level == "WARN" and "device_lost" in text for text, level in logs.items())
    [table] = rec.values("/gpu/capability_gaps", "TextDocument:text")
    assert "| wgpu | gpu0 | occupancy | unsupported |" in table[0]
    assert rec.values("/gpu/capability_gaps", "TextDocument:media_type") == [["text/markdown"]]
    # A failed layer: red shell, an ERROR log line.
    [_, end] = rec.rows(f"/{NODES}")
    assert end.values["Points3D:colors"][0] >> 8 == 0xFF3B3B
    assert any(r.values["TextLog:level"] == ["ERROR"] for r in rec.rows(f"/logs/gkr/{p}"))


def test_claim_fingerprint_is_the_first_limb_mod_m31() -> None:
    assert claim_fingerprint("(5,1,2,3)") == pytest.approx(5 / M31)
    assert claim_fingerprint(str(M31 + 7)) == pytest.approx(7 / M31)
    big = (1 << 250) + 3
    assert claim_fingerprint(str(big)) == pytest.approx((big % M31) / M31)
    assert claim_fingerprint("not a field element") is None
    assert np.isfinite(claim_fingerprint("(0)") or 0.0)


def test_proof_keys_never_collide() -> None:
    from otel_proofscope.rerun.model import ProofRegistry

    proofs = ProofRegistry(max_proofs=2)
    a = proofs.get(0x1234ABCD_00000000_00000000_00000001)
    b = proofs.get(0x1234ABCD_00000000_00000000_00000002)  # same first 8 hex digits
    assert a.key == "1234abcd" and b.key != a.key and b.key.startswith("1234abcd")
    assert (a.ordinal, b.ordinal) == (0, 1)
    assert proofs.get(0x1234ABCD_00000000_00000000_00000001) is a
    proofs.get(3)  # evicts the least recently used (b)
    assert not proofs.known(0x1234ABCD_00000000_00000000_00000002) and proofs.evicted == 1


def test_derived_row_memo_stays_bounded_and_only_resends_identical_rows() -> None:
    from otel_proofscope.rerun.model import MAX_SENT_ROWS, ProofModel

    model = ProofModel(key="k", ordinal=0)
    n = 3 * MAX_SENT_ROWS
    assert len(model.diff("s", [(t, t * 2) for t in range(n)])) == n
    assert len(model.sent["s"]) <= MAX_SENT_ROWS
    assert model.diff("s", [(n - 1, (n - 1) * 2)]) == []  # a recent row: remembered
    assert model.diff("s", [(n - 1, 0)]) == [(n - 1, 0)]  # changed: sent again
    assert model.diff("s", [(0, 0)]) == [(0, 0)]  # forgotten: re-sent (identical)


@pytest.mark.parametrize("order", ["one batch", "finish order, one span per batch",
                                   "parents first, one span per batch"])
def test_circuit_backbone_rows_do_not_depend_on_arrival_order(order: str) -> None:
    # The sink coalesces whatever is queued, so which spans share a translation batch is
    # a matter of timing: the backbone drawn at the proof's start must not depend on it.
    from otel_proofscope.rerun.columns import Frame
    from otel_proofscope.rerun.model import ProofRegistry
    from otel_proofscope.rerun.translate import GapTable, SpanTranslator

    spans = record(layers=6)
    batches = {"one batch": [spans],
               "finish order, one span per batch": [[s] for s in spans],
               "parents first, one span per batch": [[s] for s in reversed(spans)]}[order]
    translator = SpanTranslator(ProofRegistry(), GapTable())
    times: list[int] = []
    for batch in batches:
        frame = Frame()
        translator.translate(batch, frame)
        for send in frame.sends():
            if send.path.endswith("/backbone"):
                times += send.indexes[0].as_arrow_array().cast("int64").to_pylist()
    proof = next(s for s in spans if s.name == SpanName.PROOF)
    circuit = next(s for s in spans if s.name == SpanName.CIRCUIT_COMPILE)
    assert sorted(times) == [proof.start_time, circuit.end_time]


_ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 22),
                       st.floats(allow_nan=True), st.text(max_size=8),
                       st.sampled_from([k.value for k in LayerKind]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.one_of(st.sampled_from([SpanName.LAYER, SpanName.WEIGHT_OPENING, "groth16.msm",
                               "plonk.fft"]),
              st.text(max_size=12).filter(lambda n: not n.startswith("proof"))),
    st.dictionaries(st.sampled_from([Attr.LAYER_INDEX, Attr.LAYER_KIND, Attr.SUMCHECK_ROUNDS]),
                    _ANY_VALUE)), max_size=8))
def test_any_name_with_any_layer_attributes_is_drawn_or_counted(
        plans: list[tuple[str, dict[str, object]]]) -> None:
    # A proof span first, so foreign spans have a known proof to be logged in.
    from otel_proofscope.rerun.columns import Frame
    from otel_proofscope.rerun.model import ProofRegistry
    from otel_proofscope.rerun.translate import SpanTranslator

    spans = [_span(SpanName.PROOF, {}, ctx=_ctx(span_id=1))]
    spans += [_span(name, {k: v for k, v in attrs.items() if v is not None},
                    ctx=_ctx(span_id=2 + i)) for i, (name, attrs) in enumerate(plans)]
    issues = SpanTranslator(ProofRegistry()).translate(spans, Frame())
    assert issues.errors == []
    layers = sum(is_layer(s) for s in spans)
    known = sum(s.name in (SpanName.PROOF, SpanName.WEIGHT_OPENING) or is_layer(s)
                for s in spans)
    assert issues.spans + issues.malformed_spans == known
    assert issues.foreign_drawn == len(spans) - known
    assert issues.spans >= known - layers  # only a layer can be unusable here
