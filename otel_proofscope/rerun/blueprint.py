"""The viewer layout, chosen by what the recording holds (stwo-ml's Rerun arrangement).

A recording can hold proof-contract data (the 3D walk, claims, layer stats), a trace of
any prover (flame chart, span log, span durations), metrics, or several of these. The
layout shows the panels that have data, and nothing else:

* **proof + trace** (``proofscope demo``, ``configure()``, ``serve --map``): top, the 3D
  "ZK Proof Walk" left (3 : 2) with "GKR Claim & Progress" above "Round Time & GPU";
  below, the "Trace" flame chart left with a tab strip of logs, span log, span
  durations, layer seconds, capability gaps, proof metrics and attention;
* **trace only** (a foreign prover through ``serve``, ``import``): the flame chart is the
  main view, span durations and the span log beside it (metrics in a tab when present);
* **proof only** (a walk without trace rows): the walk with the series and logs;
* **metrics only**: the series.

:class:`Layouts` watches what a sink sends and says when the layout must change (a new
kind of data arrived: ``serve`` first receives foreign spans, later contract spans). The
time and side panels are collapsed in every recording (``proofscope diff --rerun``
too), so the views get the whole 1280 × 800 window. Filters select by the quantity's
group (``gkr/claim/**``), which is why entity paths put the proof id *after* the group;
with one proof, its id is named once in the panel titles.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import rerun.blueprint as rrb
from rerun.blueprint.encodings import TextLogColumn, TextLogColumnKind

from otel_proofscope.rerun.columns import LAYER, PROOF_TIME, SUMCHECK_ROUND
from otel_proofscope.rerun.layout import X_STEP
from otel_proofscope.rerun.translate import ACCUMULATING
from otel_proofscope.rerun.translate_trace import DURATIONS, FLAME, LOGS

#: Kinds of data a recording can hold, by the first part of their entity path.
PROOF = "proof"
TRACE = "trace"
METRICS = "metrics"
_KIND_OF_GROUP = {
    "circuit": PROOF, "gkr": PROOF, "inference": PROOF, "logs": PROOF,
    "trace": TRACE,
    "gpu": METRICS, "metrics": METRICS,
}
#: Per-proof groups whose next path part is the proof key.
_KEYED = ("gkr/claim/", "circuit/")

#: Legends in a corner, never over most of a plot.
LEGEND = rrb.PlotLegend(corner=rrb.Corner2D.LeftTop, visible=True)




@functools.cache
def _log_columns() -> rrb.TextLogColumns:
    """Time, level and body: the entity path (which proof, which service) is in the
    selection panel; as a column it took a third of a narrow log's width."""
    return rrb.TextLogColumns(text_log_columns=[
        TextLogColumn(TextLogColumnKind.EntityPath, visible=False),
        TextLogColumn(TextLogColumnKind.LogLevel), TextLogColumn(TextLogColumnKind.Body)])


def _log(name: str, origin: str) -> rrb.TextLogView:
    return rrb.TextLogView(name=name, origin=origin, columns=_log_columns())


@dataclass(frozen=True)
class Contents:
    """What a recording holds, as far as the layout cares."""

    kinds: frozenset[str] = frozenset()
    #: The one proof's key (trace-id prefix) when the recording holds exactly one.
    proof: str | None = None
    proofs: int = 0
    #: The layer count the one proof's walk is framed for (:func:`walk_class`; 0: not
    #: known yet, or not one proof: the viewer's own eye).
    walk_layers: int = 0


#: Under ``proof/``: the walk's own series; anything else there is a proof metric.
_PROOF_SERIES = ("proof/progress/", "proof/layer_seconds/", "proof/binding_ms/")


def group_kind(path: str) -> str | None:
    p = path.lstrip("/")
    head = p.split("/", 1)[0]
    if head == "proof":
        return PROOF if p.startswith(_PROOF_SERIES) else METRICS
    return _KIND_OF_GROUP.get(head)


def proof_key(path: str) -> str | None:
    p = path.lstrip("/")
    for prefix in _KEYED:
        if p.startswith(prefix):
            rest = p[len(prefix):].split("/", 1)[0]
            return rest or None
    return None


