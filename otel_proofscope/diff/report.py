"""Two read trace files → one report: a row per group, worst first. Pure.

**Run-wide drift.** Two runs on a shared machine differ as a whole: another job's load
made every proof of one run 55–70 % slower or faster in our measurements (see
:mod:`otel_proofscope.diff.stats`). When both files did the *same work* (their proofs
carry the same layer kinds, shapes, trace costs and round counts, :data:`~otel_proofscope.
diff.traces.WORK_ATTRS`; for traces without those, when they have the same groups),
wall-clock spans cannot tell machine load from a change that slowed every group alike.
Then the report estimates the drift as the median over groups of their median ratio (a
geometric median, each group one vote) and judges every group *beyond* it, and the raw
change must agree in direction: a kernel that got 50 % slower while the run as a whole
drifted +20 % is called slower; a run where everything drifted alike is not. The drift
is shown in the headline and in JSON, never hidden.

When the work differs (a wider network, more rounds), the whole-run change is the work
itself, and raw changes are judged. ``absolute=True`` (``--absolute``) always judges raw
changes: for quiet machines, or recordings that interleave base and candidate runs so
load hits both sides alike. With fewer than :data:`MIN_DRIFT_GROUPS` comparable groups
there is no drift estimate.

The order is what a reviewer needs first: groups called slower (largest change first),
then the rest by change, then groups with too few samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from otel_proofscope.diff import samples as smp
from otel_proofscope.diff import stats
from otel_proofscope.diff.traces import TraceFile


@dataclass(frozen=True)
class Settings:
    threshold_pct: float = stats.DEFAULT_THRESHOLD_PCT
    min_samples: int = stats.DEFAULT_MIN_SAMPLES
    #: Smallest change of a median, in seconds per proof, that can be a verdict.
    floor_s: float = stats.DEFAULT_FLOOR_S
    alpha: float = stats.ALPHA
    #: Empty: chosen from the files (:func:`samples.default_by`).
    by: tuple[smp.By, ...] = ()
    #: Judge raw changes instead of changes beyond the run-wide drift.
    absolute: bool = False


#: Groups with enough samples needed to estimate the run-wide drift.
MIN_DRIFT_GROUPS = 4


@dataclass(frozen=True)
class Drift:
    """The run-wide change every group shared (factor 1.0: none or not estimated)."""

    factor: float
    groups: int  # groups it was estimated from
    applied: bool
    reason: str  # why it is (not) applied, for the reader

    @property
    def pct(self) -> float:
        return 100.0 * (self.factor - 1.0)


@dataclass(frozen=True)
class Row:
    group: smp.Group
    result: stats.Comparison

    @property
    def verdict(self) -> stats.Verdict:
        return self.result.verdict


@dataclass(frozen=True)
class Side:
    """What was read from one file and how many proofs it held."""

    file: TraceFile
    samples: smp.Samples

    @property
    def proofs(self) -> int:
        return len(self.samples.proofs)


@dataclass(frozen=True)
class Report:
    base: Side
    candidate: Side
    settings: Settings
    by: tuple[smp.By, ...]
    rows: list[Row]
    drift: Drift

    def with_verdict(self, verdict: stats.Verdict) -> list[Row]:
        return [r for r in self.rows if r.verdict is verdict]

    @property
    def slower(self) -> list[Row]:
        return self.with_verdict(stats.Verdict.SLOWER)

    @property
    def exit_code(self) -> int:
        return 1 if self.slower else 0


_RANK = {stats.Verdict.SLOWER: 0, stats.Verdict.UNCHANGED: 1, stats.Verdict.FASTER: 1,
         stats.Verdict.TOO_FEW: 2}


def _order(row: Row) -> tuple[int, float, str]:
    d = row.result.judged_pct
    return _RANK[row.verdict], -(d if d is not None and not math.isnan(d) else -math.inf), \
        row.group.label


def choose_by(base: smp.Samples | TraceFile, candidate: smp.Samples | TraceFile
              ) -> tuple[smp.By, ...]:
    """Contract groups when both files follow the contract, span names otherwise."""
    def contract(x: smp.Samples | TraceFile) -> bool:
        return x.contract if isinstance(x, smp.Samples) else smp.is_contract(x.spans)

    return smp.default_by(contract(base) and contract(candidate))


def same_work(base: smp.Samples, candidate: smp.Samples) -> bool:
    """Both runs did the same work: equal work descriptions, or (without any) the same
    groups."""
    if base.workload or candidate.workload:
        return base.workload == candidate.workload
    return set(base.values) == set(candidate.values)


def drift(values_base: dict[smp.Group, list[float]],
          values_cand: dict[smp.Group, list[float]], settings: Settings,
          work_matches: bool = True) -> Drift:
    """The geometric median over groups of the candidate/base median ratio."""
    logs = []
    for g, x in values_base.items():
        y = values_cand.get(g, [])
        if len(x) < settings.min_samples or len(y) < settings.min_samples:
            continue
        mx, my = float(np.median(x)), float(np.median(y))
        if mx > 0 and my > 0:
            logs.append(math.log(my / mx))
    if len(logs) < MIN_DRIFT_GROUPS:
        return Drift(1.0, len(logs), False,
                     f"not estimated: {len(logs)} comparable group(s), "
                     f"{MIN_DRIFT_GROUPS} needed; raw changes judged")
    factor = math.exp(float(np.median(logs)))
    if settings.absolute:
        return Drift(factor, len(logs), False, "not applied (--absolute): raw changes judged")
    if not work_matches:
        return Drift(factor, len(logs), False,
                     "not applied: the runs did different work (shapes, trace costs or "
                     "rounds differ); raw changes judged")
    return Drift(factor, len(logs), True,
                 f"median of {len(logs)} groups, same work on both sides; changes are "
                 f"judged beyond it")


def build(base: TraceFile, candidate: TraceFile, settings: Settings = Settings()) -> Report:
    by = settings.by or choose_by(base, candidate)
    sb = smp.samples(base.spans, by)
    sc = smp.samples(candidate.spans, by)
    d = drift(sb.values, sc.values, settings, same_work(sb, sc))
    scale = d.factor if d.applied else 1.0
    groups: Sequence[smp.Group] = sorted(set(sb.values) | set(sc.values))
    rows = [Row(g, stats.compare(sb.values.get(g, []), sc.values.get(g, []),
                                 threshold_pct=settings.threshold_pct,
                                 min_samples=settings.min_samples, alpha=settings.alpha,
                                 scale=scale, floor_s=settings.floor_s))
            for g in groups]
    rows.sort(key=_order)
    return Report(Side(base, sb), Side(candidate, sc), settings, tuple(by), rows, d)


def unusable(result: Report) -> str | None:
    """Why ``result`` cannot be a verdict (the CLI exits 2), or None.

    A run without proofs must never pass as "nothing slower": a candidate whose only
    span was named ``other`` against a 6-proof base used to exit 0 with every group
    "too few samples", so a CI gate passed a prover that proved nothing.

    * one side follows the span contract (holds ``proof`` spans) and the other holds
      none: that side proved nothing the other can be compared with;
    * no group has a sample on both sides: the runs have nothing in common.
    """
    sides = (("base", result.base), ("candidate", result.candidate))
    contract = {role: side.samples.contract for role, side in sides}
    if contract["base"] != contract["candidate"]:
        role, side = next((r, s) for r, s in sides if not contract[r])
        other = next(s for r, s in sides if r != role)
        names = sorted({s.name for s in side.file.spans})
        shown = ", ".join(repr(n) for n in names[:5]) + (", …" if len(names) > 5 else "")
        return (f"{role} {side.file.source} holds no proofs (no 'proof' span; "
                f"{len(side.file.spans)} span(s) named {shown}) while "
                f"{other.file.source} holds {other.proofs}: a run without proofs cannot "
                f"pass")
    if not any(r.result.base.count and r.result.candidate.count for r in result.rows):
        return (f"{result.base.file.source} and {result.candidate.file.source} have no "
                f"group in common by {', '.join(b.value for b in result.by)}: nothing to "
                f"compare")
    return None
