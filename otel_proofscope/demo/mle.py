"""Multilinear extensions over the boolean hypercube, most significant variable first.

A table of length 2^m is the evaluations of its MLE on {0,1}^m, indexed so that the
first variable is the most significant bit of the index. An (n, w) matrix flattened
row-major therefore has its row variables first and its column variables last, and
binding the first variable folds the first half of the table onto the second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from otel_proofscope.demo.field import (
    ONE,
    QM31,
    P,
    U64Array,
    lift,
    q_matvec,
    qadd,
    qmul,
    qmul_m31,
    qsub,
    qsum_axis,
    to_scalar,
)

_PU = np.uint64(P)


def log2_exact(n: int, what: str = "size") -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"{what} must be a power of two, got {n}")
    return n.bit_length() - 1


def eq_table(point: Sequence[QM31]) -> U64Array:
    """eq(point, x) for every x in {0,1}^m, as a QM31 array of shape (4, 2^m)."""
    table = ONE.array()  # (4, 1)
    for r in point:
        ra = r.array()  # (4, 1)
        one_minus = qsub(ONE.array(), ra)
        # New index = old·2 + bit: bit 0 takes (1 − r), bit 1 takes r.
        lo = qmul(table, one_minus)
        hi = qmul(table, ra)
        table = np.stack([lo, hi], axis=2).reshape(4, -1)
    return table


def eq_eval(x: Sequence[QM31], y: Sequence[QM31]) -> QM31:
    """eq(x, y) = Π (x_i·y_i + (1 − x_i)(1 − y_i))."""
    if len(x) != len(y):
        raise ValueError(f"eq_eval: points of lengths {len(x)} and {len(y)}")
    out = ONE
    for a, b in zip(x, y, strict=True):
        out = out * (a * b + (ONE - a) * (ONE - b))
    return out


def fold(table: U64Array, r: QM31) -> U64Array:
    """Bind the first variable of a QM31 table (4, 2h) to r → (4, h)."""
    h = table.shape[1] // 2
    lo, hi = table[:, :h], table[:, h:]
    return qadd(lo, qmul(qsub(hi, lo), r.array()))


def fold_m31(table: U64Array, r: QM31) -> U64Array:
    """Bind the first variable of an M31 table (2h,) to r → QM31 (4, h)."""
    h = table.shape[0] // 2
    lo, hi = table[:h], table[h:]
    diff = (hi + (_PU - lo)) % _PU
    return qadd(lift(lo), qmul_m31(r.array(), diff))


def evaluate(values: U64Array, point: Sequence[QM31]) -> QM31:
    """The MLE of an M31 tensor (any shape, flattened row-major) at ``point``."""
    flat = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
    m = log2_exact(flat.shape[0], "MLE table length")
    if len(point) != m:
        raise ValueError(f"evaluate: table has {m} variables, point has {len(point)}")
    if m == 0:
        return QM31.of(int(flat[0]))
    if flat.shape[0] >= 1 << 12:
        # Split the variables: Ṽ(a, b) = Σ_i eq(a, i)·(V·eq(b, ·))_i, with V·eq(b, ·) one
        # exact BLAS-backed matrix product instead of a QM31 table of the full size.
        half = m // 2
        rows = flat.reshape(1 << half, -1)
        inner = q_matvec(rows, eq_table(point[half:]))  # (4, 2^half)
        return qsum_axis(qmul(eq_table(point[:half]), inner))
    # Inner product with eq(point, ·) costs one pass; folding variable by variable would
    # cost a second QM31 multiplication per element.
    eq = eq_table(point)
    return qsum_axis(qmul_m31(eq, flat))


def evaluate_q(table: U64Array, point: Sequence[QM31]) -> QM31:
    """The MLE of a QM31 table (4, 2^m) at ``point``."""
    t = table
    for r in point:
        t = fold(t, r)
    return to_scalar(t)