class Layouts:
    """Follows a sink's sends; :meth:`observe` returns a new blueprint when the layout
    must change (a new kind of data, or a recording's first proof becoming one of
    several), ``None`` otherwise. Cheap: a set lookup per send."""

    def __init__(self) -> None:
        self._kinds: set[str] = set()
        self._proofs: set[str] = set()
        self.contents = Contents()

    def current(self) -> rrb.Blueprint | None:
        """The layout for what was seen so far; ``None`` before any data (the first
        batch sends it: a recording gets one blueprint per kind of content)."""
        return build(self.contents) if self.contents.kinds else None

    def observe(self, paths: Iterable[str],
                walk_layers: Callable[[], int] = lambda: 0) -> rrb.Blueprint | None:
        """``walk_layers()``: the most layers a proof's walk has so far (for its camera;
        asked only while the recording holds one proof)."""
        for path in paths:
            kind = group_kind(path)
            if kind is not None:
                self._kinds.add(kind)
            key = proof_key(path)
            if key is not None and len(self._proofs) < 2:
                self._proofs.add(key)
        one = next(iter(self._proofs)) if len(self._proofs) == 1 else None
        now = Contents(frozenset(self._kinds), one, len(self._proofs),
                       walk_class(walk_layers()) if one is not None else 0)
        if now == self.contents:
            return None
        self.contents = now
        return build(now)


@functools.cache
def accumulate() -> rrb.VisibleTimeRanges:
    """Everything from the start of the timeline up to the time cursor (one object,
    shared: converting it to Arrow costs ~1 ms each time, and the walk has 4 users)."""
    start = rrb.TimeRangeBoundary.infinite()
    end = rrb.TimeRangeBoundary.cursor_relative()
    return rrb.VisibleTimeRanges([rrb.VisibleTimeRange(timeline, start=start, end=end)
                                  for timeline in (PROOF_TIME, LAYER, SUMCHECK_ROUND)])


def _titled(name: str, contents: Contents) -> str:
    return f"{name} · proof {contents.proof}" if contents.proof else name


def walk_class(layers: int) -> int:
    """The layer count a walk's camera is framed for: the next power of two from 4, so
    a proof streaming in changes the blueprint (and resets a camera the user moved) a
    few times, not once per layer; 0 for none."""
    return 0 if layers <= 0 else max(4, 1 << (layers - 1).bit_length())


def walk_eye(layers: int) -> rrb.EyeControls3D:
    """A camera facing the helix from the side, far enough to hold ``layers`` nodes and
    their round bars: the viewer's own eye sits too close to a short walk (layer 0 of a
    4-layer walk was cut off, docs/images/serve-map.png)."""
    centre = (layers - 1) * X_STEP / 2
    distance = 9.0 + 1.3 * centre
    # A little from the left, as the viewer's own eye looks: the helix's depth keeps
    # neighbouring labels apart.
    return rrb.EyeControls3D(
        position=(centre - 0.25 * distance, 1.5 + 0.35 * distance, distance),
        look_target=(centre, 1.5, 0.0), eye_up=(0.0, 1.0, 0.0))


def _walk(c: Contents) -> rrb.Spatial3DView:
    # Layer nodes, round bars and the trail are one row per event on shared entities;
    # shown accumulated, they build the walk up as the time cursor advances.
    return rrb.Spatial3DView(
        name=_titled("ZK Proof Walk", c), origin="/",
        contents=["+ /circuit/**", "+ /gkr/walk/**"],
        eye_controls=walk_eye(c.walk_layers) if c.walk_layers else None,
        overrides={path: accumulate() for path in ACCUMULATING})


def _claim(c: Contents) -> rrb.TimeSeriesView:
    return rrb.TimeSeriesView(
        name="GKR Claim & Progress", origin="/",
        contents=["+ /gkr/claim/**", "+ /gkr/remaining/**", "+ /proof/progress/**"],
        plot_legend=LEGEND)


def _stats(c: Contents) -> rrb.TimeSeriesView:
    return rrb.TimeSeriesView(
        name="Round Time & GPU", origin="/",
        contents=["+ /gpu/**", "+ /gkr/round_ms/**", "+ /proof/binding_ms/**"],
        plot_legend=LEGEND)


