"""Value ranges of the demo network, proven by interval arithmetic over public data.

The circuit computes over M31, where a value "wraps" once the integer it stands for
leaves (−p/2, p/2). The GKR proof says nothing about that: it proves the field
computation. The demo's activation statistics and heatmaps are only the network's
quantized values if no layer ever wraps, so the network is built to stay in range and
this module proves it, from the public input and the public (committed) weights alone:
per column, an integer interval [lo, hi] that contains every value the layer can
produce, propagated layer by layer with exact Python integers. If every interval lies
inside ``(−LIMIT, LIMIT)``, the centered representative of every activation the
circuit computes is exactly the integer the quantized network computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from otel_proofscope.demo.field import P, U64Array
from otel_proofscope.semconv import LayerKind


class Layer(Protocol):
    """What the interval proof reads of a layer (circuit.LayerSpec has it): the
    circuit builds on this module, so this module names no type of the circuit's."""

    @property
    def index(self) -> int: ...
    @property
    def kind(self) -> LayerKind: ...
    @property
    def weight(self) -> U64Array | None: ...


class Network(Protocol):
    """What the interval proof reads of a network (circuit.Network has it)."""

    @property
    def input(self) -> U64Array: ...
    @property
    def layers(self) -> Sequence[Layer]: ...

#: Largest magnitude whose M31 representative is unambiguous: |v| ≤ (p − 1) / 2.
LIMIT = P // 2

#: Per column: (lo, hi) as int64 arrays (exact: see _linear).
Bounds = tuple[np.ndarray, np.ndarray]  # type: ignore[type-arg]

_SAFE = 1 << 62  # |Σ| below this fits int64 exactly
_FLOAT_EXACT = 1 << 53  # |Σ| below this is exact in float64, every partial sum too


def signed_ints(values: U64Array) -> np.ndarray:  # type: ignore[type-arg]
    """Centered representatives in [−(p−1)/2, (p−1)/2] as int64."""
    v = values.astype(np.int64)
    return np.where(v > P // 2, v - P, v)


def input_bounds(x: U64Array) -> Bounds:
    s = signed_ints(x)
    return s.min(axis=0), s.max(axis=0)


def _linear(lo: np.ndarray, hi: np.ndarray,  # type: ignore[type-arg]
            w: np.ndarray) -> Bounds:  # type: ignore[type-arg]
    """Y[:, j] = Σ_i X[:, i]·W[i, j] with X[:, i] in [lo_i, hi_i]; exact integers.

    Each term lies in [min, max] of W_ij·{lo_i, hi_i}: the positive part of W takes lo
    to the low end, the negative part takes hi there.
    """
    pos, neg = np.maximum(w, 0), np.minimum(w, 0)
    worst = int(np.abs(np.concatenate([lo, hi])).max()) * int(np.abs(w).sum(axis=0).max())
    if worst < _FLOAT_EXACT:  # BLAS: every partial sum is an integer below 2^53
        f = [a.astype(np.float64) for a in (lo, hi, pos, neg)]
        return ((f[0] @ f[2] + f[1] @ f[3]).astype(np.int64),
                (f[1] @ f[2] + f[0] @ f[3]).astype(np.int64))
    if worst >= _SAFE:  # exact Python integers where int64 could overflow
        lo, hi, pos, neg = (a.astype(object) for a in (lo, hi, pos, neg))
    return lo @ pos + hi @ neg, hi @ pos + lo @ neg


def layer_bounds(kind: LayerKind, weight: U64Array | None, bounds: Bounds) -> Bounds:
    """Per-column interval of the layer's output, given its input's (sound, not tight).

    Inputs must be within ±LIMIT (``network_bounds`` stops at the first layer beyond),
    so squares and products of two values fit int64.
    """
    lo, hi = bounds
    if kind is LayerKind.ACTIVATION:
        sq_lo, sq_hi = lo * lo, hi * hi
        crosses = (lo <= 0) & (hi >= 0)
        return np.where(crosses, 0, np.minimum(sq_lo, sq_hi)), np.maximum(sq_lo, sq_hi)
    assert weight is not None
    w = signed_ints(weight)
    if kind is LayerKind.ADD:
        return lo + w, hi + w
    if kind is LayerKind.MUL:
        a, b = lo * w, hi * w
        return np.minimum(a, b), np.maximum(a, b)
    if kind is LayerKind.MATMUL:
        return _linear(lo, hi, w)
    if kind is LayerKind.ATTENTION:
        # Y[i, j] = Σ_k A[i, k]·X[k, j], every X[k, j] in column j's interval: per row i
        # the low end is lo_j·Σ A⁺_ik + hi_j·Σ A⁻_ik; take the extreme row.
        pos = np.maximum(w, 0).sum(axis=1)
        neg = np.minimum(w, 0).sum(axis=1)
        if int(np.abs(np.concatenate([lo, hi])).max()) * int(np.abs(w).sum(axis=1).max()) \
                >= _SAFE:
            lo, hi, pos, neg = (a.astype(object) for a in (lo, hi, pos, neg))
        low = np.outer(pos, lo) + np.outer(neg, hi)
        high = np.outer(pos, hi) + np.outer(neg, lo)
        return low.min(axis=0), high.max(axis=0)
    raise ValueError(f"no range rule for layer kind {kind}")


def _worst(bounds: Bounds) -> int:
    lo, hi = bounds
    return max(int(-np.min(lo)), int(np.max(hi)))


def network_bounds(network: Network) -> list[Bounds]:
    """Intervals of every layer's output, in layer order; stops after the first layer
    that may leave ±LIMIT (what follows it is not meaningful)."""
    bounds = input_bounds(network.input)
    out: list[Bounds] = []
    for layer in network.layers:
        bounds = layer_bounds(layer.kind, layer.weight, bounds)
        out.append(bounds)
        if _worst(bounds) > LIMIT:
            break
    return out


def first_wrap(network: Network, bounds: Sequence[Bounds] | None = None) -> str | None:
    """None if no layer's output can leave (−LIMIT, LIMIT); else which layer may wrap.

    ``bounds``: :func:`network_bounds` already computed (by whoever built the network).
    """
    per_layer = network_bounds(network) if bounds is None else bounds
    for layer, layer_out in zip(network.layers, per_layer, strict=False):
        worst = _worst(layer_out)
        if worst > LIMIT:
            return (f"layer {layer.index} ({layer.kind.value}) may reach |{worst}| > "
                    f"{LIMIT} and wrap mod p")
    return None
