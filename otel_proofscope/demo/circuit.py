"""The demo's layered circuit: a small ternary-quantized network over M31.

Activations are (rows, width) tensors of M31 elements (signed integers map to their
representatives mod p). Layers, in a repeating pattern:

* ``MatMul``      Y = X·W, W (width × width) a signed permutation: ternary weights in
                  {−1, 0, 1}, one non-zero per column     — sumcheck over the inner dim, degree 2
* ``Add``         Y = X + 1·bᵀ, bias b (width) in {−1, 0, 1}  — linear, no rounds
* ``Activation``  Y = X ⊙ X (square activation)            — sumcheck with eq, degree 3
* ``Mul``         Y = X ⊙ 1·sᵀ, per-channel sign s ∈ {−1, 1}  — sumcheck with eq, degree 3
* ``Attention``   Y = A·X, A (rows × rows) a fixed causal hard-attention matrix: each
                  token attends to one earlier (or its own) token (token mixing)
                                                           — sumcheck over tokens, degree 2

Why ternary: the circuit has no rescaling step, and without one a square activation
doubles the bit width every time, so any wider range wraps mod p within a few layers
(then the "statistics" are of pseudorandom field elements). With values in {−1, 0, 1}
per column, every layer maps that set into itself, so a network of any depth stays
quantized. The weights are drawn so that holds (each bias is chosen against the column's
interval), and :mod:`~otel_proofscope.demo.ranges` proves it by interval arithmetic over
the public input and weights; :func:`build_network` refuses a network that could wrap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from otel_proofscope.demo import ranges
from otel_proofscope.demo.field import P, U64Array, m31_array, m31_matmul
from otel_proofscope.demo.mle import log2_exact
from otel_proofscope.instrumentation import CircuitNode
from otel_proofscope.semconv import LayerKind, LayerProofKind

PATTERN: tuple[LayerKind, ...] = (
    LayerKind.MATMUL, LayerKind.ADD, LayerKind.ACTIVATION, LayerKind.MUL, LayerKind.ATTENTION,
)

_PU = np.uint64(P)

#: Hash-query budget the Fiat–Shamir soundness figure assumes (2^40 BLAKE2s calls).
HASH_QUERIES_LOG2 = 40


@dataclass
class LayerSpec:
    """Public description of one layer: kind, shapes and (public, committed) weights."""

    index: int
    kind: LayerKind
    rows: int
    width: int
    weight: U64Array | None = None

    @property
    def input_shape(self) -> tuple[int, int]:
        return (self.rows, self.width)

    @property
    def output_shape(self) -> tuple[int, int]:
        return (self.rows, self.width)

    @property
    def proof_kind(self) -> LayerProofKind:
        return LayerProofKind.LINEAR if self.kind is LayerKind.ADD else LayerProofKind.SUMCHECK

    @property
    def degree(self) -> int:
        """Degree of each round polynomial (0 for linear layers)."""
        return {LayerKind.MATMUL: 2, LayerKind.ATTENTION: 2, LayerKind.MUL: 3,
                LayerKind.ACTIVATION: 3}.get(self.kind, 0)

    @property
    def rounds(self) -> int:
        n, w = log2_exact(self.rows), log2_exact(self.width)
        return {LayerKind.MATMUL: w, LayerKind.ATTENTION: n, LayerKind.MUL: n + w,
                LayerKind.ACTIVATION: n + w}.get(self.kind, 0)

    @property
    def trace_cost(self) -> int:
        """Multiplications the layer's forward pass performs."""
        n, w = self.rows, self.width
        if self.kind is LayerKind.MATMUL:
            return n * w * w
        if self.kind is LayerKind.ATTENTION:
            return n * n * w
        return n * w

    def forward(self, x: U64Array, matmul: Callable[[U64Array, U64Array], U64Array]
                ) -> U64Array:
        w = self.weight
        if self.kind is LayerKind.MATMUL:
            assert w is not None
            return matmul(x, w)
        if self.kind is LayerKind.ATTENTION:
            assert w is not None
            return matmul(w, x)
        if self.kind is LayerKind.ADD:
            assert w is not None
            return (x + w[np.newaxis, :]) % _PU
        if self.kind is LayerKind.MUL:
            assert w is not None
            return (x * w[np.newaxis, :]) % _PU
        if self.kind is LayerKind.ACTIVATION:
            return (x * x) % _PU
        raise ValueError(f"layer {self.index}: unsupported kind {self.kind}")

    def attention_scores(self) -> list[list[float]]:
        """The score matrix exactly as the circuit multiplies by it (what the heatmap shows)."""
        assert self.kind is LayerKind.ATTENTION and self.weight is not None
        return signed(self.weight).tolist()  # type: ignore[no-any-return]


