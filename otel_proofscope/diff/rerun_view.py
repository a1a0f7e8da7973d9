"""``proofscope diff --rerun``: both runs in one Rerun recording, aligned at proof start.

Every row sits on the ``proof_time`` timeline as a *duration since its proof's start*
(both runs start at 0, so a span that moved shows up at a different time, not at a
different date). Base is drawn in blue, candidate in orange:

``diff/progress/{base,candidate}/{n}``
    one line per proof: layers finished (contract traces) or spans finished (any
    trace) over time since that proof's start. Where the two bundles of lines part is
    where the time moved.
``diff/gantt/{base,candidate}``
    the median proof of each run as a Gantt chart (x: milliseconds since proof start,
    one lane per span, the candidate just below the base in each lane; a box's label,
    shown on hover, names the span and its duration), one box per row at the span's
    start, shown accumulated up to the time cursor.
``diff/summary``
    the diff table (markdown).

:func:`layout` computes all of it without Rerun (tested on its own); :func:`write` sends
it with ``send_columns``, one call per entity.
"""

from __future__ import annotations

import os
import statistics
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from otel_proofscope.diff.samples import Proof
from otel_proofscope.diff.traces import SpanRecord
from otel_proofscope.pipeline.output_files import open_output_fd
from otel_proofscope.semconv import SpanName

if TYPE_CHECKING:
    import rerun.blueprint as rrb

#: The recording's timeline (a duration here, not a timestamp: see the module doc).
PROOF_TIME = "proof_time"
APP_ID = "otel_proofscope_diff"
ROLES = ("base", "candidate")
#: RGBA of each run: blue and orange (distinguishable with the common colour deficiencies).
COLOURS = {"base": 0x1F77B4FF, "candidate": 0xFF7F0EFF}
#: Lanes drawn in a Gantt chart; a longer proof is cut (and says so in its label).
MAX_GANTT_SPANS = 400
#: Proofs drawn as progress lines per run.
MAX_PROGRESS_PROOFS = 100
#: Height of a box as a share of a lane (base and candidate share each lane).
LANE_HEIGHT = 0.4
#: The chart's lanes together are this share of its width, whatever the proof's length
#: (x is milliseconds, so a lane's height is scaled to the longer median proof).
LANES_TO_WIDTH = 0.5
#: A base box at least this share of the chart's width shows its label.
LABEL_MIN_WIDTH = 0.12


@dataclass
class Series:
    """One progress line: seconds since proof start → count finished."""

    times_s: list[float]
    values: list[float]


