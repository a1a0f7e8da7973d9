"""Finished proof spans → Rerun rows (no I/O).

Entity paths keep stwo-ml's Rerun names where they fit. Per-proof entities carry the
proof (the first 8 hex digits of its trace id, ``{p}``) right after that group, so
concurrent proofs never overwrite each other and one blueprint filter
(``gkr/claim/**``) still selects a quantity for all of them::

    circuit/{p}/{nodes,edges,backbone}            DAG, coloured by layer kind
    gkr/walk/{p}/cursor                           the layer being proved
    gkr/walk/{nodes,rounds,progress_trail}        every proof's layers, round bars, trail
    gkr/claim/{p}  gkr/remaining/{p}  gkr/round_ms/{p}
    proof/progress/{p}  proof/binding_ms/{p}  proof/layer_seconds/{p}/{kind}
    inference/stats/{p}/{mean,std_dev,min,max,sparsity}  (witness data, opt-in)
    inference/{p}/layer_{i}/{output,attn_head_{h}}       (witness data, opt-in)
    logs/{proof,gkr,weights,stark,gpu}/{p}
    gkr/walk/gpu_time                             a layer's GPU kernel time, a bar below it
    gpu/phase/kernel_ms/{p}  gpu/phase/energy_j/{p}  gpu/phase/bytes/{p}/{upload,readback}

``gkr/walk/{nodes,rounds,progress_trail}`` are *accumulating* entities: one row per
event (a layer starting, a round finishing, a trail segment closing), which the
blueprint shows with a visible time range from the start to the time cursor. An entity
per layer and per round would cost one Rerun call each; here a whole batch is one call
per entity. Each proof's helix is offset (``layout.proof_offset``), baked into the
positions.

Every row is stamped with the span / event timestamp on the ``proof_time`` timeline,
plus ``layer`` and ``sumcheck_round`` where they apply.

What is plotted is what the telemetry says, nothing invented:

* a sumcheck round's bar height is the round's wall time (log scale) and its colour the
  fraction of the layer's hypercube variables still unbound (blue → red);
* ``gkr/remaining`` is that fraction; ``gkr/claim`` is a *fingerprint* of the claim
  (first limb mod 2³¹−1, divided by 2³¹−1) — a field element has no magnitude, so the
  series is drawn as unconnected points and labelled as a fingerprint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import rerun as rr
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import StatusCode

from otel_proofscope import fields
from otel_proofscope.fields import M31
from otel_proofscope.otlp.sdk_fields import (
    events_at,
    span_attributes,
    span_events,
    span_events_unread,
)
from otel_proofscope.rerun import layout
from otel_proofscope.rerun.columns import Frame, Node
from otel_proofscope.rerun.model import (
    Gap,
    GapTable,
    LayerSummary,
    ProofModel,
    ProofRegistry,
    kind_seconds_rows,
    progress_rows,
)
from otel_proofscope.rerun.round_outline import outline
from otel_proofscope.semconv import Attr, EventName, LayerKind, SpanName, StreamAttr

#: Shared, accumulating walk entities (the blueprint gives them a visible time range).
NODES = "gkr/walk/nodes"
ROUNDS = "gkr/walk/rounds"
TRAIL = "gkr/walk/progress_trail"
GPU_TIME = "gkr/walk/gpu_time"
#: Layer labels of the first proof's helix, one per layer as it starts.
LABELS = "gkr/walk/labels"
ACCUMULATING = (NODES, ROUNDS, TRAIL, GPU_TIME, LABELS)

#: Walk labels stay short: neighbouring layers are ~50 px apart in a 1280×800 window.
_SHORT_KIND = {"Activation": "Act", "Attention": "Attn", "LayerNorm": "LNorm",
               "RMSNorm": "RMS", "Embedding": "Embed", "Dequantize": "Dequant",
               "Quantize": "Quant", "Unknown": "?"}
_MAX_LABEL = 10

#: Caps that keep a hostile or buggy span from exhausting memory (excess is counted).
MAX_LAYER_INDEX = 1 << 20
MAX_CIRCUIT_NODES = 1 << 16
MAX_CIRCUIT_EDGES = 1 << 17
MAX_ACTIVATION_SAMPLE = 1024
MAX_ATTENTION_SIDE = 64
MAX_TEXT = 500

# proof.log events (proof-stream bridge, EZKL log bridge); not yet in semconv.Attr.
_LOG_LEVEL = Attr.LOG_LEVEL
_LOG_MESSAGE = Attr.LOG_MESSAGE
_LOG_LEVELS = {"Trace": "TRACE", "Debug": "DEBUG", "Info": "INFO", "Warn": "WARN",
               "Error": "ERROR"}

_KINDS = frozenset(k.value for k in LayerKind)
#: Set by the proof-stream bridge: "replay" means span times are not the prover's.
STREAM_TIMING = StreamAttr.TIMING

_OURS = frozenset({SpanName.PROOF, SpanName.CIRCUIT_COMPILE, SpanName.LAYER,
                   SpanName.WEIGHT_OPENING, SpanName.AGGREGATED_BINDING, SpanName.STARK,
                   SpanName.VERIFY, SpanName.WITNESS})
_GPU_EVENTS = frozenset({EventName.GPU_ADAPTER_ACQUIRED, EventName.GPU_CAPABILITY_UNSUPPORTED,
                         EventName.GPU_FAULT, EventName.GPU_RETRY, EventName.GPU_RECOVERY})
_STATS = (Attr.ACTIVATION_MEAN, Attr.ACTIVATION_STD_DEV, Attr.ACTIVATION_MIN,
          Attr.ACTIVATION_MAX, Attr.ACTIVATION_SPARSITY)


def walk_label(index: int, kind: str) -> str:
    """A layer's label on the walk: its index and (short) kind, e.g. ``4 Attn``."""
    return f"{index} {_SHORT_KIND.get(kind, kind)[:_MAX_LABEL]}"