@dataclass
class Network:
    name: str
    rows: int
    width: int
    input: U64Array
    layers: list[LayerSpec] = field(default_factory=list)

    @property
    def input_shape(self) -> tuple[int, int]:
        return (self.rows, self.width)

    @property
    def output_shape(self) -> tuple[int, int]:
        return (self.rows, self.width)

    def circuit_nodes(self) -> list[CircuitNode]:
        return [CircuitNode(index=layer.index, kind=layer.kind.value,
                            trace_cost=layer.trace_cost,
                            inputs=(layer.index - 1,) if layer.index else ())
                for layer in self.layers]

    def forward(self, matmul: Callable[[U64Array, U64Array], U64Array] = m31_matmul
                ) -> list[U64Array]:
        """All activations: ``[input, out_0, …, out_{L-1}]``."""
        acts = [self.input]
        for layer in self.layers:
            acts.append(layer.forward(acts[-1], matmul))
        return acts

    def total_rounds(self) -> int:
        return sum(layer.rounds for layer in self.layers)

    def soundness_bits(self) -> float:
        """−log2 of the interactive soundness error (see docs/prover.md).

        Schwartz–Zippel over QM31 (|F| = p^4): the random output point costs
        ``log2(rows·width)/|F|``; each sumcheck round of degree d costs ``d/|F|``; the
        union bound adds them. Linear layers and the final checks are exact.
        """
        out_vars = log2_exact(self.rows) + log2_exact(self.width)
        numerator = out_vars + sum(layer.rounds * layer.degree for layer in self.layers)
        return 4 * math.log2(P) - math.log2(numerator)

    def fiat_shamir_bits(self, hash_queries_log2: int = HASH_QUERIES_LOG2) -> float:
        """−log2 of the non-interactive (Fiat–Shamir) soundness error for an adversary
        making 2^``hash_queries_log2`` BLAKE2s queries (see docs/prover.md).

        In the random-oracle model the protocol's round-by-round error is the largest
        error of one challenge: m_out/|F| for the output point (a multilinear polynomial
        in m_out variables, drawn at once) or d/|F| for a sumcheck round. An adversary
        making T queries succeeds with probability ≤ T·that/|F|, plus T²/2^256 for a
        BLAKE2s-256 collision.
        """
        out_vars = log2_exact(self.rows) + log2_exact(self.width)
        d_max = max([out_vars, *(layer.degree for layer in self.layers)])
        t = 2.0 ** hash_queries_log2
        error = t * d_max / float(P) ** 4 + t * t / 2.0 ** 256
        return -math.log2(error)


def _attention_matrix(rows: int, rng: np.random.Generator) -> U64Array:
    """Causal hard attention: row i has a single 1, at a token among the last 4 ≤ i."""
    a = np.zeros((rows, rows), dtype=np.int64)
    for i in range(rows):
        a[i, rng.integers(max(0, i - 3), i + 1)] = 1
    return m31_array(a)


def _signed_permutation(width: int, rng: np.random.Generator) -> U64Array:
    w = np.zeros((width, width), dtype=np.int64)
    w[rng.permutation(width), np.arange(width)] = rng.choice((-1, 1), size=width)
    return m31_array(w)


def _bias(lo: np.ndarray, hi: np.ndarray,  # type: ignore[type-arg]
          rng: np.random.Generator) -> U64Array:
    """Per column, a bias in {−1, 0, 1} that keeps the column inside [−1, 1]."""
    choices = [[b for b in (-1, 0, 1) if a + b >= -1 and c + b <= 1]
               for a, c in zip(lo.tolist(), hi.tolist(), strict=True)]
    return m31_array([int(rng.choice(c)) for c in choices])


def build_network(layers: int = 8, width: int = 32, rows: int | None = None, seed: int = 0,
                  kinds: Sequence[LayerKind] | None = None) -> Network:
    """A deterministic quantized network; ``kinds`` overrides the repeating pattern."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    log2_exact(width, "width")
    rows = rows if rows is not None else min(width, 64)
    log2_exact(rows, "rows")
    if width < 2 or rows < 2:
        raise ValueError("width and rows must be at least 2")
    plan = list(kinds) if kinds is not None else [PATTERN[i % len(PATTERN)]
                                                  for i in range(layers)]
    rng = np.random.default_rng(seed)
    # Each input column is one-signed ({0, 1} or {−1, 0}), so biases have room to move.
    x0 = m31_array(rng.integers(0, 2, size=(rows, width)) * rng.choice((-1, 1), size=width))
    bounds = ranges.input_bounds(x0)
    proven: list[ranges.Bounds] = []
    specs: list[LayerSpec] = []
    for i, kind in enumerate(plan):
        weight: U64Array | None
        if kind is LayerKind.MATMUL:
            weight = _signed_permutation(width, rng)
        elif kind is LayerKind.ADD:
            weight = _bias(*bounds, rng)
        elif kind is LayerKind.MUL:
            weight = m31_array(rng.choice((-1, 1), size=width))
        elif kind is LayerKind.ATTENTION:
            weight = _attention_matrix(rows, rng)
        elif kind is LayerKind.ACTIVATION:
            weight = None
        else:
            raise ValueError(f"unsupported layer kind {kind}")
        specs.append(LayerSpec(i, kind, rows, width, weight))
        bounds = ranges.layer_bounds(kind, weight, bounds)
        proven.append(bounds)
    net = Network(f"ternary-mlp-{len(plan)}x{width}", rows, width, x0, specs)
    problem = ranges.first_wrap(net, proven)
    if problem is not None:  # cannot happen with the draws above; the proof is the check
        raise ValueError(f"network would not stay quantized: {problem}")
    return net


def signed(values: U64Array) -> np.ndarray:  # type: ignore[type-arg]
    """Centered representatives in (−p/2, p/2], as float64 (for statistics)."""
    v = values.astype(np.int64)
    return np.where(v > P // 2, v - P, v).astype(np.float64)
