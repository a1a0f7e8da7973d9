"""Typed mirror of the stwo-ml ``proof_stream::ProofEvent`` JSON contract.

Field names are exactly the serde names of stwo-ml's Rust types; a bridge that
renamed them would silently miss data. Types follow serde_json's encoding: Rust tuples
are JSON arrays (``Shape``), ``Option<T>`` is ``null`` or absent, non-finite ``f32``
values arrive as ``null`` (serde_json cannot write NaN), unit enums are strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_proofscope.fields import M31

#: The M31 prime 2^31 − 1; a QM31 element is four M31 limbs.
M31_P = M31

Shape = tuple[int, ...]

#: ``LayerKind`` values (serde unit-variant names).
LAYER_KINDS: tuple[str, ...] = (
    "MatMul", "Activation", "LayerNorm", "RMSNorm", "Add", "Mul", "Attention", "Embedding",
    "Dequantize", "Quantize", "Input", "Unknown",
)
#: ``LayerProofKind`` values.
LAYER_PROOF_KINDS: tuple[str, ...] = ("Sumcheck", "LogUp", "Linear", "Skipped", "Deferred")
#: ``LogLevel`` values, least to most severe.
LOG_LEVELS: tuple[str, ...] = ("Trace", "Debug", "Info", "Warn", "Error")


# ── mirror types ─────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class SecureFieldMirror:
    """A QM31 element ``(a + b·i) + (c + d·i)·u`` as four M31 limbs (u32)."""

    a: int
    b: int
    c: int
    d: int

    def limbs(self) -> tuple[int, int, int, int]:
        return (self.a, self.b, self.c, self.d)


@dataclass(frozen=True, slots=True)
class RoundPolyViz:
    """Degree-2 round polynomial ``c0 + c1·x + c2·x²`` (monomial basis)."""

    c0: SecureFieldMirror
    c1: SecureFieldMirror
    c2: SecureFieldMirror

    def coefficients(self) -> tuple[SecureFieldMirror, ...]:
        return (self.c0, self.c1, self.c2)


@dataclass(frozen=True, slots=True)
class RoundPolyDeg3Viz:
    """Degree-3 round polynomial ``c0 + c1·x + c2·x² + c3·x³``."""

    c0: SecureFieldMirror
    c1: SecureFieldMirror
    c2: SecureFieldMirror
    c3: SecureFieldMirror

    def coefficients(self) -> tuple[SecureFieldMirror, ...]:
        return (self.c0, self.c1, self.c2, self.c3)


@dataclass(frozen=True, slots=True)
class CircuitNodeMeta:
    layer_idx: int
    node_id: int
    kind: str
    input_shape: Shape
    output_shape: Shape
    trace_cost: int
    input_layers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One device as stwo-ml reports it. Beware: its ``utilization`` is layer progress
    and its ``free_memory_bytes`` is the device's total memory (see the bridge)."""

    device_id: int
    device_name: str
    utilization: float | None
    free_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class ActivationStats:
    mean: float | None
    std_dev: float | None
    min: float | None
    max: float | None
    sparsity: float | None


# ── ProofEvent variants ──────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class CircuitCompiled:
    total_layers: int
    input_shape: Shape
    output_shape: Shape
    nodes: tuple[CircuitNodeMeta, ...]
    has_simd: bool
    simd_num_blocks: int


@dataclass(frozen=True, slots=True)
class LayerActivation:
    layer_idx: int
    node_id: int
    kind: str
    output_shape: Shape
    output_sample: tuple[int, ...]
    stats: ActivationStats


@dataclass(frozen=True, slots=True)
class AttentionHeatmap:
    layer_idx: int
    head_idx: int
    num_heads: int
    seq_len: int
    scores: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class ProofStart:
    model_name: str | None
    backend: str
    num_layers: int
    input_shape: Shape
    output_shape: Shape


@dataclass(frozen=True, slots=True)
class LayerStart:
    layer_idx: int
    kind: str
    input_shape: Shape
    output_shape: Shape
    trace_cost: int
    claim_value_approx: float | None
    gpu_device: int | None


@dataclass(frozen=True, slots=True)
class SumcheckRound:
    layer_idx: int
    round: int
    total_rounds: int
    poly_deg2: RoundPolyViz | None
    poly_deg3: RoundPolyDeg3Viz | None
    claim_value_approx: float | None


@dataclass(frozen=True, slots=True)
class LayerEnd:
    layer_idx: int
    kind: str  # a LayerProofKind, not a LayerKind
    final_claim_value_approx: float | None
    duration_ms: int
    rounds_completed: int


@dataclass(frozen=True, slots=True)
class ProofComplete:
    duration_ms: int
    num_layer_proofs: int
    num_weight_openings: int
    weight_binding_mode: str


@dataclass(frozen=True, slots=True)
class WeightOpeningStart:
    weight_node_id: int
    eval_point_len: int


@dataclass(frozen=True, slots=True)
class WeightOpeningEnd:
    weight_node_id: int
    duration_ms: int
    commitment_hex: str


@dataclass(frozen=True, slots=True)
class AggregatedBindingStart:
    num_claims: int
    num_matrices: int


@dataclass(frozen=True, slots=True)
class AggregatedBindingEnd:
    duration_ms: int
    estimated_calldata_felts: int


@dataclass(frozen=True, slots=True)
class GpuStatus:
    devices: tuple[GpuSnapshot, ...]
    matmul_done: int
    matmul_total: int
    layers_done: int
    layers_total: int


@dataclass(frozen=True, slots=True)
class StarkProofStart:
    num_activation_layers: int
    num_add_layers: int
    num_layernorm_layers: int


@dataclass(frozen=True, slots=True)
class StarkProofEnd:
    duration_ms: int


@dataclass(frozen=True, slots=True)
class Log:
    level: str
    message: str


ProofEvent = (
    CircuitCompiled | LayerActivation | AttentionHeatmap | ProofStart | LayerStart
    | SumcheckRound | LayerEnd | ProofComplete | WeightOpeningStart | WeightOpeningEnd
    | AggregatedBindingStart | AggregatedBindingEnd | GpuStatus | StarkProofStart
    | StarkProofEnd | Log
)

#: Variant name (the serde tag) → class. The class name is the tag.
VARIANTS: dict[str, type[ProofEvent]] = {
    cls.__name__: cls for cls in (
        CircuitCompiled, LayerActivation, AttentionHeatmap, ProofStart, LayerStart,
        SumcheckRound, LayerEnd, ProofComplete, WeightOpeningStart, WeightOpeningEnd,
        AggregatedBindingStart, AggregatedBindingEnd, GpuStatus, StarkProofStart,
        StarkProofEnd, Log,
    )
}


def variant_name(event: ProofEvent) -> str:
    return type(event).__name__
