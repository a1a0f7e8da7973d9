"""Spans → one duration sample per proof and group. Pure.

The unit of a sample is a *proof*, not a span: spans of one proof share that proof's
machine state (a busy neighbour slows all of them at once), so counting each span as an
independent sample would make ordinary noise look significant. Per proof and group the
sample is the sum of the group's span time in that proof.

A proof is a contract ``proof`` span with everything below it; in a trace without one
(a foreign prover's trace, issue "See any prover") the whole trace is the unit.

Groups (:class:`By`):

``phase``
    contract span names (``proof`` itself is the total; ``proof.layer`` is all layers).
``layer-kind``
    ``proof.layer`` spans by ``proof.layer.kind`` (``layer MatMul``) and their sumcheck
    rounds by the same kind (``rounds MatMul``): the time from each round's
    ``proof.sumcheck.round`` event back to the previous one. Round 0 has no recorded
    start (its event marks its end; the layer's set-up runs before it), so it is left out.
``span``
    any span by its name, for traces that follow no contract.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from otel_proofscope.diff.traces import SpanRecord
from otel_proofscope.semconv import SpanName

#: Contract span names that are proof phases, in the order a proof runs them.
PHASES: tuple[str, ...] = (SpanName.PROOF, SpanName.CIRCUIT_COMPILE, SpanName.LAYER,
                           SpanName.WEIGHT_OPENING, SpanName.AGGREGATED_BINDING,
                           SpanName.STARK, SpanName.VERIFY)


class By(StrEnum):
    PHASE = "phase"
    LAYER_KIND = "layer-kind"
    SPAN = "span"


class Family(StrEnum):
    """What a group measures; part of its label."""

    PHASE = "phase"
    LAYER = "layer"
    ROUNDS = "rounds"
    SPAN = "span"


@dataclass(frozen=True, order=True)
class Group:
    family: Family
    key: str

    @property
    def label(self) -> str:
        return f"{self.family.value} {self.key}"


@dataclass
class Proof:
    """One unit of comparison: its root (``proof`` span or trace root) and its spans."""

    trace_id: int
    root: SpanRecord | None
    spans: list[SpanRecord] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        if self.root is not None:
            return self.root.start_ns
        return min((s.start_ns for s in self.spans), default=0)


@dataclass
class Samples:
    """Per group, one value in seconds per proof that has the group."""

    proofs: list[Proof]
    values: dict[Group, list[float]]
    #: True when the file follows the span contract (has ``proof`` spans).
    contract: bool
    #: Spans of a contract file that sit under no ``proof`` span (not grouped by phase).
    outside_proofs: int = 0
    #: Spans seen more than once (same trace and span id: an exporter's retry, or a file
    #: concatenated with itself); counted once.
    duplicates: int = 0
    #: The distinct work descriptions of the proofs (:func:`workload`).
    workload: frozenset[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = frozenset()


def is_contract(spans: Iterable[SpanRecord]) -> bool:
    return any(s.name == SpanName.PROOF for s in spans)


def split_proofs(spans: Sequence[SpanRecord]) -> tuple[list[Proof], int]:
    """Spans grouped by the nearest ``proof`` ancestor (contract traces) or by trace.

    Returns the proofs in start order and how many spans of a contract trace fell under
    no ``proof`` span (their ancestor chain is cut, or they ran outside a proof).
    """
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    if not is_contract(spans):
        traces: dict[int, Proof] = {}
        for s in spans:
            p = traces.setdefault(s.trace_id, Proof(s.trace_id, None))
            p.spans.append(s)
            is_root = s.parent_id is None or (s.trace_id, s.parent_id) not in by_id
            if is_root and (p.root is None or s.start_ns < p.root.start_ns):
                p.root = s
        return sorted(traces.values(), key=lambda p: p.start_ns), 0
    owner: dict[tuple[int, int], tuple[int, int] | None] = {}

    def proof_of(s: SpanRecord) -> tuple[int, int] | None:
        chain: list[tuple[int, int]] = []
        cur: SpanRecord | None = s
        found: tuple[int, int] | None = None
        while cur is not None:
            key = (cur.trace_id, cur.span_id)
            if key in owner:
                found = owner[key]
                break
            chain.append(key)
            if cur.name == SpanName.PROOF:
                found = key
                break
            if cur.parent_id is None or len(chain) > len(by_id):  # cycle guard
                break
            cur = by_id.get((cur.trace_id, cur.parent_id))
        for key in chain:
            owner[key] = found
        return found

    proofs: dict[tuple[int, int], Proof] = {}
    outside = 0
    for s in spans:
        key = proof_of(s)
        if key is None:
            outside += 1
            continue
        p = proofs.setdefault(key, Proof(key[0], by_id[key]))
        p.spans.append(s)
    return sorted(proofs.values(), key=lambda p: p.start_ns), outside


def round_seconds(span: SpanRecord) -> float:
    """Summed time of a layer's sumcheck rounds 1…n-1 (gaps between round events)."""
    t = span.round_times_ns
    return sum(max(0, b - a) for a, b in itertools.pairwise(t)) / 1e9


def proof_groups(proof: Proof, by: Sequence[By]) -> dict[Group, float]:
    """The proof's seconds per group (groups it has no span of are absent)."""
    out: dict[Group, float] = defaultdict(float)
    for s in proof.spans:
        secs = s.duration_ns / 1e9
        if By.SPAN in by:
            out[Group(Family.SPAN, s.name)] += secs
        if By.PHASE in by and s.name in PHASES:
            out[Group(Family.PHASE, s.name)] += secs
        if By.LAYER_KIND in by and s.name == SpanName.LAYER and s.layer_kind is not None:
            out[Group(Family.LAYER, s.layer_kind)] += secs
            if len(s.round_times_ns) > 1:
                out[Group(Family.ROUNDS, s.layer_kind)] += round_seconds(s)
    return dict(out)


def default_by(contract: bool) -> tuple[By, ...]:
    """Phases and layer kinds for contract traces, span names for any other trace."""
    return (By.PHASE, By.LAYER_KIND) if contract else (By.SPAN,)


def workload(proof: Proof) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """What the proof did, without timings: its spans' work attributes, sorted."""
    return tuple(sorted((s.name, s.work) for s in proof.spans if s.work))


def unique(spans: Sequence[SpanRecord]) -> list[SpanRecord]:
    """The spans with repeats of a (trace id, span id) left out (the first one stays)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for s in spans:
        key = (s.trace_id, s.span_id)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def samples(spans: Sequence[SpanRecord], by: Sequence[By]) -> Samples:
    distinct = unique(spans)
    proofs, outside = split_proofs(distinct)
    values: dict[Group, list[float]] = defaultdict(list)
    for p in proofs:
        for group, secs in proof_groups(p, by).items():
            values[group].append(secs)
    work = frozenset(w for w in (workload(p) for p in proofs) if w)
    return Samples(proofs, dict(values), is_contract(spans), outside,
                   len(spans) - len(distinct), work)
