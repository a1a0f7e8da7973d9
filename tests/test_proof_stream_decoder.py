"""The proof-stream decoder: every variant, precise errors, and fuzzing (no crash, all
rejections counted)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_proofscope.integrations.proof_stream import schema as s
from otel_proofscope.integrations.proof_stream.decoder import (
    MAX_LINE_BYTES,
    Note,
    Reason,
    decode_line,
    decode_object,
)
from otel_proofscope.integrations.proof_stream.stats import SIGNAL, StreamStats
from otel_proofscope.ledger import DROPS, REJECTIONS

FIXTURE = Path(__file__).parent / "fixtures" / "proof_stream_tiny_mlp.jsonl"

QM = {"a": 1, "b": 2, "c": 3, "d": (1 << 31) - 2}
SHAPE = [1, 512]

#: One serde_json encoding of every variant, in the shape the Rust sink writes.
SAMPLES: dict[str, dict[str, Any]] = {
    "CircuitCompiled": {"total_layers": 2, "input_shape": SHAPE, "output_shape": [1, 8],
                        "nodes": [{"layer_idx": 0, "node_id": 1, "kind": "MatMul",
                                   "input_shape": SHAPE, "output_shape": [1, 8],
                                   "trace_cost": 1048576, "input_layers": []}],
                        "has_simd": False, "simd_num_blocks": 0},
    "LayerActivation": {"layer_idx": 2, "node_id": 3, "kind": "Activation",
                        "output_shape": [1, 1024], "output_sample": [0, 1000, 4294967295],
                        "stats": {"mean": 0.5, "std_dev": 0.1, "min": 0.0, "max": 1.0,
                                  "sparsity": 0.2}},
    "AttentionHeatmap": {"layer_idx": 1, "head_idx": 0, "num_heads": 32, "seq_len": 2,
                         "scores": [1.0, 0.0, 0.25, 0.75]},
    "ProofStart": {"model_name": "qwen3-14b", "backend": "gpu", "num_layers": 40,
                   "input_shape": SHAPE, "output_shape": [1, 32000]},
    "LayerStart": {"layer_idx": 3, "kind": "MatMul", "input_shape": [1, 5120],
                   "output_shape": [1, 17408], "trace_cost": 89128960,
                   "claim_value_approx": 0.42, "gpu_device": 0},
    "SumcheckRound": {"layer_idx": 0, "round": 5, "total_rounds": 24,
                      "poly_deg2": {"c0": QM, "c1": QM, "c2": QM}, "poly_deg3": None,
                      "claim_value_approx": 1e-05, "challenge": QM},
    "LayerEnd": {"layer_idx": 2, "kind": "Sumcheck", "final_claim_value_approx": 0.0,
                 "duration_ms": 310, "rounds_completed": 24},
    "ProofComplete": {"duration_ms": 3040, "num_layer_proofs": 40,
                      "num_weight_openings": 80, "weight_binding_mode": "aggregated"},
    "WeightOpeningStart": {"weight_node_id": 7, "eval_point_len": 24},
    "WeightOpeningEnd": {"weight_node_id": 7, "duration_ms": 50,
                         "commitment_hex": "deadbeef01234567"},
    "AggregatedBindingStart": {"num_claims": 80, "num_matrices": 80},
    "AggregatedBindingEnd": {"duration_ms": 1200, "estimated_calldata_felts": 3000},
    "GpuStatus": {"devices": [{"device_id": 0, "device_name": "NVIDIA H100",
                               "utilization": 0.87, "free_memory_bytes": 40000000000}],
                  "matmul_done": 10, "matmul_total": 80, "layers_done": 5,
                  "layers_total": 40},
    "StarkProofStart": {"num_activation_layers": 40, "num_add_layers": 40,
                        "num_layernorm_layers": 40},
    "StarkProofEnd": {"duration_ms": 320},
    "Log": {"level": "Info", "message": "hello proof-stream"},
}


def line(variant: str, payload: dict[str, Any]) -> str:
    return json.dumps({variant: payload})


def to_json(value: Any) -> Any:
    """A decoded dataclass back in serde_json's shape (tuples → arrays)."""
    if hasattr(value, "__dataclass_fields__"):
        return {k: to_json(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    return value


def test_samples_cover_every_variant() -> None:
    assert set(SAMPLES) == set(s.VARIANTS)


@pytest.mark.parametrize("variant", sorted(SAMPLES))
def test_every_variant_round_trips_with_exact_field_names(variant: str) -> None:
    d = decode_line(line(variant, SAMPLES[variant]), 1)
    assert d.error is None and d.notes == ()
    assert type(d.event).__name__ == variant
    assert to_json(d.event) == SAMPLES[variant]


def test_options_may_be_null_or_absent_and_nan_floats_are_none() -> None:
    start = {k: v for k, v in SAMPLES["ProofStart"].items() if k != "model_name"}
    ev = decode_line(line("ProofStart", start), 1).event
    assert isinstance(ev, s.ProofStart) and ev.model_name is None
    layer = dict(SAMPLES["LayerStart"], gpu_device=None, claim_value_approx=None)
    ev2 = decode_line(line("LayerStart", layer), 2).event
    assert isinstance(ev2, s.LayerStart)
    assert ev2.gpu_device is None and ev2.claim_value_approx is None
    rnd = dict(SAMPLES["SumcheckRound"], poly_deg2=None,
               poly_deg3={"c0": QM, "c1": QM, "c2": QM, "c3": QM})
    ev3 = decode_line(line("SumcheckRound", rnd), 3).event
    assert isinstance(ev3, s.SumcheckRound) and ev3.poly_deg2 is None
    assert ev3.poly_deg3 is not None and len(ev3.poly_deg3.coefficients()) == 4


@pytest.mark.parametrize(("variant", "payload", "reason", "field", "text"), [
    ("LayerStart", {k: v for k, v in SAMPLES["LayerStart"].items() if k != "trace_cost"},
     Reason.MISSING_FIELD, "trace_cost", "missing"),
    ("LayerStart", dict(SAMPLES["LayerStart"], layer_idx=-1),
     Reason.INVALID_VALUE, "layer_idx", "unsigned"),
    ("LayerStart", dict(SAMPLES["LayerStart"], layer_idx=3.0),
     Reason.INVALID_VALUE, "layer_idx", "a number 3.0"),
    ("LayerStart", dict(SAMPLES["LayerStart"], layer_idx=True),
     Reason.INVALID_VALUE, "layer_idx", "a boolean"),
    ("SumcheckRound", dict(SAMPLES["SumcheckRound"],
                           poly_deg2={"c0": QM, "c1": dict(QM, c=1 << 32), "c2": QM}),
     Reason.INVALID_VALUE, "poly_deg2.c1.c", "32-bit"),
    ("CircuitCompiled", dict(SAMPLES["CircuitCompiled"], nodes=[{"layer_idx": 0}]),
     Reason.MISSING_FIELD, "nodes[0].node_id", "missing"),
    ("LayerEnd", dict(SAMPLES["LayerEnd"], kind="MatMul"),
     Reason.INVALID_VALUE, "kind", "Sumcheck, LogUp"),
    ("Log", {"level": "Loud", "message": "x"}, Reason.INVALID_VALUE, "level", "Loud"),
    ("GpuStatus", dict(SAMPLES["GpuStatus"], devices={"0": {}}),
     Reason.INVALID_VALUE, "devices", "an array"),
])
def test_errors_name_line_variant_and_field(variant: str, payload: dict[str, Any],
                                            reason: str, field: str, text: str) -> None:
    d = decode_line(line(variant, payload), 17)
    assert d.event is None and d.error is not None
    assert (d.error.line, d.error.reason, d.error.variant, d.error.field) == (
        17, reason, variant, field)
    msg = d.error.message()
    assert msg.startswith(f"line 17: {variant}.{field}: ") and text in msg


@pytest.mark.parametrize(("raw", "reason"), [
    ('{"Log":{"level":"Info"', Reason.MALFORMED_JSON),
    (b"\xff\xfe{}", Reason.NOT_UTF8),
    ("[1, 2]", Reason.NOT_AN_EVENT),
    ('"ProofStart"', Reason.NOT_AN_EVENT),
    ('{"Log": {"level": "Info", "message": "a"}, "StarkProofEnd": {"duration_ms": 1}}',
     Reason.NOT_AN_EVENT),
    ('{"KernelTimings": {"ns": 5}}', Reason.UNKNOWN_VARIANT),
    ("[" * 50_000 + "]" * 50_000, Reason.MALFORMED_JSON),
    ("9" * 5000, Reason.MALFORMED_JSON),
    ("x" * (MAX_LINE_BYTES + 1), Reason.LINE_TOO_LONG),
])
def test_malformed_input_is_an_error_not_an_exception(raw: str | bytes, reason: str) -> None:
    # The nesting case parses at the edge of the recursion limit; a finalizer of an
    # earlier test's garbage run by a GC pass in there could not even report itself.
    gc.collect()
    d = decode_line(raw, 9)
    assert d.error is not None and d.error.reason == reason
    assert d.error.message().startswith("line 9: ")


def test_unknown_fields_and_kinds_are_skipped_and_noted() -> None:
    payload = dict(SAMPLES["LayerStart"], kind="Conv2d", simd_lane=3)
    d = decode_line(line("LayerStart", payload), 4)
    assert isinstance(d.event, s.LayerStart) and d.event.kind == "Unknown"
    assert set(d.notes) == {("LayerStart.kind=Conv2d", Note.UNKNOWN_ENUM_VALUE),
                            ("LayerStart.simd_lane", Note.UNKNOWN_FIELD)}
    nested = dict(SAMPLES["GpuStatus"])
    nested["devices"] = [dict(nested["devices"][0], pcie_gen=5)]
    d2 = decode_line(line("GpuStatus", nested), 5)
    assert d2.event is not None
    assert d2.notes == (("GpuStatus.devices[0].pcie_gen", Note.UNKNOWN_FIELD),)


def test_blank_lines_are_neither_events_nor_errors() -> None:
    assert decode_line("   \n", 1).blank
    assert decode_line(b"", 2).blank


def test_fixture_decodes_with_exactly_the_planted_problems() -> None:
    results = [decode_line(raw, n) for n, raw in
               enumerate(FIXTURE.read_bytes().splitlines(), start=1)]
    errors = [(r.line, r.error.reason) for r in results if r.error]
    assert errors == [(13, Reason.MALFORMED_JSON), (33, Reason.UNKNOWN_VARIANT)]
    notes = [n for r in results for n in r.notes]
    assert notes == [("LayerEnd.gpu_kernel_ms", Note.UNKNOWN_FIELD)]
    kinds = {type(r.event).__name__ for r in results if r.event}
    assert kinds == set(s.VARIANTS)  # the fixture exercises every variant


# ── fuzzing ──────────────────────────────────────────────────────────────────────────

json_scalars = st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | \
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["a", "b", "c", "d", "layer_idx", "kind", "nodes", "c0", "level",
                         "message", "devices", "round", "scores", "x"]) | st.text(max_size=6),
        inner, max_size=6),
    max_leaves=30)