def _activations() -> rrb.TimeSeriesView:
    # Witness data, opt-in: a tab of its own (five series would bury the timing plot).
    return rrb.TimeSeriesView(name="Layer stats", origin="/inference/stats",
                              plot_legend=LEGEND)


def _proof_tabs(c: Contents) -> list[rrb.View]:
    return [
        _log("Logs", "/logs"),
        rrb.BarChartView(name="Layer seconds by kind", origin="/proof/layer_seconds"),
        _activations(),
        rrb.TextDocumentView(name="Capability gaps", origin="/gpu/capability_gaps"),
        rrb.TimeSeriesView(name="Proof metrics", origin="/",
                           contents=["+ /proof/**", "- /proof/progress/**",
                                     "- /proof/layer_seconds/**", "+ /metrics/**"],
                           plot_legend=LEGEND),
        rrb.TensorView(name="Attention", origin="/inference"),
    ]


def _flame() -> rrb.Spatial2DView:
    # One box per span at its start time; accumulated, the flame chart grows as the
    # time cursor advances and is complete at the end of the timeline.
    return rrb.Spatial2DView(name="Trace", origin=f"/{FLAME}", time_ranges=accumulate())


def _span_log() -> rrb.TextLogView:
    return _log("Span log", f"/{LOGS}")


def _durations() -> rrb.TimeSeriesView:
    # One series per span name: dozens in a real trace, with long names (viztracer's
    # "func (file:line)"). A legend would bury the plot; hovering a point names it.
    return rrb.TimeSeriesView(name="Span durations (ms)", origin=f"/{DURATIONS}",
                              plot_legend=rrb.PlotLegend(visible=False))


def _metrics() -> rrb.TimeSeriesView:
    return rrb.TimeSeriesView(name="Metrics", origin="/",
                              contents=["+ /gpu/**", "+ /metrics/**", "+ /proof/**"],
                              plot_legend=LEGEND)


def _root(c: Contents) -> rrb.Container:
    proof, trace = PROOF in c.kinds, TRACE in c.kinds
    if proof and trace:
        return rrb.Vertical(
            rrb.Horizontal(_walk(c), rrb.Vertical(_claim(c), _stats(c)),
                           column_shares=[3, 2]),
            rrb.Horizontal(_flame(), rrb.Tabs(*_proof_tabs(c)[:1], _span_log(), _durations(),
                                              *_proof_tabs(c)[1:], name="Details"),
                           column_shares=[3, 2]),
            row_shares=[3, 2])
    if proof:
        return rrb.Horizontal(
            _walk(c),
            rrb.Vertical(_claim(c), _stats(c), rrb.Tabs(*_proof_tabs(c), name="Details")),
            column_shares=[3, 2])
    if trace:
        side: list[rrb.View | rrb.Container] = [_durations()]
        bottom: list[rrb.View] = [_span_log()]
        if METRICS in c.kinds:
            bottom.append(_metrics())
        side.append(rrb.Tabs(*bottom, name="Trace details") if len(bottom) > 1 else bottom[0])
        return rrb.Horizontal(_flame(), rrb.Vertical(*side), column_shares=[3, 2])
    if METRICS in c.kinds:
        return rrb.Vertical(_metrics(), _log("Logs", "/logs"),
                            row_shares=[3, 1])
    # Nothing yet: the full arrangement, replaced as soon as data says what it is.
    return _root(Contents(frozenset({PROOF, TRACE})))


def panels(collapsed_time: bool = True) -> list[rrb.BlueprintPart]:
    """The side and time panels, the same in every recording of this project: collapsed
    (the views get the window; one click opens them)."""
    return [rrb.BlueprintPanel(state="collapsed"), rrb.SelectionPanel(state="collapsed"),
            rrb.TimePanel(timeline=PROOF_TIME,
                          state="collapsed" if collapsed_time else "expanded")]


def build(contents: Contents | None = None) -> rrb.Blueprint:
    """The blueprint for ``contents`` (default: before any data, the full layout)."""
    c = contents if contents is not None else Contents()
    return rrb.Blueprint(_root(c), *panels())
