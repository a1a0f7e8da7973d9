"""M31 / QM31 arithmetic, MLEs and the transcript of the reference prover."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_proofscope.demo.field import (
    ONE,
    QM31,
    ZERO,
    P,
    lift,
    m31_array,
    m31_matmul,
    qmul,
    qmul_m31,
    to_scalar,
)
from otel_proofscope.demo.mle import eq_eval, eq_table, evaluate, evaluate_q, fold_m31
from otel_proofscope.demo.sumcheck import interpolate
from otel_proofscope.demo.transcript import Transcript

limb = st.integers(min_value=0, max_value=P - 1)
qm31 = st.builds(QM31, limb, limb, limb, limb)

I = QM31(0, 1, 0, 0)  # noqa: E741  (the field's i)
U = QM31(0, 0, 1, 0)


def test_extension_relations() -> None:
    assert QM31.of(-1) == I * I
    assert QM31.of(2) + I == U * U  # u² = 2 + i, as in stwo


@settings(max_examples=60, deadline=None)
@given(qm31, qm31, qm31)
def test_qm31_is_a_field(a: QM31, b: QM31, c: QM31) -> None:
    assert a * b == b * a
    assert (a * b) * c == a * (b * c)
    assert a * (b + c) == a * b + a * c
    assert a - a == ZERO
    if not a.is_zero():
        assert a * a.inverse() == ONE


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(qm31, qm31), min_size=1, max_size=8))
def test_vectorized_mul_matches_scalar(pairs: list[tuple[QM31, QM31]]) -> None:
    xs = np.array([a.limbs for a, _ in pairs], dtype=np.uint64).T
    ys = np.array([b.limbs for _, b in pairs], dtype=np.uint64).T
    prod = qmul(xs, ys)
    for j, (a, b) in enumerate(pairs):
        assert to_scalar(prod[:, j]) == a * b


def test_qmul_m31_matches_scalar() -> None:
    rng = np.random.default_rng(1)
    m = rng.integers(0, P, size=5).astype(np.uint64)
    q = QM31(123, P - 1, 7, 99_999_999)
    out = qmul_m31(q.array(), m)
    for j in range(5):
        assert to_scalar(out[:, j]) == q * int(m[j])


@pytest.mark.parametrize("k", [3, 64, 4096])  # 4096 takes the integer (non-float) path
def test_m31_matmul_exact(k: int) -> None:
    rng = np.random.default_rng(k)
    a = rng.integers(0, P, size=(3, k)).astype(np.uint64)
    b = rng.integers(0, P, size=(k, 2)).astype(np.uint64)
    a[0, :] = P - 1  # the largest products stress the exactness bound
    b[:, 0] = P - 1
    got = m31_matmul(a, b)
    want = [[sum(int(a[i, t]) * int(b[t, j]) for t in range(k)) % P for j in range(2)]
            for i in range(3)]
    assert got.tolist() == want


def test_signed_values_map_to_representatives() -> None:
    assert m31_array([-1, 0, 5]).tolist() == [P - 1, 0, 5]


def test_mle_agrees_with_table_on_the_hypercube() -> None:
    rng = np.random.default_rng(2)
    t = rng.integers(0, P, size=(4, 8)).astype(np.uint64)
    flat = t.reshape(-1)
    for idx in (0, 5, 17, 31):
        bits = [QM31.of((idx >> (4 - j)) & 1) for j in range(5)]  # MSB first
        assert evaluate(t, bits) == QM31.of(int(flat[idx]))


def test_eq_table_fold_and_evaluate_agree() -> None:
    rng = np.random.default_rng(3)
    point = [QM31(*map(int, rng.integers(0, P, 4))) for _ in range(4)]
    other = [QM31(*map(int, rng.integers(0, P, 4))) for _ in range(4)]
    table = eq_table(point)
    assert evaluate_q(table, other) == eq_eval(point, other)
    m = rng.integers(0, P, size=16).astype(np.uint64)
    folded = fold_m31(m, point[0])
    assert evaluate_q(folded, point[1:]) == evaluate(m, point)
    assert evaluate_q(lift(m), point) == evaluate(m, point)


def test_interpolation_recovers_polynomial() -> None:
    coeffs = [QM31(5, 1, 2, 3), QM31(7, 0, 0, 9), QM31(1, 1, 1, 1), QM31(0, 4, 0, 2)]

    def g(t: QM31) -> QM31:
        out, power = ZERO, ONE
        for c in coeffs:
            out, power = out + c * power, power * t
        return out

    r = QM31(11, 22, 33, 44)
    evals = [g(QM31.of(i)) for i in range(4)]
    assert interpolate(evals, r) == g(r)


def test_transcript_is_deterministic_and_binding() -> None:
    a, b, c = Transcript(), Transcript(), Transcript()
    for t in (a, b):
        t.absorb(b"x", b"hello")
    c.absorb(b"x", b"hellp")
    ca, cb, cc = a.challenge(), b.challenge(), c.challenge()
    assert ca == cb and ca != cc
    assert a.challenge() != ca  # squeezing advances the state
    limbs = [v for q in a.challenges(64) for v in q.limbs]
    assert all(0 <= v < P for v in limbs) and len(set(limbs)) == len(limbs)
