"""The layout follows the data (issue 30): panels for what a recording holds, updated
when a new kind of data arrives, side and time panels the same in every recording."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rerun.blueprint as rrb
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rerun.chunk import RrdReader

from otel_proofscope.diff.rerun_view import diff_blueprint
from otel_proofscope.instrumentation import CircuitNode, ProofTracer
from otel_proofscope.rerun import blueprint
from otel_proofscope.rerun.blueprint import METRICS, PROOF, TRACE, Contents, Layouts
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.layout import X_STEP


def views(bp: rrb.Blueprint) -> Iterator[rrb.View]:
    stack: list[object] = [bp.root_container]
    while stack:
        part = stack.pop()
        if isinstance(part, rrb.View):
            yield part
        else:
            stack.extend(getattr(part, "contents", []))


def names(bp: rrb.Blueprint) -> set[str]:
    return {str(v.name) for v in views(bp)}


def test_a_trace_without_contract_spans_gets_the_flame_chart_as_main_view() -> None:
    bp = blueprint.build(Contents(frozenset({TRACE})))
    assert names(bp) == {"Trace", "Span durations (ms)", "Span log"}
    root = bp.root_container
    assert isinstance(root, rrb.Horizontal)
    first = root.contents[0]
    assert isinstance(first, rrb.Spatial2DView) and first.name == "Trace"
    assert root.column_shares is not None
    # Metrics of such a trace (Chrome counters) come as a tab beside the span log.
    assert "Metrics" in names(blueprint.build(Contents(frozenset({TRACE, METRICS}))))


def test_contract_spans_bring_the_walk_claims_and_stats() -> None:
    proof_only = names(blueprint.build(Contents(frozenset({PROOF}))))
    assert {"ZK Proof Walk", "GKR Claim & Progress", "Round Time & GPU", "Logs"} <= proof_only
    assert "Trace" not in proof_only
    both = names(blueprint.build(Contents(frozenset({PROOF, TRACE}))))
    assert {"ZK Proof Walk", "GKR Claim & Progress", "Round Time & GPU", "Trace",
            "Span log", "Span durations (ms)", "Logs", "Layer stats"} <= both


def test_one_proof_is_named_once_in_the_walk_title() -> None:
    bp = blueprint.build(Contents(frozenset({PROOF, TRACE}), proof="0123abcd", proofs=1))
    assert "ZK Proof Walk · proof 0123abcd" in names(bp)
    several = blueprint.build(Contents(frozenset({PROOF, TRACE}), proofs=2))
    assert not any("proof 0" in n for n in names(several))


def test_layouts_change_only_when_a_new_kind_of_data_arrives() -> None:
    layouts = Layouts()
    assert layouts.current() is None  # nothing seen: no blueprint yet
    first = layouts.observe(["trace/flame/myprover/0123abcd", "trace/logs/myprover/0123abcd"])
    assert first is not None and "ZK Proof Walk" not in names(first)
    assert layouts.observe(["trace/durations/myprover/prove"]) is None
    # serve: the contract spans of a mapped prover arrive later
    second = layouts.observe(["gkr/claim/0123abcd", "gkr/walk/nodes"])
    assert second is not None
    assert {"ZK Proof Walk · proof 0123abcd", "Trace"} <= names(second)
    assert layouts.observe(["gkr/remaining/0123abcd"]) is None
    third = layouts.observe(["gkr/claim/89abcdef"])  # a second proof: no single id now
    assert third is not None and "ZK Proof Walk" in names(third)
    assert layouts.observe(["gkr/claim/77777777"]) is None
    # proof metrics are metrics, not the walk's series
    assert blueprint.group_kind("proof/duration/gkr") == METRICS
    assert blueprint.group_kind("/proof/progress/0123abcd") == PROOF


def _walk_eye(bp: rrb.Blueprint) -> object:
    (walk,) = [v for v in views(bp) if str(v.name).startswith("ZK Proof Walk")]
    return walk.properties.get("EyeControls3D")


def test_one_proof_gets_a_camera_framed_for_its_walk() -> None:
    # The viewer's own eye cut layer 0 of a 4-layer walk off (serve-map.png): one
    # proof's walk gets a camera that holds it; several proofs keep the viewer's.
    layouts = Layouts()
    first = layouts.observe(["gkr/claim/0123abcd", "gkr/walk/nodes"], walk_layers=lambda: 0)
    assert first is not None and _walk_eye(first) is None  # nothing to frame yet
    four = layouts.observe(["gkr/walk/nodes"], walk_layers=lambda: 3)
    assert four is not None and _walk_eye(four) is not None
    assert layouts.contents.walk_layers == 4
    # One blueprint per power of two, not per layer (each resets a moved camera).
    assert layouts.observe(["gkr/walk/nodes"], walk_layers=lambda: 4) is None
    eight = layouts.observe(["gkr/walk/nodes"], walk_layers=lambda: 5)
    assert eight is not None and layouts.contents.walk_layers == 8
    two = layouts.observe(["gkr/claim/89abcdef"], walk_layers=lambda: 9)
    assert two is not None and _walk_eye(two) is None

    def never() -> int:
        raise AssertionError("the walk's size is not asked for with several proofs")

    assert layouts.observe(["gkr/walk/nodes"], walk_layers=never) is None


def test_the_walk_camera_looks_at_the_middle_of_the_walk_from_far_enough() -> None:
    assert [blueprint.walk_class(n) for n in (0, 1, 4, 5, 8, 9, 100)] == [
        0, 4, 4, 8, 8, 16, 128]
    for layers in (4, 8, 16, 128):
        eye = blueprint.walk_eye(layers)
        pos = np.asarray(eye.position.as_arrow_array().to_pylist()[0])
        target = np.asarray(eye.look_target.as_arrow_array().to_pylist()[0])
        length = (layers - 1) * X_STEP
        assert target[0] == pytest.approx(length / 2)
        # Far enough that the whole walk fits a ~90 degree horizontal field of view.
        assert np.linalg.norm(pos - target) >= length / 2
        assert pos[1] > target[1]  # from above: bars do not hide the nodes behind them


def test_side_and_time_panels_are_collapsed_in_every_recording() -> None:
    contents = [Contents(frozenset(k)) for k in
                ({TRACE}, {PROOF}, {PROOF, TRACE}, {METRICS}, set())]
    for bp in [blueprint.build(c) for c in contents] + [diff_blueprint()]:
        for panel in (bp.blueprint_panel, bp.selection_panel, bp.time_panel):
            assert panel is not None and panel.state == "collapsed"


def _spans(contract: bool) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if contract:
        tracer = ProofTracer(provider)
        with tracer.proof(system="gkr", layers=2):
            with tracer.circuit_compile(nodes=[CircuitNode(0, "MatMul", 10, []),
                                               CircuitNode(1, "Add", 10, [0])]):
                pass
            for i in (1, 0):
                with tracer.layer(index=i, kind=("MatMul", "Add")[i], rounds=2,
                                  claim_initial=i):
                    for r in range(2):
                        time.sleep(0.0002)
                        tracer.sumcheck_round(r, [r, r + 1, r + 2], r + 5)
    else:
        tracer_ = provider.get_tracer("foreign")
        with tracer_.start_as_current_span("prove"), tracer_.start_as_current_span("fft"):
            time.sleep(0.0002)
    return list(memory.get_finished_spans())


def test_a_recording_gets_a_new_blueprint_when_contract_spans_follow_foreign_ones(
        tmp_path: Path) -> None:
    """As under ``proofscope serve --map``: foreign spans first, later a mapped proof."""
    path = tmp_path / "serve.rrd"
    exporter = RerunSpanExporter(f"file:{path}")
    exporter.export(_spans(contract=False))
    assert exporter.force_flush(30_000)
    exporter.export(_spans(contract=False))  # same kind: no new layout
    assert exporter.force_flush(30_000)
    exporter.export(_spans(contract=True))
    assert exporter.force_flush(30_000)
    # The proof's two layers were seen when the layout changed: its walk is framed.
    assert exporter.sink._layouts.contents.walk_layers == 4
    exporter.shutdown()
    assert len(RrdReader(path).blueprints()) == 2