@dataclass
class Gantt:
    times_s: list[float] = field(default_factory=list)  # each box's start (row time)
    mins: list[tuple[float, float]] = field(default_factory=list)  # (ms, lane)
    sizes: list[tuple[float, float]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # on hover: run, span, kind, time
    short: list[str] = field(default_factory=list)  # drawn on wide boxes: kind or span, time
    cut: int = 0  # spans left out beyond MAX_GANTT_SPANS
    extent_ms: float = 1.0  # the longer median proof: the chart's width


@dataclass
class RunView:
    role: str
    progress: list[Series]
    gantt: Gantt
    what: str  # "layers" or "spans"


def _lane_keys(proof: Proof) -> list[tuple[str, str, int]]:
    """A lane per span, stable across runs: (name, layer kind, occurrence) in start order."""
    seen: Counter[tuple[str, str]] = Counter()
    keys = []
    for s in sorted(proof.spans, key=lambda s: (s.start_ns, s.name)):
        base = (s.name, s.layer_kind or "")
        keys.append((*base, seen[base]))
        seen[base] += 1
    return keys


def _total_ns(p: Proof) -> int:
    if p.root is not None and p.root in p.spans:
        return p.root.duration_ns
    return max(s.end_ns for s in p.spans) - p.start_ns


def median_total_ms(p: Proof) -> float:
    return _total_ns(p) / 1e6


def median_proof(proofs: list[Proof]) -> Proof | None:
    """The proof whose total duration is the (lower) median of its run."""
    if not proofs:
        return None
    target = statistics.median_low([_total_ns(p) for p in proofs])
    return next(p for p in proofs if _total_ns(p) == target)


def progress(proof: Proof, contract: bool) -> Series:
    """Finished layers (contract) or spans over time since the proof's start."""
    def counted(s: SpanRecord) -> bool:
        return s.name == SpanName.LAYER if contract else s is not proof.root

    ends = sorted(s.end_ns for s in proof.spans if counted(s))
    t0 = proof.start_ns
    times = [0.0] + [(e - t0) / 1e9 for e in ends]
    return Series(times, [float(i) for i in range(len(times))])


def layout(runs: dict[str, list[Proof]], contract: bool) -> list[RunView]:
    """Everything to draw, per run; lanes shared by both runs' median proofs."""
    medians = {role: median_proof(proofs) for role, proofs in runs.items()}
    lanes: dict[tuple[str, str, int], int] = {}
    for role in ROLES:
        p = medians.get(role)
        if p is not None:
            for key in _lane_keys(p):
                lanes.setdefault(key, len(lanes))
    longest_ms = max((median_total_ms(p) for p in medians.values() if p is not None),
                     default=1.0)
    pitch = max(longest_ms, 1e-3) * LANES_TO_WIDTH / max(len(lanes), 1)
    views = []
    for role in ROLES:
        proofs = runs.get(role, [])
        lines = [progress(p, contract) for p in proofs[:MAX_PROGRESS_PROOFS]]
        gantt = Gantt(extent_ms=max(longest_ms, 1e-3))
        p = medians.get(role)
        if p is not None:
            offset = 0.0 if role == "base" else LANE_HEIGHT + 0.05
            ordered = sorted(p.spans, key=lambda s: (s.start_ns, s.name))
            for s, key in zip(ordered, _lane_keys(p), strict=True):
                if len(gantt.mins) >= MAX_GANTT_SPANS:
                    gantt.cut += 1
                    continue
                start_s = (s.start_ns - p.start_ns) / 1e9
                gantt.times_s.append(start_s)
                gantt.mins.append((start_s * 1e3, (lanes[key] + offset) * pitch))
                gantt.sizes.append((s.duration_ns / 1e6, LANE_HEIGHT * pitch))
                kind = f" {s.layer_kind}" if s.layer_kind else ""
                took = f"{s.duration_ns / 1e6:.3g} ms"
                gantt.labels.append(f"{role}: {s.name}{kind} {took}")
                gantt.short.append(f"{s.layer_kind or s.name} {took}")
        views.append(RunView(role, lines, gantt, "layers" if contract else "spans"))
    return views


def gantt_bounds(views: Sequence[RunView]) -> tuple[tuple[float, float],
                                                   tuple[float, float]] | None:
    """The Gantt chart's extent, every run's boxes, with a small margin (x: ms, y: lane
    units); None without boxes. The viewer's own fit cut the candidate's longest bars
    at the right edge (issue 30's diff-rerun.png)."""
    boxes = [(x, y, w, h) for v in views
             for (x, y), (w, h) in zip(v.gantt.mins, v.gantt.sizes, strict=True)]
    if not boxes:
        return None
    x0, x1 = min(b[0] for b in boxes), max(b[0] + b[2] for b in boxes)
    y0, y1 = min(b[1] for b in boxes), max(b[1] + b[3] for b in boxes)
    mx, my = max((x1 - x0) * 0.03, 1e-6), max((y1 - y0) * 0.03, 1e-6)
    return (x0 - mx, x1 + mx), (y0 - my, y1 + my)


def diff_blueprint(views: Sequence[RunView] = ()) -> rrb.Blueprint:
    """Progress above the Gantt chart, the diff table beside them (full height, so the
    table is not cut); side and time panels collapsed like every recording's. With
    ``views``, the Gantt chart is framed on all their boxes."""
    import rerun.blueprint as rrb

    bounds = gantt_bounds(views)
    visual_bounds = None if bounds is None else rrb.VisualBounds2D(
        x_range=bounds[0], y_range=bounds[1])

    from otel_proofscope.rerun.blueprint import LEGEND, panels

    return rrb.Blueprint(
        rrb.Horizontal(
            rrb.Vertical(
                rrb.TimeSeriesView(
                    name="Progress since proof start (base blue, candidate orange)",
                    origin="/diff/progress", plot_legend=LEGEND),
                rrb.Spatial2DView(
                    name="Median proof, ms since start (base above candidate)",
                    origin="/diff/gantt", visual_bounds=visual_bounds,
                    time_ranges=[rrb.VisibleTimeRange(
                        PROOF_TIME, start=rrb.TimeRangeBoundary.infinite(),
                        end=rrb.TimeRangeBoundary.cursor_relative())]),
                row_shares=[2, 3]),
            rrb.TextDocumentView(name="Diff", origin="/diff/summary"),
            # The table is the verdict: room for its columns at 1280 px without scrolling.
            column_shares=[2, 3]),
        *panels())


def write(target: str, views: list[RunView], summary_md: str) -> str:
    """Send the views to ``target`` (``file:PATH``, ``spawn`` or ``rerun+http://…``).

    Returns where the recording went, for the user.
    """
    import rerun as rr

    from otel_proofscope.rerun.sink import probe
    from otel_proofscope.rerun.target import parse_target

    t = parse_target(target)
    if t.kind == "off":
        return "off"
    rec = rr.RecordingStream(APP_ID, recording_id=str(uuid.uuid4()))
    blueprint = diff_blueprint(views)
    if t.kind == "file":
        Path(t.path).parent.mkdir(parents=True, exist_ok=True)
        # Refuses a link or a non-file planted at the path (Rerun would follow it); one
        # planted between here and Rerun's own open is the race that remains.
        os.close(open_output_fd(t.path, append=False, what="diff recording"))
        rec.save(t.path, default_blueprint=blueprint)
        where = f"file:{t.path}"
    elif t.kind == "spawn":
        rec.spawn(port=t.port, default_blueprint=blueprint)
        where = "spawned viewer"
    else:
        # connect_grpc() does not fail when nothing listens; it drops the data silently.
        if not probe(t.host, t.port):
            raise ConnectionError(f"nothing listens on {t.host}:{t.port}")
        rec.connect_grpc(t.url, default_blueprint=blueprint)
        where = t.url
    rec.log("/diff/summary", rr.TextDocument(summary_md, media_type=rr.MediaType.MARKDOWN),
            static=True)
    for view in views:
        colour = COLOURS[view.role]
        for i, line in enumerate(view.progress):
            path = f"/diff/progress/{view.role}/{i}"
            rec.log(path, rr.SeriesLines(colors=[colour], names=[f"{view.role} {view.what}"]),
                    static=True)
            rec.send_columns(path, indexes=[rr.TimeColumn(PROOF_TIME, duration=line.times_s)],
                             columns=rr.Scalars.columns(scalars=np.asarray(line.values)))
        g = view.gantt
        if g.mins:
            mins = np.asarray(g.mins, dtype=float)
            half = np.asarray(g.sizes, dtype=float) / 2
            # The base's wide boxes carry their label (a candidate box sits just below
            # its base box, the same phase); the rest show theirs on hover, or a proof's
            # boxes bury each other in text.
            wide = (half[:, 0] * 2 >= LABEL_MIN_WIDTH * g.extent_ms) if view.role == "base" \
                else np.zeros(len(mins), dtype=bool)
            for part, keep, shown in (("", ~wide, False), ("/labelled", wide, True)):
                if not keep.any():
                    continue
                path = f"/diff/gantt/{view.role}{part}"
                rec.send_columns(
                    path, indexes=[rr.TimeColumn(PROOF_TIME,
                                                 duration=np.asarray(g.times_s)[keep])],
                    columns=rr.Boxes2D.columns(
                        centers=mins[keep] + half[keep], half_sizes=half[keep],
                        labels=[lb for lb, k in zip(g.short if shown else g.labels, keep,
                                                    strict=True) if k],
                        colors=[colour] * int(keep.sum())))
                rec.log(path, rr.Boxes2D.from_fields(show_labels=shown), static=True)
    rec.flush()
    rec.disconnect()
    return where