#: Each plotted quantity's legend name and colour, the same for every proof of a
#: recording: a plot's legend lists each quantity once (the viewer merges entries of
#: one name), and successive proofs sit side by side on the time axis. Which proof a
#: point belongs to is its entity path (``gkr/claim/{p}``), shown on hover; a
#: recording of one proof names it in the panel titles.
SERIES: dict[str, int] = {
    "claim fingerprint": 0x5DADE2FF,
    "variables left": 0xE6C229FF,
    "layers done": 0x00E676FF,
    "round ms": 0x4FC3F7FF,
    "binding ms": 0xFF8A65FF,
    "GPU kernel ms": 0x26C6DAFF,
    "GPU energy J": 0xFFA726FF,
    "bytes uploaded": 0x9CCC65FF,
    "bytes read back": 0x7E57C2FF,
    "activation mean": 0xFFCA28FF,
    "activation std_dev": 0x26A69AFF,
    "activation min": 0x42A5F5FF,
    "activation max": 0xEF5350FF,
    "activation sparsity": 0xAB47BCFF,
}


def series_style(quantity: str, *, points: bool) -> Any:
    """The static style of a per-proof series: a short name (never a trace-id hash)
    and its quantity's colour."""
    colour = [SERIES.get(quantity, 0xB0B0B0FF)]
    if points:
        return rr.SeriesPoints(names=[quantity], colors=colour)
    return rr.SeriesLines(names=[quantity], colors=colour)


def is_layer(span: ReadableSpan) -> bool:
    """A layer on the walk: a ``proof.layer`` span, or any span that carries the layer
    attributes (``proof.layer.index`` and ``proof.layer.kind``) under its own name, as a
    CLI prover's ``groth16.msm`` does (``layer = true`` in its log-line preset)."""
    name = getattr(span, "name", None)
    if name in _OURS:  # a contract span keeps its own role
        return bool(name == SpanName.LAYER)
    a = getattr(span, "attributes", None) or {}
    return Attr.LAYER_INDEX in a and Attr.LAYER_KIND in a


@dataclass
class Issues:
    """What a batch could not draw as given (the sink counts these in DROPS)."""

    spans: int = 0  # translated
    malformed_spans: int = 0  # ours but unusable: skipped
    foreign_drawn: int = 0  # not ours, drawn as a log line of their proof
    foreign_unattached: int = 0  # not ours, in no known proof: in the trace view only
    invalid_events: int = 0  # unusable events: skipped
    rejected_heatmaps: int = 0  # wrong shape: skipped
    coerced: int = 0  # bad optional values ignored, unknown kinds drawn as Unknown
    capped: dict[str, int] = field(default_factory=dict)  # item kind → count beyond a cap
    errors: list[str] = field(default_factory=list)  # first few translation errors

    def cap(self, what: str, n: int) -> None:
        if n > 0:
            self.capped[what] = self.capped.get(what, 0) + n


# ── attribute access that never raises ──────────────────────────────────────────────


def _int(attrs: Mapping[str, Any], key: str) -> int | None:
    v = attrs.get(key)
    return v if type(v) is int and v >= 0 else None


def _str(attrs: Mapping[str, Any], key: str) -> str | None:
    v = attrs.get(key)
    return v if isinstance(v, str) else None


def _num(attrs: Mapping[str, Any], key: str) -> float | None:
    v = attrs.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) \
        and math.isfinite(v) else None


def _seq(attrs: Mapping[str, Any], key: str) -> Sequence[Any]:
    v = attrs.get(key)
    return v if isinstance(v, Sequence) and not isinstance(v, str | bytes) else ()


def _text(value: object) -> str:
    s = str(value)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "…"


def _short(element: str | None) -> str:
    if element is None:
        return "?"
    return element if len(element) <= 24 else element[:21] + "…"


def _times(span: ReadableSpan) -> tuple[int, int]:
    start = span.start_time if isinstance(span.start_time, int) else 0
    end = span.end_time if isinstance(span.end_time, int) else start
    return start, max(end, start)


def _ms(start: int, end: int, replayed: bool = False) -> str:
    if replayed:  # span times of a replayed stream are not the prover's
        return "an unmeasured time (replayed stream)"
    return f"{(end - start) / 1e6:.1f} ms"


def claim_fingerprint(claim: str) -> float | None:
    """First limb of a canonical field element, mod 2³¹−1, over 2³¹−1 (not a magnitude)."""
    if claim.startswith("("):
        comma = claim.find(",")
        head = claim[1:comma] if comma > 0 else claim[1:-1]
    else:
        head = claim
    try:
        limb = int(head)
    except ValueError:
        try:
            value = fields.parse_canonical(claim)
        except ValueError:
            return None
        limb = value[0] if isinstance(value, tuple) else value
    return (limb % M31) / M31


def _event_time(ev: Event, default: int) -> int:
    t = ev.timestamp
    return t if isinstance(t, int) and t > 0 else default


class _Rounds:
    """Sumcheck rounds and trail segments of one proof in one batch, drawn vectorised.

    Per event only (time, round, claim fingerprint) is appended; everything that is
    per layer (index, start, round count, node position) is stored once per block.
    """

    __slots__ = ("blocks", "claim", "others", "rnd", "t", "trail")

    def __init__(self) -> None:
        self.others: list[Event] = []  # the current span's events that are not rounds
        self.t: list[int] = []
        self.rnd: list[int] = []
        self.claim: list[float] = []
        # (layer index, first event, events, layer start, declared rounds, bar slots, node)
        self.blocks: list[tuple[int, int, int, int, int, int, layout.Vec3]] = []
        # (time, layer index, from, to)
        self.trail: list[tuple[int, int, layout.Vec3, layout.Vec3]] = []


