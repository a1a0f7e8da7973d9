"""M31 and its degree-4 extension QM31, as in stwo.

* M31: integers mod p = 2^31 - 1. Arrays are ``uint64`` with values in [0, p); a product
  of two elements is < 2^62, so one product (plus one more such term) fits before a
  reduction.
* CM31 = M31[i] / (i^2 + 1); QM31 = CM31[u] / (u^2 - (2 + i)). A QM31 element is four
  M31 limbs ``(a, b, c, d)`` meaning ``(a + b·i) + (c + d·i)·u`` (stwo's limb order).
  |QM31| = p^4 ≈ 2^124.

Two representations: :class:`QM31` is a scalar of Python ints (transcript, verifier,
telemetry); a *QM31 array* is a ``uint64`` ndarray of shape ``(4, ...)``, limb-major, used
by the prover's vectorized loops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from otel_proofscope.fields import M31

P = M31
_PU = np.uint64(P)
_PP = np.uint64(P * P)

U64Array = npt.NDArray[np.uint64]
#: ``(a, b) -> a @ b mod p`` for M31 matrices; the CPU default or a GPU kernel.
MatmulFn = Callable[[U64Array, U64Array], U64Array]


# ── scalars ──────────────────────────────────────────────────────────────────────────


def m31_inv(x: int) -> int:
    x %= P
    if x == 0:
        raise ZeroDivisionError("0 has no inverse in M31")
    return pow(x, P - 2, P)


def _cm_mul(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int]:
    return (a0 * b0 - a1 * b1) % P, (a0 * b1 + a1 * b0) % P


@dataclass(frozen=True, slots=True)
class QM31:
    """A QM31 scalar ``(a + b·i) + (c + d·i)·u`` with limbs in [0, p)."""

    a: int
    b: int
    c: int
    d: int

    @staticmethod
    def of(value: int | Sequence[int]) -> QM31:
        if isinstance(value, int):
            return QM31(value % P, 0, 0, 0)
        a, b, c, d = (int(v) % P for v in value)
        return QM31(a, b, c, d)

    @property
    def limbs(self) -> tuple[int, int, int, int]:
        return (self.a, self.b, self.c, self.d)

    def array(self) -> U64Array:
        """Shape (4, 1): broadcasts against a QM31 array of shape (4, N)."""
        return np.array(self.limbs, dtype=np.uint64).reshape(4, 1)

    def __add__(self, o: QM31) -> QM31:
        return QM31((self.a + o.a) % P, (self.b + o.b) % P, (self.c + o.c) % P,
                    (self.d + o.d) % P)

    def __sub__(self, o: QM31) -> QM31:
        return QM31((self.a - o.a) % P, (self.b - o.b) % P, (self.c - o.c) % P,
                    (self.d - o.d) % P)

    def __neg__(self) -> QM31:
        return QM31(-self.a % P, -self.b % P, -self.c % P, -self.d % P)

    def __mul__(self, o: QM31 | int) -> QM31:
        if isinstance(o, int):
            return QM31(self.a * o % P, self.b * o % P, self.c * o % P, self.d * o % P)
        # (x0 + x1·u)(y0 + y1·u) = x0·y0 + (2 + i)·x1·y1 + (x0·y1 + x1·y0)·u
        e0, e1 = _cm_mul(self.a, self.b, o.a, o.b)
        f0, f1 = _cm_mul(self.c, self.d, o.c, o.d)
        g0, g1 = _cm_mul(self.a, self.b, o.c, o.d)
        h0, h1 = _cm_mul(self.c, self.d, o.a, o.b)
        return QM31((e0 + 2 * f0 - f1) % P, (e1 + 2 * f1 + f0) % P, (g0 + h0) % P,
                    (g1 + h1) % P)

    __rmul__ = __mul__

    def inverse(self) -> QM31:
        # 1/(x + y·u) = (x − y·u) / (x² − (2 + i)·y²); the denominator is in CM31.
        x0, x1, y0, y1 = self.a, self.b, self.c, self.d
        s0, s1 = _cm_mul(x0, x1, x0, x1)
        t0, t1 = _cm_mul(y0, y1, y0, y1)
        n0, n1 = (s0 - (2 * t0 - t1)) % P, (s1 - (2 * t1 + t0)) % P
        norm = (n0 * n0 + n1 * n1) % P  # CM31 norm, in M31
        inv = m31_inv(norm)
        c0, c1 = n0 * inv % P, -n1 * inv % P  # 1/(n0 + n1·i)
        r0, r1 = _cm_mul(x0, x1, c0, c1)
        q0, q1 = _cm_mul(-y0 % P, -y1 % P, c0, c1)
        return QM31(r0, r1, q0, q1)

    def is_zero(self) -> bool:
        return not (self.a or self.b or self.c or self.d)

    def to_bytes(self) -> bytes:
        return b"".join(v.to_bytes(4, "little") for v in self.limbs)

    def __proofscope_field__(self) -> str:
        return f"({self.a},{self.b},{self.c},{self.d})"

    def __repr__(self) -> str:
        return f"QM31{self.limbs}"


ZERO = QM31(0, 0, 0, 0)
ONE = QM31(1, 0, 0, 0)


# ── arrays ───────────────────────────────────────────────────────────────────────────


def m31_array(values: npt.ArrayLike) -> U64Array:
    """Signed integers → canonical M31 representatives (uint64)."""
    arr = np.asarray(values, dtype=np.int64) % P
    return arr.astype(np.uint64)


def lift(m31: U64Array) -> U64Array:
    """An M31 array as a QM31 array (limbs b, c, d zero)."""
    out = np.zeros((4, *m31.shape), dtype=np.uint64)
    out[0] = m31
    return out


def qadd(x: U64Array, y: U64Array) -> U64Array:
    return (x + y) % _PU


def qsub(x: U64Array, y: U64Array) -> U64Array:
    return (x + (_PU - y)) % _PU


def _cm_mul_arr(a0: U64Array, a1: U64Array, b0: U64Array,
                b1: U64Array) -> tuple[U64Array, U64Array]:
    # Each product < 2^62; adding p² − (product) keeps the sum < 2^63 and non-negative.
    r0 = (a0 * b0 + (_PP - a1 * b1)) % _PU
    r1 = (a0 * b1 + a1 * b0) % _PU
    return r0, r1


def qmul(x: U64Array, y: U64Array) -> U64Array:
    """Elementwise QM31 product of two QM31 arrays (broadcasting over trailing dims)."""
    e0, e1 = _cm_mul_arr(x[0], x[1], y[0], y[1])
    f0, f1 = _cm_mul_arr(x[2], x[3], y[2], y[3])
    g0, g1 = _cm_mul_arr(x[0], x[1], y[2], y[3])
    h0, h1 = _cm_mul_arr(x[2], x[3], y[0], y[1])
    # (2 + i)·(f0 + f1·i) = (2·f0 − f1) + (2·f1 + f0)·i
    out = np.empty(np.broadcast_shapes(x.shape, y.shape), dtype=np.uint64)
    out[0] = (e0 + 2 * f0 + (_PU - f1)) % _PU
    out[1] = (e1 + 2 * f1 + f0) % _PU
    out[2] = (g0 + h0) % _PU
    out[3] = (g1 + h1) % _PU
    return out


def qmul_m31(x: U64Array, m: U64Array) -> U64Array:
    """QM31 array (or (4, 1) scalar) times an M31 array: limb-wise products."""
    return (x * m[np.newaxis]) % _PU


def qsum_axis(x: U64Array) -> QM31:
    """Sum of a QM31 array of shape (4, N), N < 2^32."""
    s = x.sum(axis=1, dtype=np.uint64) % _PU
    return QM31(int(s[0]), int(s[1]), int(s[2]), int(s[3]))


def to_scalar(x: U64Array) -> QM31:
    """The single element of a QM31 array of shape (4,) or (4, 1)."""
    flat = x.reshape(4)
    return QM31(int(flat[0]), int(flat[1]), int(flat[2]), int(flat[3]))


# ── matrix products ──────────────────────────────────────────────────────────────────

#: Largest inner dimension for the float64 path: with b split into 11-bit limbs, each
#: product is < 2^42 and a sum of 2048 of them stays below 2^53 (exact in float64).
_FLOAT_MAX_K = 2048
_LIMB_BITS = 11


def m31_matmul(a: U64Array, b: U64Array) -> U64Array:
    """``a @ b mod p`` for M31 matrices (n, k) × (k, m), exactly.

    Uses BLAS float64 products on 11-bit limbs of ``b`` while the inner dimension allows
    exactness, else integer products on 16-bit limbs (each < 2^47, sums of up to 2^16).
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"m31_matmul: shapes {a.shape} and {b.shape} do not chain")
    k = a.shape[1]
    b = np.asarray(b, dtype=np.uint64)
    if k <= _FLOAT_MAX_K:
        af = np.asarray(a, dtype=np.float64)
        mask = np.uint64((1 << _LIMB_BITS) - 1)
        out = np.zeros((a.shape[0], b.shape[1]), dtype=np.uint64)
        for j in range(3):  # 3 × 11 bits ≥ 31 bits
            limb = ((b >> np.uint64(j * _LIMB_BITS)) & mask).astype(np.float64)
            part = (af @ limb).astype(np.uint64) % _PU
            out = (out + (part << np.uint64(j * _LIMB_BITS)) % _PU) % _PU
        return out
    if k > 1 << 16:
        raise ValueError(f"m31_matmul: inner dimension {k} too large")
    a64 = np.asarray(a, dtype=np.uint64)
    lo = (a64 @ (b & np.uint64(0xFFFF))) % _PU
    hi = (a64 @ (b >> np.uint64(16))) % _PU
    return (lo + (hi << np.uint64(16)) % _PU) % _PU


def q_matvec(m: U64Array, v: U64Array, matmul: MatmulFn | None = None) -> U64Array:
    """M31 matrix (k, m) times QM31 column vector (4, m) → QM31 (4, k)."""
    return (matmul or m31_matmul)(m, np.ascontiguousarray(v.T)).T.copy()