@st.composite
def mutated_events(draw: st.DrawFn) -> Any:
    """A valid sample with one field replaced, removed or added (deep mutations too)."""
    variant = draw(st.sampled_from(sorted(SAMPLES)))
    payload: Any = json.loads(json.dumps(SAMPLES[variant]))
    target = payload
    # walk down a random path of nested objects/arrays
    for _ in range(draw(st.integers(0, 3))):
        children = [k for k, v in (target.items() if isinstance(target, dict) else
                                   enumerate(target)) if isinstance(v, dict | list) and v]
        if not children:
            break
        target = target[draw(st.sampled_from(children))]
    op = draw(st.sampled_from(["replace", "remove", "add"]))
    if isinstance(target, dict) and target:
        key = draw(st.sampled_from(sorted(target)))
        if op == "replace":
            target[key] = draw(json_values)
        elif op == "remove":
            del target[key]
        else:
            target[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    elif isinstance(target, list) and target:
        target[draw(st.integers(0, len(target) - 1))] = draw(json_values)
    return {draw(st.sampled_from([variant, variant, variant.lower(), "Nope"])): payload}


def _check_accounting(raws: list[str | bytes]) -> None:
    DROPS.reset()
    REJECTIONS.reset()
    stats = StreamStats("fuzz")
    rejected = noted = 0
    for n, raw in enumerate(raws, start=1):
        d = decode_line(raw, n)
        assert (d.event is None) or (d.error is None)
        if d.error is not None:
            rejected += 1
            msg = d.error.message()
            assert msg.startswith(f"line {n}: ") and len(msg) < 400
        if d.event is not None:
            assert type(d.event).__name__ in s.VARIANTS
        noted += len(d.notes)
        if not d.blank:
            stats.record(d)
    assert stats.rejected == rejected
    assert DROPS.total(signal=SIGNAL, sink="fuzz") == rejected
    assert REJECTIONS.total() == rejected + noted


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(json_values.map(json.dumps), min_size=1, max_size=5))
def test_fuzz_random_json_never_crashes_and_every_rejection_is_counted(raws: list[str]) -> None:
    _check_accounting(list(raws))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=5))
def test_fuzz_random_bytes(raws: list[bytes]) -> None:
    _check_accounting(list(raws))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_events().map(json.dumps), min_size=1, max_size=4))
def test_fuzz_mutated_events(raws: list[str]) -> None:
    _check_accounting(list(raws))


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_fuzz_decode_object_directly(value: Any) -> None:
    d = decode_object(value, 1)
    assert (d.event is None) != (d.error is None)