# ── the translator ───────────────────────────────────────────────────────────────────


class SpanTranslator:
    """Turns batches of finished spans into rows of a :class:`Frame`.

    Deterministic and free of I/O; it keeps the per-proof state that derived series
    need (:class:`ProofRegistry`) and the capability-gap table shared with metrics.
    """

    def __init__(self, proofs: ProofRegistry | None = None, gaps: GapTable | None = None) -> None:
        self.proofs = proofs if proofs is not None else ProofRegistry()
        self.gaps = gaps if gaps is not None else GapTable()

    def translate(self, spans: Sequence[ReadableSpan], frame: Frame, *,
                  witness: bool = False) -> Issues:
        issues = Issues()
        ours: list[ReadableSpan] = []
        foreign: list[ReadableSpan] = []
        for span in spans:
            (ours if getattr(span, "name", None) in _OURS or is_layer(span)
             else foreign).append(span)
        # Deterministic row order whatever the arrival order within a batch.
        ours.sort(key=lambda s: (_times(s), s.name))
        touched: dict[int, ProofModel] = {}
        rounds: dict[int, _Rounds] = {}
        for span in ours:
            ctx = span.context
            if ctx is None or not ctx.trace_id:
                issues.malformed_spans += 1
                continue
            model = self.proofs.get(ctx.trace_id)
            touched[ctx.trace_id] = model
            if span_attributes(span).get(STREAM_TIMING) == "replay":
                model.replayed = True
            try:
                self._place(model, frame)
                acc = rounds.get(ctx.trace_id)
                if acc is None:
                    acc = rounds[ctx.trace_id] = _Rounds()
                if self._span(span, model, frame, issues, witness, acc):
                    issues.spans += 1
                else:
                    issues.malformed_spans += 1
            except Exception as exc:  # a hostile span must never kill the exporter
                issues.malformed_spans += 1
                if len(issues.errors) < 5:
                    issues.errors.append(f"{span.name}: {exc!r}")
        for span in foreign:
            ctx = getattr(span, "context", None)
            trace_id = ctx.trace_id if ctx is not None else 0
            if not trace_id or not self.proofs.known(trace_id):
                issues.foreign_unattached += 1
                continue
            model = self.proofs.get(trace_id)
            try:
                self._foreign(span, model, frame, issues)
                issues.foreign_drawn += 1
            except Exception as exc:
                issues.malformed_spans += 1
                if len(issues.errors) < 5:
                    issues.errors.append(f"{getattr(span, 'name', '?')}: {exc!r}")
        for trace_id, acc in rounds.items():
            self._emit_rounds(touched[trace_id], acc, frame, issues)
        for model in touched.values():
            self._derived(model, frame)
        return issues

    # ── per proof ────────────────────────────────────────────────────────────────────

    def _place(self, model: ProofModel, frame: Frame) -> None:
        """Static per-proof series styles, once (:data:`SERIES`)."""
        if model.placed:
            return
        model.placed = True
        p = model.key
        frame.static(f"gkr/claim/{p}", series_style("claim fingerprint", points=True))
        frame.static(f"gkr/remaining/{p}", series_style("variables left", points=False))
        frame.static(f"proof/progress/{p}", series_style("layers done", points=False))
        if model.replayed:  # no measured durations: no duration series at all
            return
        frame.static(f"gkr/round_ms/{p}", series_style("round ms", points=True))
        frame.static(f"proof/binding_ms/{p}", series_style("binding ms", points=True))

    def _derived(self, model: ProofModel, frame: Frame) -> None:
        total = model.total_layers()
        if model.sent.get("_total") != {0: total}:
            model.sent["_total"] = {0: total}
            model.dirty_from = 0  # the denominator changed: every progress row may differ
        if model.dirty_from is None:
            return
        p = model.key
        for t, value in model.diff("progress", list(progress_rows(model))):
            frame.scalar(f"proof/progress/{p}", t, float(value))  # type: ignore[arg-type]
        for kind, rows in ({} if model.replayed else kind_seconds_rows(model)).items():
            # x = layer index over the whole proof, so every kind shares one axis. A
            # summary chart: one row per batch (its latest state) is what the live view
            # shows too, and a tensor per layer would be the costliest conversion here.
            changed = model.diff(f"seconds/{kind}", [(t, (total, b)) for t, b in rows])
            if changed:
                t, payload = changed[-1]
                size: int = payload[0]  # type: ignore[index]
                bars: tuple[tuple[int, float], ...] = payload[1]  # type: ignore[index]
                values = np.zeros(size, dtype=np.float32)
                for i, secs in bars:
                    if i < size:
                        values[i] = secs
                frame.bar_chart(f"proof/layer_seconds/{p}/{kind}", t, values,
                                colour=layout.kind_rgba(kind))
        model.dirty_from = None

    def _emit_rounds(self, model: ProofModel, acc: _Rounds, frame: Frame,
                     issues: Issues) -> None:
        if acc.trail:
            tt, tl, ta, tb = zip(*acc.trail, strict=True)
            frame.segments(TRAIL, np.asarray(tt, dtype=np.int64), np.asarray(ta), np.asarray(tb),
                           np.full(len(tt), layout.TRAIL, np.uint32), radius=0.07,
                           layer=np.asarray(tl, dtype=np.int64))
        if not acc.t:
            return
        p = model.key
        t = np.asarray(acc.t, dtype=np.int64)
        rnd = np.asarray(acc.rnd, dtype=np.int64)
        claim = np.asarray(acc.claim, dtype=np.float64)
        blocks = acc.blocks
        counts = np.asarray([b[2] for b in blocks], dtype=np.int64)
        firsts = np.asarray([b[1] for b in blocks], dtype=np.int64)
        layer = np.repeat(np.asarray([b[0] for b in blocks], dtype=np.int64), counts)
        total = np.repeat(np.asarray([b[4] for b in blocks], dtype=np.int64), counts)
        slots = np.repeat(np.asarray([b[5] for b in blocks], dtype=np.int64), counts)
        nodes = np.repeat(np.asarray([b[6] for b in blocks], dtype=np.float64), counts, axis=0)
        # Each round's wall time: since the previous round, or the layer's start.
        prev = np.empty_like(t)
        prev[1:] = t[:-1]
        prev[firsts] = np.asarray([b[3] for b in blocks], dtype=np.int64)
        dt = np.maximum(t - prev, 0).astype(np.float64)
        if model.replayed:  # replay times are not round times: uniform bars, no series
            dt[:] = 0.0
        remaining = total - rnd - 1
        if not model.replayed:
            frame.scalars(f"gkr/round_ms/{p}", t, dt / 1e6, layer=layer, rnd=rnd)
        known = (total > 0) & (remaining >= 0)
        frame.scalars(f"gkr/remaining/{p}", t[known], remaining[known] / total[known],
                      layer=layer[known], rnd=rnd[known])
        fp = ~np.isnan(claim)
        frame.scalars(f"gkr/claim/{p}", t[fp], claim[fp], layer=layer[fp], rnd=rnd[fp])
        bar = rnd < layout.MAX_BARS
        issues.cap("round_bars", int((~bar).sum()))
        if not bar.any():
            return
        centres, half = layout.round_bars(nodes[bar], rnd[bar], slots[bar],
                                          layout.bar_heights(dt[bar] / 1e9))
        shown_total = np.where(total[bar] > 0, total[bar], slots[bar])
        shown_left = np.where(total[bar] > 0, remaining[bar], slots[bar] - rnd[bar] - 1)
        # On proof_time only: an unsorted sequence timeline (layers run output → input)
        # makes Rerun re-sort the whole chunk, ~20x the cost of the send itself.
        frame.boxes(ROUNDS, t[bar], centres, half,
                    layout.remaining_colours(shown_left, shown_total))

    # ── spans ────────────────────────────────────────────────────────────────────────

    def _span(self, span: ReadableSpan, model: ProofModel, frame: Frame, issues: Issues,
              witness: bool, rounds: _Rounds) -> bool:
        name = span.name
        layer = is_layer(span)
        # A layer's events are read by its round loop (records unbuilt), which sets the
        # others aside.
        events: Sequence[Event] = () if layer else span_events(span)
        if layer:
            rounds.others = []
            if not self._layer(span, model, frame, issues, witness, rounds):
                return False
            area = "gkr"
            events = rounds.others
        elif name == SpanName.PROOF:
            self._proof(span, model, frame)
            area = "proof"
        elif name == SpanName.CIRCUIT_COMPILE:
            self._circuit(span, model, frame, issues)
            area = "proof"
        elif name == SpanName.WEIGHT_OPENING:
            self._weight_opening(span, model, frame)
            area = "weights"
        elif name == SpanName.AGGREGATED_BINDING:
            self._binding(span, model, frame)
            area = "proof"
        elif name == SpanName.STARK:
            self._stark(span, model, frame)
            area = "stark"
        elif name == SpanName.WITNESS:
            self._witness_phase(span, model, frame)
            area = "proof"
        else:  # SpanName.VERIFY
            self._verify(span, model, frame)
            area = "proof"
        self._gpu_cost(span, model, frame)
        self._common_events(span, events, model, frame, issues, area)
        return True

    def _witness_phase(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        start, end = _times(span)
        model.touch(end)
        frame.text(f"logs/proof/{model.key}", end,
                   f"witness generated in {_ms(start, end, model.replayed)}")

    def _gpu_cost(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        """A phase's measured GPU cost: the layer's kernel-time bar next to the walk, and
        kernel time, energy and bytes per phase as series (stamped at the phase's end).
        The proof span's totals are not plotted (they are the sum of these)."""
        if span.name == SpanName.PROOF:
            return
        a = span_attributes(span)
        if Attr.GPU_DISPATCH_COUNT not in a and Attr.GPU_ENERGY not in a \
                and Attr.GPU_KERNEL_TIME not in a:
            return  # no GPU work measured in this phase: nothing below would draw
        _, end = _times(span)
        p = model.key
        layer: int | None = None
        if is_layer(span):
            layer = _int(a, Attr.LAYER_INDEX)
            if layer is not None and layer > MAX_LAYER_INDEX:
                layer = None
        if not model.gpu_styled and (Attr.GPU_DISPATCH_COUNT in a or Attr.GPU_ENERGY in a):
            # Points, not lines: consecutive phases are different work, not one signal.
            model.gpu_styled = True
            for path, name in ((f"gpu/phase/kernel_ms/{p}", "GPU kernel ms"),
                               (f"gpu/phase/energy_j/{p}", "GPU energy J"),
                               (f"gpu/phase/bytes/{p}/upload", "bytes uploaded"),
                               (f"gpu/phase/bytes/{p}/readback", "bytes read back")):
                frame.static(path, series_style(name, points=True))
        kernel_s = _num(a, Attr.GPU_KERNEL_TIME)
        if kernel_s is not None and kernel_s >= 0:
            frame.scalar(f"gpu/phase/kernel_ms/{p}", end, kernel_s * 1e3)
            if layer is not None:
                kind = _str(a, Attr.LAYER_KIND) or LayerKind.UNKNOWN.value
                centre, half = layout.gpu_bar(
                    layout.node_position(layer, kind, model.offset), kernel_s)
                frame.boxes(GPU_TIME, np.asarray([end], dtype=np.int64),
                            np.asarray([centre]), np.asarray([half]),
                            np.asarray([layout.GPU_BAR], dtype=np.uint32))
        energy = _num(a, Attr.GPU_ENERGY)
        if energy is not None and energy >= 0:
            frame.scalar(f"gpu/phase/energy_j/{p}", end, energy)
        for key, direction in ((Attr.GPU_UPLOAD_SIZE, "upload"),
                               (Attr.GPU_READBACK_SIZE, "readback")):
            nbytes = _int(a, key)
            if nbytes is not None and _int(a, Attr.GPU_DISPATCH_COUNT):
                frame.scalar(f"gpu/phase/bytes/{p}/{direction}", end, float(nbytes))

    def _proof(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        a = span_attributes(span)
        start, end = _times(span)
        model.start, model.end = start, end
        declared = _int(a, Attr.PROOF_LAYERS)
        if declared is not None and declared <= MAX_LAYER_INDEX:
            model.declared_layers = declared
        model.touch(start)
        p = model.key
        parts = [f"system={_str(a, Attr.PROOF_SYSTEM) or '?'}",
                 f"backend={_str(a, Attr.PROOF_BACKEND) or '?'}"]
        for key, label in ((Attr.PROOF_MODEL_NAME, "model"), (Attr.PROOF_LAYERS, "layers"),
                           (Attr.PROOF_INPUT_SHAPE, "input"), (Attr.PROOF_OUTPUT_SHAPE, "output")):
            if key in a:
                parts.append(f"{label}={_fmt(a[key])}")
        frame.text(f"logs/proof/{p}", start, _text(f"proof {p} started: " + " ".join(parts)))
        verified = a.get(Attr.PROOF_VERIFIED)
        failed = span.status.status_code is StatusCode.ERROR or verified is False
        done = [f"{k.split('.')[-1]}={_fmt(a[k])}" for k in
                (Attr.PROOF_LAYER_PROOFS, Attr.PROOF_WEIGHT_OPENINGS, Attr.PROOF_SIZE,
                 Attr.PROOF_VERIFIED) if k in a]
        status = f" — {span.status.description}" if failed and span.status.description else ""
        took = ("(replayed stream: its times are replay times, not the prover's)"
                if model.replayed else f"in {(end - start) / 1e9:.3f} s")
        frame.text(f"logs/proof/{p}", end,
                   _text(f"proof {p} {'FAILED' if failed else 'finished'} {took}: "
                         f"{' '.join(done)}{status}"),
                   "ERROR" if failed else "INFO")
        # The walk is over: dismiss the cursor.
        frame.points(f"gkr/walk/{p}/cursor", end, [])
        # Whether or not a circuit span came (or will come) too: the rows must not depend
        # on arrival order. A circuit compiled during the proof redraws it at its end.
        if model.declared_layers:
            self._backbone(model, frame, start, range(model.declared_layers))

    def _backbone(self, model: ProofModel, frame: Frame, t: int,
                  indices: Sequence[int] | range) -> None:
        idx = sorted(set(indices))
        if len(idx) < 2:
            return
        ox, oy, oz = model.offset
        frame.strips(f"circuit/{model.key}/backbone", t,
                     [[(x + ox, y + oy, z + oz) for x, y, z in map(layout.helix, idx)]],
                     colour=layout.BACKBONE, radius=0.03)

    def _circuit(self, span: ReadableSpan, model: ProofModel, frame: Frame,
                 issues: Issues) -> None:
        a = span_attributes(span)
        start, end = _times(span)
        p = model.key
        raw_idx = _seq(a, Attr.CIRCUIT_NODE_INDEX)
        kinds = _seq(a, Attr.CIRCUIT_NODE_KIND)
        costs = _seq(a, Attr.CIRCUIT_NODE_TRACE_COST)
        issues.cap("circuit_nodes", len(raw_idx) - MAX_CIRCUIT_NODES)
        nodes: dict[int, tuple[str, int | None]] = {}
        for n, idx in enumerate(raw_idx[:MAX_CIRCUIT_NODES]):
            if type(idx) is not int or not 0 <= idx <= MAX_LAYER_INDEX:
                issues.coerced += 1
                continue
            kind = kinds[n] if n < len(kinds) else None
            if kind not in _KINDS:
                issues.coerced += 1
                kind = LayerKind.UNKNOWN.value
            cost = costs[n] if n < len(costs) and type(costs[n]) is int else None
            nodes[idx] = (str(kind), cost)
        off = model.offset
        if nodes:
            model.circuit_nodes = len(nodes)
            for idx, (kind, _) in nodes.items():
                model.kinds[idx] = kind
            model.touch(end)
            order = sorted(nodes)
            # Unlabelled: the walk's labels come from the layers as they are proved
            # (LABELS, in _layer), so a circuit that arrives after its layers draws the
            # same picture as one that arrived first.
            frame.points(f"circuit/{p}/nodes", end, [
                Node(layout.node_position(i, nodes[i][0], off),
                     layout.kind_rgba(nodes[i][0], 0x90), layout.node_radius(nodes[i][1]) * 0.6,
                     walk_label(i, nodes[i][0])) for i in order],
                show_labels=False)
            self._backbone(model, frame, end, order)
            strips = self._edges(a, nodes, off, issues)
            if strips:
                frame.strips(f"circuit/{p}/edges", end, strips, colour=layout.EDGE, radius=0.025)
        n_edges = len(_seq(a, Attr.CIRCUIT_EDGE_FROM))
        took = _ms(start, end, model.replayed)
        frame.text(f"logs/proof/{p}", end,
                   f"circuit compiled in {took}: {len(nodes)} nodes, {n_edges} edges")

    def _edges(self, a: Mapping[str, Any], nodes: dict[int, tuple[str, int | None]],
               off: layout.Vec3, issues: Issues) -> list[list[layout.Vec3]]:
        src = _seq(a, Attr.CIRCUIT_EDGE_FROM)
        dst = _seq(a, Attr.CIRCUIT_EDGE_TO)
        n = min(len(src), len(dst))
        issues.coerced += abs(len(src) - len(dst))
        issues.cap("circuit_edges", n - MAX_CIRCUIT_EDGES)
        strips = []
        for f, t in zip(src[:MAX_CIRCUIT_EDGES], dst[:MAX_CIRCUIT_EDGES], strict=False):
            if f not in nodes or t not in nodes:
                issues.coerced += 1
                continue
            strips.append([layout.node_position(f, nodes[f][0], off),
                           layout.node_position(t, nodes[t][0], off)])
        return strips

    def _layer(self, span: ReadableSpan, model: ProofModel, frame: Frame, issues: Issues,
               witness: bool, acc: _Rounds) -> bool:
        a = span_attributes(span)
        index = _int(a, Attr.LAYER_INDEX)
        if index is None or index > MAX_LAYER_INDEX:
            return False
        kind = a.get(Attr.LAYER_KIND)
        if kind not in _KINDS:
            issues.coerced += 1
            kind = LayerKind.UNKNOWN.value
        kind = str(kind)
        total = _int(a, Attr.SUMCHECK_ROUNDS) or 0
        cost = _int(a, Attr.LAYER_TRACE_COST)
        start, end = _times(span)
        ok = span.status.status_code is not StatusCode.ERROR
        p = model.key
        pos = layout.node_position(index, kind, model.offset)
        radius = layout.node_radius(cost)
        # A phase under its own name (groth16.msm), or renamed by mapping, is shown by it.
        shown = _str(a, Attr.MAPPING_SOURCE_NAME) or (
            span.name if span.name != SpanName.LAYER else kind)
        label = f"{shown} [{index}]"
        took = _ms(start, end, model.replayed)
        frame.point(NODES, start, Node(pos, layout.kind_rgba(kind), radius, f"{label} · {p}"),
                    layer=index, show_labels=False)
        if model.ordinal == 0:
            # Labels on the first proof's helix only (later helices repeat its layout and
            # their labels would pile onto the first's at this distance), one per layer
            # as it starts: the same whether or not a circuit declared the layers, and
            # whether that circuit arrived before them or after.
            frame.point(LABELS, start, Node(pos, layout.kind_rgba(kind), radius * 0.5,
                                            walk_label(index, kind if kind != "Unknown"
                                                       else shown)), layer=index)
        frame.point(f"gkr/walk/{p}/cursor", start,
                    Node(pos, layout.CURSOR, radius + layout.CURSOR_MARGIN, f"proving {label}"))
        logs = f"logs/gkr/{p}"
        hw = a.get(Attr.HW_ID)
        frame.text(logs, start, _text(
            f"→ [{index}] {shown} ({a.get(Attr.LAYER_PROOF_KIND, '?')}, {total} rounds) "
            f"claim={_short(_str(a, Attr.CLAIM_INITIAL))}" + (f" on GPU {hw}" if hw else "")),
            layer=index)

        done = self._rounds(span, index, total, pos, start, end, acc, frame, logs, issues)

        model.add_layer(LayerSummary(index, kind, start, end, ok))
        # Proved: a translucent shell in the layer's kind colour (a green one hid the
        # kind under it); failed: red.
        frame.point(NODES, end, Node(pos, layout.kind_rgba(kind, 0x70) if ok
                                     else layout.FAILED_SHELL,
                                     radius * layout.SHELL_SCALE,
                                     f"{label} · {p} {'proved' if ok else 'FAILED'} in {took}"),
                    layer=index, show_labels=False)
        if ok:
            frame.text(logs, end, _text(f"[{index}] proved {shown} in {took} ({done}/{total} "
                                        f"rounds) claim={_short(_str(a, Attr.CLAIM_FINAL))}"),
                       layer=index)
            self._trail(model, index, pos, end, acc)
        else:
            frame.text(logs, end, _text(f"[{index}] {shown} FAILED after {took}: "
                                        f"{span.status.description or 'error'}"), "ERROR",
                       layer=index)
        if witness:
            self._witness(span, acc.others, model, frame, issues, index)
        return True

    def _rounds(self, span: ReadableSpan, index: int, total: int, pos: layout.Vec3,
                start: int, end: int, acc: _Rounds, frame: Frame, logs: str,
                issues: Issues) -> int:
        """Collect the layer's sumcheck rounds into ``acc``; returns how many were valid."""
        first = len(acc.t)
        t_app, r_app, c_app = acc.t.append, acc.rnd.append, acc.claim.append
        last = 0
        slots = max(total, 1)
        ordered = True
        round_key, claim_key, error_key = Attr.SUMCHECK_ROUND, Attr.CLAIM, Attr.ERROR_TYPE
        name = EventName.SUMCHECK_ROUND
        nan, m31 = math.nan, M31
        other_at: list[int] = []
        # The hot loop of a batch: one pass, plain dicts, the fingerprint's fast path
        # inline; round records are read without building an Event or their OTLP
        # attributes each (round_outline).
        events = span_events_unread(span)
        for i, (ev_name, t, a, _) in enumerate(outline(events)):
            if ev_name != name:
                other_at.append(i)
                continue
            a = a or {}
            if type(t) is not int or t <= 0:
                t = end
            rnd = a.get(round_key)
            if error_key in a:
                frame.text(logs, t, _text(f"[{index}] round {rnd} rejected by the "
                                          f"instrumentation: {a[error_key]}"), "WARN",
                           layer=index)
                continue
            if type(rnd) is not int or rnd < 0:
                issues.invalid_events += 1
                continue
            claim = a.get(claim_key)
            fp = nan
            if type(claim) is int:  # a record's claim, unformatted: str(claim)'s value
                fp = (claim % m31) / m31
            elif type(claim) is tuple or type(claim) is list:
                # A deferred record's int limbs (checked on the prover thread): the
                # canonical string's head, without formatting the string.
                fp = (claim[0] % m31) / m31
            elif type(claim) is str:
                head = claim[1:claim.find(",")] if claim[:1] == "(" and "," in claim else claim
                try:
                    fp = (int(head) % m31) / m31
                except ValueError:
                    slow = claim_fingerprint(claim)
                    if slow is None:
                        issues.coerced += 1
                    else:
                        fp = slow
            elif claim is not None:
                issues.coerced += 1
            if t < last:
                ordered = False
            last = t
            t_app(t)
            r_app(rnd)
            c_app(fp)
            if rnd >= slots:
                slots = rnd + 1
        if other_at:  # a user's or a witness event among the rounds: only those as events
            acc.others.extend(events_at(events, other_at))
        n = len(acc.t) - first
        if not ordered:  # events of a foreign producer: sort the block by time
            block = sorted(zip(acc.t[first:], acc.rnd[first:], acc.claim[first:],
                               strict=True))
            acc.t[first:], acc.rnd[first:], acc.claim[first:] = (list(c) for c in zip(
                *block, strict=True))
        if n:
            # Bars fan out over the declared round count (or the rounds seen).
            acc.blocks.append((index, first, n, start, total, min(slots, layout.MAX_BARS), pos))
        return n

    def _trail(self, model: ProofModel, index: int, pos: layout.Vec3, end: int,
               acc: _Rounds) -> None:
        """A segment to each proved neighbour, at the later of the two end times."""
        for la in model.proved_neighbours(index):
            other = layout.node_position(la.index, la.kind, model.offset)
            # Drawn from the lower layer to the higher, whichever arrived second.
            a, b = (pos, other) if index < la.index else (other, pos)
            acc.trail.append((max(end, la.end), max(index, la.index), a, b))

    def _witness(self, span: ReadableSpan, others: Sequence[Event], model: ProofModel,
                 frame: Frame, issues: Issues, index: int) -> None:
        """The layer's witness events, among ``others``: the events its round loop set
        aside (reading the span's events again would build every round's)."""
        p = model.key
        _, end = _times(span)
        if not model.witness_styled:
            model.witness_styled = True
            for key in _STATS:
                name = key.rsplit(".", 1)[-1]
                frame.static(f"inference/stats/{p}/{name}",
                             series_style(f"activation {name}", points=False))
        for ev in others:
            if ev.name == EventName.LAYER_ACTIVATION:
                a = ev.attributes or {}
                if Attr.ERROR_TYPE in a:
                    continue  # rejected at the source and counted there
                t = _event_time(ev, end)
                layer = _int(a, Attr.LAYER_INDEX)
                layer = index if layer is None else layer
                values = [_num(a, k) for k in _STATS]
                if any(v is None for v in values):
                    issues.invalid_events += 1
                    continue
                for key, v in zip(_STATS, values, strict=True):
                    frame.scalar(f"inference/stats/{p}/{key.rsplit('.', 1)[-1]}", t,
                                 float(v), layer=layer)  # type: ignore[arg-type]
                sample = _seq(a, Attr.ACTIVATION_SAMPLE)
                issues.cap("activation_sample", len(sample) - MAX_ACTIVATION_SAMPLE)
                nums = [float(x) for x in sample[:MAX_ACTIVATION_SAMPLE]
                        if isinstance(x, int | float) and not isinstance(x, bool)
                        and math.isfinite(x)]
                if nums:
                    frame.bar_chart(f"inference/{p}/layer_{layer}/output", t, nums,
                                    colour=layout.kind_rgba(LayerKind.ACTIVATION.value))
            elif ev.name == EventName.ATTENTION_HEATMAP:
                self._heatmap(ev, model, frame, issues, index, end)

    def _heatmap(self, ev: Event, model: ProofModel, frame: Frame, issues: Issues,
                 index: int, default_t: int) -> None:
        a = ev.attributes or {}
        if Attr.ERROR_TYPE in a:
            return
        t = _event_time(ev, default_t)
        head = _int(a, Attr.ATTENTION_HEAD)
        side = _int(a, Attr.ATTENTION_SEQ_LEN)
        scores = _seq(a, Attr.ATTENTION_SCORES)
        n = len(scores)
        reason = None
        if head is None:
            reason = "missing head index"
        elif n < 1:
            reason = "no score matrix"
        elif n > MAX_ATTENTION_SIDE ** 2 or (side or 0) > MAX_ATTENTION_SIDE:
            reason = f"{n} scores exceed the {MAX_ATTENTION_SIDE}×{MAX_ATTENTION_SIDE} cap"
        elif side is None or side * side != n:
            reason = f"{n} scores are not a square seq_len×seq_len matrix (seq_len={side})"
        arr: np.ndarray | None = None
        if reason is None and side is not None:
            try:
                arr = np.asarray(scores, dtype=np.float32).reshape(side, side)
            except (TypeError, ValueError):
                reason = "scores are not numbers"
            if arr is not None and not np.isfinite(arr).all():
                reason, arr = "scores are not finite", None
        if reason is not None or arr is None:
            issues.rejected_heatmaps += 1
            frame.text(f"logs/gkr/{model.key}", t,
                       f"[{index}] attention heatmap head {head} rejected: {reason}", "WARN",
                       layer=index)
            return
        frame.tensor(f"inference/{model.key}/layer_{index}/attn_head_{head}", t, arr, layer=index)

    def _weight_opening(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        a = span_attributes(span)
        start, end = _times(span)
        node = a.get(Attr.WEIGHT_NODE_ID, "?")
        logs = f"logs/weights/{model.key}"
        frame.text(logs, start, _text(f"weight opening node={_fmt(node)} eval point length="
                                      f"{_fmt(a.get(Attr.WEIGHT_EVAL_POINT_LENGTH, '?'))}"))
        commitment = _str(a, Attr.WEIGHT_COMMITMENT)
        took = _ms(start, end, model.replayed)
        frame.text(logs, end, _text(f"weight opening node={_fmt(node)} done in {took}"
                                    + (f" commitment={commitment}" if commitment else "")),
                   _level(span))

    def _binding(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        a = span_attributes(span)
        start, end = _times(span)
        logs = f"logs/proof/{model.key}"
        frame.text(logs, start, f"aggregated binding: {_fmt(a.get(Attr.BINDING_CLAIMS, '?'))} "
                                f"claims, {_fmt(a.get(Attr.BINDING_MATRICES, '?'))} matrices")
        felts = a.get(Attr.BINDING_CALLDATA_FELTS)
        frame.text(logs, end, f"aggregated binding done in {_ms(start, end, model.replayed)}"
                   + (f", ~{_fmt(felts)} calldata felts" if felts is not None else ""),
                   _level(span))
        if not model.replayed:
            frame.scalar(f"proof/binding_ms/{model.key}", end, (end - start) / 1e6)

    def _stark(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        a = span_attributes(span)
        start, end = _times(span)
        logs = f"logs/stark/{model.key}"
        frame.text(logs, start, "STARK proof: activations="
                   f"{_fmt(a.get(Attr.STARK_ACTIVATION_LAYERS, '?'))} add="
                   f"{_fmt(a.get(Attr.STARK_ADD_LAYERS, '?'))} layernorm="
                   f"{_fmt(a.get(Attr.STARK_LAYERNORM_LAYERS, '?'))}")
        frame.text(logs, end, f"STARK proof done in {_ms(start, end, model.replayed)}",
                   _level(span))

    def _verify(self, span: ReadableSpan, model: ProofModel, frame: Frame) -> None:
        a = span_attributes(span)
        start, end = _times(span)
        verified = a.get(Attr.PROOF_VERIFIED)
        ok = verified is not False and span.status.status_code is not StatusCode.ERROR
        word = "verified" if verified is True else "REJECTED" if verified is False else "finished"
        frame.text(f"logs/proof/{model.key}", end,
                   f"verification {word} in {_ms(start, end, model.replayed)}",
                   "INFO" if ok else "ERROR")

    def _foreign(self, span: ReadableSpan, model: ProofModel, frame: Frame,
                 issues: Issues) -> None:
        start, end = _times(span)
        frame.text(f"logs/proof/{model.key}", end,
                   _text(f"span {span.name}: {_ms(start, end, model.replayed)}"),
                   _level(span, "DEBUG"))
        self._common_events(span, span_events(span), model, frame, issues, "proof")

    # ── events any span may carry ────────────────────────────────────────────────────

    def _common_events(self, span: ReadableSpan, events: Sequence[Event], model: ProofModel,
                       frame: Frame, issues: Issues, area: str) -> None:
        _, end = _times(span)
        p = model.key
        for ev in events:
            name = ev.name
            if name == EventName.SUMCHECK_ROUND:
                continue
            a = ev.attributes or {}
            if name in _GPU_EVENTS:
                self._gpu_event(ev, model, frame, _event_time(ev, end))
            elif name == "exception":
                frame.text(f"logs/{area}/{p}", _event_time(ev, end), _text(
                    f"{a.get('exception.type', 'exception')}: {a.get('exception.message', '')}"),
                    "ERROR")
            elif name == EventName.LOG:
                message = a.get(_LOG_MESSAGE)
                if message is None:
                    issues.invalid_events += 1
                    continue
                level = _LOG_LEVELS.get(str(a.get(_LOG_LEVEL, "Info")), "INFO")
                frame.text(f"logs/{area}/{p}", _event_time(ev, end), _text(message), level)

    def _gpu_event(self, ev: Event, model: ProofModel, frame: Frame, t: int) -> None:
        a = ev.attributes or {}
        backend = _str(a, Attr.GPU_BACKEND) or "?"
        device = _str(a, Attr.HW_ID) or "?"
        logs = f"logs/gpu/{model.key}"
        if ev.name == EventName.GPU_CAPABILITY_UNSUPPORTED:
            gap = Gap(backend, device, str(a.get(Attr.GPU_CAPABILITY, "?")),
                      str(a.get(Attr.GPU_CAPABILITY_REASON, "?")))
            frame.text(logs, t, _text(f"GPU capability unavailable: {gap.capability} "
                                      f"({gap.reason}) on {backend} device {device}"), "WARN")
            if self.gaps.add(gap, t, "span event"):
                frame.document("gpu/capability_gaps", t, self.gaps.markdown())
        elif ev.name == EventName.GPU_ADAPTER_ACQUIRED:
            frame.text(logs, t, _text(
                f"GPU adapter: {_str(a, Attr.HW_NAME) or '?'} ({backend}, vendor "
                f"{_str(a, Attr.HW_VENDOR) or '?'}, driver {_str(a, Attr.HW_DRIVER_VERSION) or '?'}"
                f", hw.id {device})"))
        elif ev.name == EventName.GPU_FAULT:
            frame.text(logs, t, _text(f"GPU fault on {backend} device {device}: "
                                      f"{a.get(Attr.GPU_FAULT_KIND, '?')}"), "WARN")
        elif ev.name == EventName.GPU_RETRY:
            frame.text(logs, t, _text(f"GPU dispatch retried on {backend} device {device}: "
                                      f"attempt {a.get(Attr.GPU_RETRY_ATTEMPT, '?')}"), "WARN")
        else:
            frame.text(logs, t, _text(f"GPU work recovered on {backend} device {device} via "
                                      f"{a.get(Attr.GPU_RECOVERY_ROUTE, '?')}"))


def _level(span: ReadableSpan, ok: str = "INFO") -> str:
    return "ERROR" if span.status.status_code is StatusCode.ERROR else ok


def _fmt(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ",".join(str(v) for v in value[:16]) + (",…" if len(value) > 16 else "") \
            + "]"
    return _text(value)
