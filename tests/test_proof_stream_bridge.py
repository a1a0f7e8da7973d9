"""The proof-stream bridge: a recorded stream replays into contract spans, honestly."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_proofscope import fields, instrumentation
from otel_proofscope.integrations.proof_stream.bridge import StreamBridge
from otel_proofscope.integrations.proof_stream.replay import replay
from otel_proofscope.integrations.proof_stream.sources import StreamSource
from otel_proofscope.ledger import DROPS
from otel_proofscope.semconv import Attr, EventName, Metric, SpanName, StreamAttr, StreamEvent

FIXTURE = Path(__file__).parent / "fixtures" / "proof_stream_tiny_mlp.jsonl"
P = (1 << 31) - 1


def fixture_events() -> list[tuple[int, str, dict[str, Any]]]:
    """(line, variant, payload) of every well-formed line, read independently."""
    out = []
    for n, raw in enumerate(FIXTURE.read_text().splitlines(), start=1):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        ((variant, payload),) = obj.items()
        out.append((n, variant, payload))
    return out


def bridge_for(pipeline: Any, **kw: Any) -> StreamBridge:
    return StreamBridge(tracer_provider=pipeline.telemetry.tracer_provider,
                        meter_provider=pipeline.telemetry.meter_provider, **kw)


def replay_fixture(pipeline: Any) -> tuple[StreamBridge, list[Any]]:
    bridge = bridge_for(pipeline, source="fixture")
    replay(StreamSource(FIXTURE), bridge)
    return bridge, pipeline.finished()


def by_name(spans: list[Any], name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


def layer_span(spans: list[Any], index: int) -> Any:
    (span,) = [s for s in by_name(spans, SpanName.LAYER)
               if s.attributes[Attr.LAYER_INDEX] == index]
    return span


def test_fixture_replays_into_one_trace_of_contract_spans(pipeline: Any) -> None:
    bridge, spans = replay_fixture(pipeline)
    (proof,) = by_name(spans, SpanName.PROOF)
    assert proof.parent is None
    assert proof.attributes[Attr.PROOF_SYSTEM] == "stwo-ml"
    assert proof.attributes[Attr.PROOF_MODEL_NAME] == "tiny-residual-mlp"
    assert proof.attributes[Attr.PROOF_LAYERS] == 6
    assert proof.attributes[Attr.PROOF_LAYER_PROOFS] == 5
    assert proof.attributes[Attr.PROOF_WEIGHT_OPENINGS] == 2
    assert {s.context.trace_id for s in spans} == {proof.context.trace_id}
    children = [s for s in spans if s is not proof]
    assert all(s.parent.span_id == proof.context.span_id for s in children)
    assert sorted(s.name for s in children) == sorted(
        [SpanName.CIRCUIT_COMPILE] + [SpanName.LAYER] * 6 + [SpanName.WEIGHT_OPENING] * 2
        + [SpanName.AGGREGATED_BINDING, SpanName.STARK])
    (circuit,) = by_name(spans, SpanName.CIRCUIT_COMPILE)
    assert list(circuit.attributes[Attr.CIRCUIT_EDGE_FROM]) == [0, 1, 2, 3, 1, 4]
    assert list(circuit.attributes[Attr.CIRCUIT_EDGE_TO]) == [1, 2, 3, 4, 4, 5]
    openings = {s.attributes[Attr.WEIGHT_NODE_ID]: s.attributes[Attr.WEIGHT_COMMITMENT]
                for s in by_name(spans, SpanName.WEIGHT_OPENING)}
    assert openings == {1: "3fa9c0d1e2b47a65", 3: "a17e55c09b3d2f48"}
    (binding,) = by_name(spans, SpanName.AGGREGATED_BINDING)
    assert binding.attributes[Attr.BINDING_CALLDATA_FELTS] == 316
    # The seed sends no LayerEnd for its Input layer: closed, and marked as such.
    assert layer_span(spans, 0).attributes[StreamAttr.UNTERMINATED] is True
    assert all(StreamAttr.UNTERMINATED not in layer_span(spans, i).attributes
               for i in range(1, 6))
    assert bridge.stats.decoded == 42
    # A recorded file: span times are replay times, and every span says so.
    assert {s.attributes[StreamAttr.TIMING] for s in spans} == {"replay"}


def test_rounds_carry_exact_evaluations_and_the_next_claim_and_nothing_invented(
        pipeline: Any) -> None:
    _bridge, spans = replay_fixture(pipeline)
    rounds = [(n, p) for n, v, p in fixture_events() if v == "SumcheckRound"]
    starts = {p["layer_idx"]: p for _, v, p in fixture_events() if v == "LayerStart"}
    assert len(rounds) == 8
    by_layer: dict[int, list[dict[str, Any]]] = {}
    for _n, r in rounds:
        by_layer.setdefault(r["layer_idx"], []).append(r)
    for layer_idx, layer_rounds in by_layer.items():
        span = layer_span(spans, layer_idx)
        events = [e for e in span.events if e.name == EventName.SUMCHECK_ROUND]
        assert [e.attributes[Attr.SUMCHECK_ROUND] for e in events] == [
            r["round"] for r in layer_rounds]
        for i, (r, event) in enumerate(zip(layer_rounds, events, strict=True)):
            c = r["poly_deg2"]
            # evaluations at t = 0, 1, 2 of c0 + c1 t + c2 t^2, limb-wise mod p
            evals = [tuple((c["c0"][k] + c["c1"][k] * t + c["c2"][k] * t * t) % P
                           for k in "abcd") for t in range(3)]
            assert [fields.parse_canonical(x)
                    for x in event.attributes[Attr.SUMCHECK_POLY]] == evals
            assert event.attributes[Attr.SUMCHECK_DEGREE] == 2
            claim_before = tuple((a + b) % P for a, b in zip(evals[0], evals[1], strict=True))
            if i == 0:
                # The layer's initial claim is round 0's p(0)+p(1); its limb a matches
                # the producer's normalized approximation of that claim.
                assert span.attributes[Attr.CLAIM_INITIAL] == fields.canonical(claim_before)
                assert math.isclose(claim_before[0] / P,
                                    starts[layer_idx]["claim_value_approx"], abs_tol=1e-6)
            else:  # the previous round's claim is the claim this round reduces
                assert fields.parse_canonical(
                    events[i - 1].attributes[Attr.CLAIM]) == claim_before
            assert span.attributes[Attr.SUMCHECK_ROUNDS] == r["total_rounds"]
        # the claim after the last round is not in the stream: absent, not invented
        assert Attr.CLAIM not in events[-1].attributes
    invented = {r["claim_value_approx"] for _, r in rounds}
    for span in spans:
        for e in span.events:
            assert not invented & {v for v in e.attributes.values() if isinstance(v, float)}


def test_malformed_line_is_reported_with_its_number_and_the_rest_arrives(
        pipeline: Any) -> None:
    bridge, spans = replay_fixture(pipeline)
    assert [(e.line, e.reason) for e in bridge.stats.errors] == [
        (13, "malformed_json"), (33, "unknown_variant")]
    report = "\n".join(bridge.report_lines())
    assert "line 13: malformed JSON" in report
    assert "line 33: KernelTimings: unknown event variant" in report
    assert "unknown field LayerEnd.gpu_kernel_ms" in report
    later_layers = {p["layer_idx"] for n, v, p in fixture_events()
                    if v == "LayerStart" and n > 13}
    assert later_layers == {3, 2, 1, 0}
    assert all(layer_span(spans, i) for i in later_layers)
    assert DROPS.total(signal="stream_events", sink="fixture", reason="invalid") == 2


def test_durations_come_only_from_what_the_stream_measured(pipeline: Any) -> None:
    _bridge, spans = replay_fixture(pipeline)
    ends = {p["layer_idx"]: p["duration_ms"] for _, v, p in fixture_events() if v == "LayerEnd"}
    for index, ms in ends.items():
        attrs = layer_span(spans, index).attributes
        if ms > 0:
            assert attrs[StreamAttr.DURATION] == ms / 1000
        else:
            assert StreamAttr.DURATION not in attrs  # 0 means "not measured" in the seed
    points = pipeline.metric_points()
    layer_hist = points[Metric.PROOF_LAYER_DURATION.name]  # one point per layer kind
    measured = [ms / 1000 for ms in ends.values() if ms > 0]
    assert sum(p.count for p in layer_hist) == len(measured)
    assert math.isclose(sum(p.sum for p in layer_hist), sum(measured))
    kinds = {p["layer_idx"]: p["kind"] for _, v, p in fixture_events() if v == "LayerStart"}
    assert {p.attributes[Attr.LAYER_KIND] for p in layer_hist} == {
        kinds[i] for i, ms in ends.items() if ms > 0}
    (proof_hist,) = points[Metric.PROOF_DURATION.name]
    assert (proof_hist.count, proof_hist.sum) == (1, 0.097)
    rounds = points[Metric.PROOF_SUMCHECK_ROUND_COUNT.name]
    assert sum(p.value for p in rounds) == 8


def test_gpu_status_is_labelled_as_progress_never_as_gpu_utilization(pipeline: Any) -> None:
    _bridge, spans = replay_fixture(pipeline)
    statuses = [p for _, v, p in fixture_events() if v == "GpuStatus"]
    events = [e for s in spans for e in s.events if e.name == StreamEvent.GPU_STATUS]
    assert len(events) == len(statuses) == 5
    for e, st in zip(events, statuses, strict=True):
        assert e.attributes[StreamAttr.LAYER_PROGRESS] == pytest.approx(
            st["devices"][0]["utilization"])
        assert e.attributes[StreamAttr.LAYERS_DONE] == st["layers_done"]
        assert "layer progress" in e.attributes[Attr.PROOFSCOPE_NOTE]
    assert Metric.HW_GPU_UTILIZATION.name not in pipeline.metric_points()
    for s in spans:
        keys = set(s.attributes) | {k for e in s.events for k in e.attributes}
        assert not {k for k in keys if k.startswith("hw.gpu")}


def test_lagged_warning_counts_the_lost_events(pipeline: Any) -> None:
    bridge, spans = replay_fixture(pipeline)
    assert bridge.stats.lagged == 3
    assert DROPS.total(signal="stream_events", reason="queue_full") == 3
    logs = [e for s in spans for e in s.events if e.name == EventName.LOG]
    assert [e.attributes[StreamAttr.LOG_MESSAGE] for e in logs] == [
        "lagged 3 events", "stark: 2 components"]


def test_witness_events_only_with_capture_enabled(pipeline: Any) -> None:
    bridge, spans = replay_fixture(pipeline)
    assert bridge.witness_skipped == 3
    assert not [e for s in spans for e in s.events
                if e.name in (EventName.LAYER_ACTIVATION, EventName.ATTENTION_HEATMAP)]
    pipeline.memory.clear()
    instrumentation.set_capture_witness(True)
    _bridge, spans = replay_fixture(pipeline)
    act = {s.attributes[Attr.LAYER_INDEX]: e for s in by_name(spans, SpanName.LAYER)
           for e in s.events if e.name == EventName.LAYER_ACTIVATION}
    assert sorted(act) == [1, 2]
    assert act[2].attributes[Attr.ACTIVATION_MEAN] == pytest.approx(0.24)
    (heat,) = [e for e in layer_span(spans, 2).events if e.name == EventName.ATTENTION_HEATMAP]
    (raw,) = [p for _, v, p in fixture_events() if v == "AttentionHeatmap"]
    assert heat.attributes[Attr.ATTENTION_SEQ_LEN] == 4
    assert list(heat.attributes[Attr.ATTENTION_SCORES]) == pytest.approx(raw["scores"])


def feed(bridge: StreamBridge, *events: dict[str, Any]) -> None:
    for n, ev in enumerate(events, start=1):
        bridge.feed_line(json.dumps(ev), n)


LAYER = {"layer_idx": 1, "kind": "MatMul", "input_shape": [1, 2], "output_shape": [1, 2],
         "trace_cost": 4, "claim_value_approx": 0.5, "gpu_device": None}
QM = {"a": 1, "b": 0, "c": 0, "d": 0}


def test_out_of_order_events_are_counted_and_spans_still_close(pipeline: Any) -> None:
    bridge = bridge_for(pipeline, source="broken")
    feed(bridge,
         {"LayerEnd": {"layer_idx": 9, "kind": "Sumcheck", "final_claim_value_approx": 0.0,
                       "duration_ms": 0, "rounds_completed": 0}},
         {"ProofStart": {"model_name": None, "backend": "cpu", "num_layers": 1,
                         "input_shape": [1, 2], "output_shape": [1, 2]}},
         {"SumcheckRound": {"layer_idx": 1, "round": 0, "total_rounds": 1,
                            "poly_deg2": {"c0": QM, "c1": QM, "c2": QM}, "poly_deg3": None,
                            "claim_value_approx": 0.0}},
         {"LayerStart": LAYER},
         {"SumcheckRound": {"layer_idx": 1, "round": 0, "total_rounds": 1,
                            "poly_deg2": None, "poly_deg3": None, "claim_value_approx": 0.0}},
         {"WeightOpeningStart": {"weight_node_id": 4, "eval_point_len": 2}},
         {"WeightOpeningEnd": {"weight_node_id": 5, "duration_ms": 1,
                               "commitment_hex": "00"}})
    bridge.close()
    problems = bridge.stats.bridge_problems
    assert problems == {"LayerEnd without a matching start": 1,
                        "SumcheckRound outside its layer": 1,
                        "SumcheckRound without a round polynomial": 1,
                        "WeightOpeningEnd without a matching start": 1,
                        "proofs without ProofComplete": 1}
    spans = pipeline.finished()
    (proof,) = by_name(spans, SpanName.PROOF)
    assert proof.status.status_code.name == "ERROR"
    assert all(s.attributes.get(StreamAttr.UNTERMINATED) for s in spans)
    assert len(spans) == 3  # proof, layer, weight opening: all ended


def test_circuit_before_proof_start_lands_inside_the_proof(pipeline: Any) -> None:
    bridge = bridge_for(pipeline)
    node = {"layer_idx": 0, "node_id": 0, "kind": "MatMul", "input_shape": [1, 2],
            "output_shape": [1, 2], "trace_cost": 4, "input_layers": []}
    feed(bridge,
         {"CircuitCompiled": {"total_layers": 1, "input_shape": [1, 2], "output_shape": [1, 2],
                              "nodes": [node], "has_simd": True, "simd_num_blocks": 4}},
         {"ProofStart": {"backend": "cpu", "num_layers": 1, "input_shape": [1, 2],
                         "output_shape": [1, 2]}},
         {"ProofComplete": {"duration_ms": 0, "num_layer_proofs": 0,
                            "num_weight_openings": 0, "weight_binding_mode": "none"}})
    bridge.close()
    spans = pipeline.finished()
    (proof,) = by_name(spans, SpanName.PROOF)
    (circuit,) = by_name(spans, SpanName.CIRCUIT_COMPILE)
    assert circuit.parent.span_id == proof.context.span_id
    assert circuit.attributes[StreamAttr.CIRCUIT_SIMD_BLOCKS] == 4
    assert proof.status.status_code.name == "UNSET"
    assert StreamAttr.DURATION not in proof.attributes
    assert Metric.PROOF_DURATION.name not in pipeline.metric_points()


def test_attached_root_is_annotated_not_duplicated(pipeline: Any) -> None:
    with pipeline.tracer.proof(system="stwo-ml", backend="cuda") as root:
        bridge = bridge_for(pipeline, root=root, root_backend_known=True)
        feed(bridge,
             {"ProofStart": {"model_name": "m", "backend": "gpu", "num_layers": 1,
                             "input_shape": [1, 2], "output_shape": [1, 2]}},
             {"LayerStart": LAYER},
             {"ProofComplete": {"duration_ms": 5, "num_layer_proofs": 1,
                                "num_weight_openings": 0, "weight_binding_mode": "x"}})
        bridge.close()
    spans = pipeline.finished()
    (proof,) = by_name(spans, SpanName.PROOF)
    (layer,) = by_name(spans, SpanName.LAYER)
    assert layer.parent.span_id == proof.context.span_id
    assert layer.attributes[StreamAttr.UNTERMINATED] is True  # ProofComplete ended it
    assert proof.attributes[Attr.PROOF_MODEL_NAME] == "m"
    assert proof.attributes[Attr.PROOF_BACKEND] == "cuda"  # the caller's, not "gpu"
    assert proof.attributes[Attr.PROOF_LAYER_PROOFS] == 1
    assert proof.attributes[StreamAttr.DURATION] == 0.005


def test_replay_writes_a_rerun_recording(tmp_path: Path) -> None:
    pytest.importorskip("otel_proofscope.rerun.exporter",
                        reason="the Rerun exporter is not in this build yet")
    import re

    from rerun.chunk import RrdReader

    rrd = tmp_path / "stream.rrd"
    proc = subprocess.run(  # a subprocess: the CLI installs global providers
        [sys.executable, "-m", "otel_proofscope", "replay", str(FIXTURE), "--out",
         str(tmp_path), "--rerun", f"file:{rrd}"], capture_output=True, text=True,
        timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    assert proc.returncode == 0, proc.stderr
    paths = {str(c.entity_path) for c in RrdReader(str(rrd)).stream().collect().stream()}
    from otel_proofscope.rerun import readback

    labels = readback.read(rrd).values("/gkr/walk/nodes", "Points3D:labels")
    walked = {int(m.group(1)) for row in labels for label in row
              if (m := re.search(r"\[(\d+)\]", label))}
    assert walked == {0, 1, 2, 3, 4, 5}
    # replay times are not the prover's: no duration series for this proof
    assert not [p for p in paths if "layer_seconds" in p or "round_ms" in p
                or "binding_ms" in p]
    assert any(re.search(r"^/circuit/.*/edges$", p) for p in paths)
    assert any(p.startswith("/logs/") for p in paths)
    # The stream's fake "utilization" must not turn into a GPU plot.
    assert not [p for p in paths if "gpu" in p.lower() and "util" in p.lower()]


@pytest.mark.parametrize("capture", [False, True], ids=["capture-off", "capture-on"])
def test_non_square_heatmap_is_rejected_with_its_line_and_one_warning(
        pipeline: Any, capture: bool, caplog: pytest.LogCaptureFixture,
        request: pytest.FixtureRequest) -> None:
    """Validated at decoding, whether or not witness data is captured: a short field
    (no sentence), the right reason, the line number, one warning line."""
    from otel_proofscope.ledger import REJECTIONS

    instrumentation.set_capture_witness(capture)
    bridge = bridge_for(pipeline, source="heat")
    before = REJECTIONS.snapshot()
    heat = {"layer_idx": 1, "head_idx": 0, "num_heads": 1, "seq_len": 3,
            "scores": [0.1] * 8}  # 8 ≠ 3²
    # The proof and layer it opens stay current in this thread until the bridge closes;
    # left open they would become the parent of every later test's root span.
    request.addfinalizer(bridge.close)
    with caplog.at_level("WARNING"):
        feed(bridge,
             {"ProofStart": {"model_name": None, "backend": "cpu", "num_layers": 1,
                             "input_shape": [1, 2], "output_shape": [1, 2]}},
             {"LayerStart": LAYER},
             {"AttentionHeatmap": heat})
    after = REJECTIONS.snapshot()
    new = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert new == {("stream.AttentionHeatmap.scores", "invalid_value"): 1}
    assert bridge.stats.rejected == 1 and bridge.stats.rejected_by_reason == {
        "invalid_value": 1}
    warnings = [r.getMessage() for r in caplog.records if "AttentionHeatmap" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "line 3: AttentionHeatmap.scores: expected min(seq_len, 64)² = 9 scores for " \
           "seq_len 3, got 8" in warnings[0]
    assert bridge.witness_skipped == 0  # rejected before witness handling
    report = "\n".join(bridge.report_lines())
    assert "rejected 1 line(s): 1 invalid_value" in report and "line 3:" in report
    assert "whose scores" not in report
