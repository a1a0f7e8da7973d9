"""What the translator remembers between batches (no I/O).

Spans arrive in any order: children before parents, layers shuffled, a proof's spans
spread over many export batches. Everything a single span can draw on its own is
translated immediately (a trail segment as soon as both its layers are known, at the
later of their end times). Quantities that depend on several spans (progress,
per-kind layer durations) are *derived* from a :class:`ProofModel` and sent as
differences: only the rows whose value changed since the last batch are re-sent, at
their original timestamps, so the final recording is the same whatever the arrival
order (Rerun's latest-at picks the newest row at equal times).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from otel_proofscope.rerun.layout import proof_offset

#: Proofs whose state is kept (least recently used first out).
MAX_PROOFS = 256
#: Rows remembered per derived series; older ones may be re-sent (identical, harmless).
MAX_SENT_ROWS = 4096


@dataclass
class LayerSummary:
    index: int
    kind: str
    start: int
    end: int
    ok: bool

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0) / 1e9


@dataclass
class ProofModel:
    """State of one proof (one trace)."""

    key: str  # first 8 hex digits of the trace id: the entity-path segment
    ordinal: int  # 0 for the first proof of the recording: its helix offset
    start: int | None = None  # root span start
    end: int | None = None
    declared_layers: int | None = None
    circuit_nodes: int | None = None
    layers: dict[int, LayerSummary] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    #: Earliest timestamp whose derived rows may have changed (None: nothing new).
    dirty_from: int | None = None
    #: Last rows sent per derived series: series → time → payload.
    sent: dict[str, dict[int, Hashable]] = field(default_factory=dict)
    placed: bool = False
    witness_styled: bool = False
    #: Span times are replay times (a recorded proof-stream), not the prover's: no
    #: duration of this proof is plotted, since none was measured.
    replayed: bool = False
    #: The per-phase GPU series of this proof have their static style (logged once).
    gpu_styled: bool = False

    offset: tuple[float, float, float] = (0.0, 0.0, 0.0)  # set from the ordinal

    def __post_init__(self) -> None:
        self.offset = proof_offset(self.ordinal)

    def proved_neighbours(self, index: int) -> list[LayerSummary]:
        """Proved layers adjacent to ``index`` (for the progress trail)."""
        return [la for j in (index - 1, index + 1)
                if (la := self.layers.get(j)) is not None and la.ok]

    def touch(self, t: int) -> None:
        if self.dirty_from is None or t < self.dirty_from:
            self.dirty_from = t

    def add_layer(self, layer: LayerSummary) -> None:
        self.layers[layer.index] = layer
        self.kinds.setdefault(layer.index, layer.kind)
        self.touch(min(layer.start, layer.end))

    def total_layers(self) -> int:
        """Best known layer count: the circuit, the proof's declaration, or the layers seen."""
        seen = max(self.layers) + 1 if self.layers else 0
        return max(self.circuit_nodes or 0, self.declared_layers or 0, seen)

    def diff(self, series: str, rows: list[tuple[int, Hashable]]) -> list[tuple[int, Hashable]]:
        """The rows of ``series`` that are new or changed since the last call."""
        sent = self.sent.setdefault(series, {})
        out = []
        for t, payload in rows:
            if sent.get(t) != payload:
                sent[t] = payload
                out.append((t, payload))
        if len(sent) > MAX_SENT_ROWS:
            # A proof with more layer spans than layers (re-proved layers, a long-lived
            # trace) would otherwise grow this memo without bound: keep the newest half.
            keep = sorted(sent)[-(MAX_SENT_ROWS // 2):]
            self.sent[series] = {t: sent[t] for t in keep}
        return out


class ProofRegistry:
    """Proof models by trace id, bounded; each new proof gets the next helix slot."""

    def __init__(self, max_proofs: int = MAX_PROOFS) -> None:
        self._models: OrderedDict[int, ProofModel] = OrderedDict()
        self._keys: dict[str, int] = {}  # entity-path key → trace id
        self._max = max_proofs
        self._next_ordinal = 0
        self.evicted = 0

    def get(self, trace_id: int) -> ProofModel:
        model = self._models.get(trace_id)
        if model is not None:
            self._models.move_to_end(trace_id)
            return model
        key = f"{trace_id:032x}"[:8]
        if key in self._keys and self._keys[key] != trace_id:
            key = f"{trace_id:032x}"[:16]  # two traces sharing 8 hex digits: never merge them
        self._keys[key] = trace_id
        model = ProofModel(key=key, ordinal=self._next_ordinal)
        self._next_ordinal += 1
        self._models[trace_id] = model
        if len(self._models) > self._max:
            _, old = self._models.popitem(last=False)
            self._keys.pop(old.key, None)
            self.evicted += 1
        return model

    def known(self, trace_id: int) -> bool:
        return trace_id in self._models

    def largest_walk(self) -> int:
        """The most layers any proof held here has (0: none)."""
        return max((m.total_layers() for m in self._models.values()), default=0)

    def models(self) -> list[ProofModel]:
        return list(self._models.values())

    def __len__(self) -> int:
        return len(self._models)


# ── derived series ───────────────────────────────────────────────────────────────────


def progress_rows(model: ProofModel) -> list[tuple[int, float]]:
    """(time, fraction of layers proved): 0 at the proof start, one row per layer end."""
    total = model.total_layers()
    if total <= 0:
        return []
    ends = sorted(layer.end for layer in model.layers.values())
    rows: list[tuple[int, float]] = []
    if model.start is not None:  # the root span: the proof's start
        rows.append((model.start, 0.0))
    rows += [(t, (n + 1) / total) for n, t in enumerate(ends)]
    return _from(rows, model.dirty_from)


def kind_seconds_rows(model: ProofModel) -> dict[str, list[tuple[int, tuple[tuple[int, float],
                                                                             ...]]]]:
    """Per kind: (time, ((layer index, seconds), …)) at each end of a layer of that kind."""
    out: dict[str, list[tuple[int, tuple[tuple[int, float], ...]]]] = {}
    acc: dict[str, list[tuple[int, float]]] = {}
    since = model.dirty_from
    for layer in sorted(model.layers.values(), key=lambda la: (la.end, la.index)):
        bars = acc.setdefault(layer.kind, [])
        bisect.insort(bars, (layer.index, round(layer.seconds, 9)))
        if since is not None and layer.end < since:
            continue
        out.setdefault(layer.kind, []).append((layer.end, tuple(bars)))
    return out


def _from(rows: list[tuple[int, float]], since: int | None) -> list[tuple[int, float]]:
    if since is None:
        return rows
    return [r for r in rows if r[0] >= since]


# ── capability gaps ──────────────────────────────────────────────────────────────────

#: Distinct capability gaps kept for the table (the same bound as gpu.EVIDENCE_DEDUP).
MAX_GAPS = 1024


@dataclass(frozen=True)
class Gap:
    backend: str
    device: str
    capability: str
    reason: str


class GapTable:
    """Distinct capability gaps, first-seen order, bounded; overflow is counted."""

    def __init__(self, max_gaps: int = MAX_GAPS) -> None:
        self._gaps: dict[Gap, tuple[int, str]] = {}
        self._max = max_gaps
        self.overflow = 0

    def add(self, gap: Gap, t: int, source: str) -> bool:
        """True when ``gap`` is new (the table changed)."""
        if gap in self._gaps:
            return False
        if len(self._gaps) >= self._max:
            self.overflow += 1
            return False
        self._gaps[gap] = (t, source)
        return True

    def __len__(self) -> int:
        return len(self._gaps)

    def markdown(self) -> str:
        from datetime import UTC, datetime

        lines = [
            "## GPU capability gaps",
            "",
            "Metrics these backends cannot expose (reported, not silently zero).",
            "",
            "| backend | device | capability | reason | first seen (UTC) | source |",
            "|---|---|---|---|---|---|",
        ]
        for gap, (t, source) in self._gaps.items():
            when = datetime.fromtimestamp(t / 1e9, tz=UTC).strftime("%H:%M:%S.%f")[:-3]
            lines.append(f"| {_md(gap.backend)} | {_md(gap.device)} | {_md(gap.capability)} "
                         f"| {_md(gap.reason)} | {when} | {source} |")
        if self.overflow:
            lines += ["", f"*{self.overflow} further gap(s) not listed (table capped at "
                          f"{self._max}).*"]
        return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:80]
