"""Sumcheck for a sum of products of multilinear tables: claim = Σ_x Π_j T_j(x).

Each round polynomial g(t) has degree d = number of tables and is sent as its
evaluations at t = 0, 1, …, d (QM31). The verifier checks g(0) + g(1) = claim, draws a
challenge r from the transcript and continues with claim g(r) (Lagrange interpolation
on 0..d). After m rounds the claim must equal Π_j T̃_j(r_1..r_m), which the caller
checks against the evaluations the layer proof supplies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from otel_proofscope.demo.field import (
    QM31,
    ZERO,
    P,
    U64Array,
    m31_inv,
    qadd,
    qmul,
    qsub,
    qsum_axis,
    to_scalar,
)
from otel_proofscope.demo.mle import fold
from otel_proofscope.demo.transcript import Transcript

#: Called after each round with (round index, evaluations 0..d, claim g(r)).
RoundHook = Callable[[int, list[QM31], QM31], None]


class SumcheckError(ValueError):
    """A sumcheck proof failed verification (the message names the round)."""


@dataclass
class SumcheckResult:
    round_polys: list[list[QM31]]
    challenges: list[QM31]
    finals: list[QM31]  # T̃_j at the challenge point
    claim: QM31  # g_last(r_last)


def interpolate(evals: Sequence[QM31], r: QM31) -> QM31:
    """g(r) for the polynomial of degree len(evals)−1 with g(i) = evals[i]."""
    d = len(evals) - 1
    out = ZERO
    for i, gi in enumerate(evals):
        num = gi
        denom = 1
        for j in range(d + 1):
            if j != i:
                num = num * (r - QM31.of(j))
                denom = denom * (i - j) % P
        out = out + num * m31_inv(denom)
    return out


def _round_poly(tables: Sequence[U64Array]) -> list[QM31]:
    h = tables[0].shape[1] // 2
    cur = [t[:, :h] for t in tables]
    diffs = [qsub(t[:, h:], t[:, :h]) for t in tables]
    evals: list[QM31] = []
    for step in range(len(tables) + 1):
        if step:
            cur = [qadd(c, d) for c, d in zip(cur, diffs, strict=True)]
        prod = cur[0]
        for c in cur[1:]:
            prod = qmul(prod, c)
        evals.append(qsum_axis(prod))
    return evals


def prove(tables: Sequence[U64Array], claim: QM31, transcript: Transcript,
          on_round: RoundHook | None = None) -> SumcheckResult:
    """Run the prover; ``tables`` are QM31 arrays (4, 2^m) of equal length."""
    n = tables[0].shape[1]
    if any(t.shape != (4, n) for t in tables):
        raise ValueError("sumcheck: tables must all have shape (4, 2^m)")
    m = n.bit_length() - 1
    cur = list(tables)
    polys: list[list[QM31]] = []
    chals: list[QM31] = []
    for rnd in range(m):
        evals = _round_poly(cur)
        transcript.absorb_qm31(b"sumcheck.round", evals)
        r = transcript.challenge()
        claim = interpolate(evals, r)
        cur = [fold(t, r) for t in cur]
        polys.append(evals)
        chals.append(r)
        if on_round is not None:
            on_round(rnd, evals, claim)
    return SumcheckResult(polys, chals, [to_scalar(t) for t in cur], claim)


def verify(claim: QM31, round_polys: Sequence[Sequence[QM31]], rounds: int, degree: int,
           transcript: Transcript) -> tuple[list[QM31], QM31]:
    """Check every round; return the challenges and the final claim (to be checked)."""
    if len(round_polys) != rounds:
        raise SumcheckError(f"expected {rounds} round polynomials, got {len(round_polys)}")
    chals: list[QM31] = []
    for rnd, evals in enumerate(round_polys):
        if len(evals) != degree + 1:
            raise SumcheckError(f"round {rnd}: expected {degree + 1} evaluations, "
                                f"got {len(evals)}")
        if evals[0] + evals[1] != claim:
            raise SumcheckError(f"round {rnd}: g(0) + g(1) != claim")
        transcript.absorb_qm31(b"sumcheck.round", evals)
        r = transcript.challenge()
        claim = interpolate(evals, r)
        chals.append(r)
    return chals, claim

