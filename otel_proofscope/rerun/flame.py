"""The flame chart's layout: which lane, row and x each span gets (pure, no I/O).

A *group* is what one lane of the chart draws: one trace, plus the traces whose root is
linked to one of its spans (sp1-cluster starts each task's inner ``task`` span as a new
trace linked to the task span: the linked trace hangs under that span, so one proof
reads as one tree). Each group keeps the spans it drew (bounded), so a layout that
arrival order got wrong is drawn again, right:

* a parent that arrives after its children were drawn (they waited
  :data:`~otel_proofscope.rerun.translate_trace.REMOTE_WAIT_S` for it, then were drawn
  without it) takes them under it; the summary counts them as *drawn late*;
* a span that starts before the group's origin, or ends after its right edge, moves the
  origin (the group's earliest start is always x = 0) or the scale;
* a tree deeper than the lane's rows moves the lane below the others.

Rerun keeps every row it was sent, and a view that accumulates time shows all of them,
so a row re-sent at the same time draws a second box beside the first (checked on rerun
0.41 with headless screenshots; a ``Clear`` does not hide rows from a time range
either). A redraw therefore goes to a new entity, ``{trace}.{n}``, and the old one is
shadowed by static empty ``Boxes2D`` / ``Points2D`` (static data shadows temporal data
of the same component at every time, a documented rule of Rerun's store). A redraw costs
one row per span of the group; growth keeps 25 % of room (:data:`GROW`; a lane of
:data:`BIG_LANE` spans or more doubles) so a trace that grows batch by batch is redrawn
O(log) times, and :meth:`Group.slack` lets the last call draw it tight.

Geometry, in scene units (Rerun's 2D view fits the scene into the panel, one scale for
x and y): one row per depth level, :data:`FLAME_WIDTH` units for a group's extent,
lanes stacked downward with a blank row between. Rerun draws a label *below* its
anchor: anchored at the box's top edge (a ``Points2D`` of radius 0) it lands inside the
box, on the box's own row (a ``Boxes2D`` label would hang under the box, over the next
row). A label is shown only when it fits its box at :data:`PX_PER_UNIT` (a 32-unit
trace across a ~770 px panel): the rest show on hover.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from otel_proofscope.rerun.frozen_rows import FrozenRows

#: Width of a group's extent (its earliest start to its latest end), in rows.
FLAME_WIDTH = 32.0
#: Half a box's height (rows are 1 apart: a thin gap between rows).
BOX_HALF_HEIGHT = 0.42
#: Blank rows between two lanes, and between a lane's tree and its orphan rows.
LANE_GAP = 1
#: Pixels per scene unit assumed when deciding whether a label fits its box (a 32-unit
#: trace in a ~770 px wide panel). Wider panels show more labels than needed, never
#: labels wider than their box.
PX_PER_UNIT = 24.0
#: Average width of a label character in the viewer's font (Inter, ~12 pt: "i" 3 px,
#: "W" 12 px, lower-case text ~6.5 px), and the label's padding.
PX_PER_CHAR = 7.5
LABEL_PAD_PX = 14.0
#: When a drawn group must widen, it widens by at least this factor.
GROW = 1.25
#: A lane of at least this many spans grows by :data:`BIG_GROW` instead: each redraw
#: draws every span of the lane again, so growth by 1.25 redraws a trace that grows
#: batch by batch ~5x over (measured 3.8 boxes a span for a 100,000-span proof, a
#: quarter of the trace view's CPU); by 2, ~2x. A big lane then keeps up to half its
#: width free while it grows; the last call draws it tight as before.
BIG_LANE = 4096
BIG_GROW = 2.0
#: Spans a group may hold and still be redrawn; beyond, its layout is frozen (drawn
#: on, never redrawn: a span outside its extent is clipped at x = 0).
MAX_GROUP_SPANS = 1 << 16

#: How a span is anchored when it has no parent in its group.
ROOT, REMOTE, ORPHAN = 0, 1, 2
#: Drawn before its parent came because the wait was full: one row under the top,
#: where a child of the lane's root goes.
EARLY = 3


@dataclass(slots=True, eq=False)
class Placed:
    """A drawn span, as the layout needs it (a few hundred bytes)."""

    trace_id: int
    span_id: int
    parent_id: int
    start: int
    end: int
    service: str
    name: str  # label name ("source → contract" for mapped spans)
    error: bool
    remote: bool  # its parent lives in another process
    call: int  # the translate() call it arrived in
    link: tuple[int, int] | None = None  # (trace, span) it hangs under (a linked root)
    orphan: bool = False  # counted as drawn without its parent (until the parent comes)
    early: bool = False  # drawn before its parent because the wait was full (row 1)
    tree: bool = True  # in the tree rows (False: the orphan rows below them)
    row: int = 0  # depth in the tree rows, or level in the orphan rows

    @property
    def key(self) -> tuple[int, int]:
        return (self.trace_id, self.span_id)


@dataclass(eq=False)
class Group:
    """One lane: a trace and the traces linked under it."""

    key: str  # the entity-path part of its first trace
    traces: set[int]
    spans: dict[tuple[int, int], Placed] = field(default_factory=dict)
    #: (trace, parent span) → spans drawn without that parent (re-parented when it comes)
    orphans: dict[tuple[int, int], list[Placed]] = field(default_factory=dict)
    #: Orphans whose parent came this call, each with whether it is already where it
    #: belongs (drawn early one row under a root); the others move if the lane is redrawn.
    adopted: list[tuple[Placed, bool]] = field(default_factory=list)
    #: (trace, parent span) → orphans placed once frozen: never redrawn, so only how
    #: many (a large proof whose root ends last has ~100,000, ~250 bytes each as
    #: ``Placed``): in the orphan rows, and drawn early one row under the top.
    stray: dict[tuple[int, int], int] = field(default_factory=dict)
    stray_early: dict[tuple[int, int], int] = field(default_factory=dict)
    new: list[Placed] = field(default_factory=list)  # placed this call, not drawn yet
    dirty: bool = False  # a redraw is due (a late parent, a link, a merge)
    frozen: bool = False  # over MAX_GROUP_SPANS: no more redraws
    #: Spans placed once frozen: only their row (level -1-n: n in the orphan rows), what
    #: their children need (~20 bytes each, a Placed ~250).
    slim: FrozenRows = field(default_factory=FrozenRows)
    tight: bool = False  # the next redraw leaves no room to grow (the last one)
    gen: int = 0  # redraws so far (the entity-path suffix)
    emitted: bool = False
    paths: set[str] = field(default_factory=set)  # entities drawn at this generation
    lo: int = 0  # earliest start / latest end of the spans kept
    hi: int = 0
    t0: int = 0  # x = 0 …
    t1: int = 0  # … x = FLAME_WIDTH
    lane: float = 0.0  # y of row 0
    allotted: int = 0  # rows reserved for this lane
    tree_rows: int = 0  # rows of the tree (orphan rows start LANE_GAP below)
    orphan_rows: int = 0  # levels of the orphan rows in use

    def add(self, p: Placed, key: tuple[int, int]) -> None:
        if not self.spans and not self.emitted:
            self.lo, self.hi = p.start, p.end
        else:
            if p.start < self.lo:
                self.lo = p.start
            if p.end > self.hi:
                self.hi = p.end
        if self.frozen:
            self.slim[key] = p.row if p.tree else -1 - p.row
        else:
            self.spans[key] = p
            self.frozen = len(self.spans) >= MAX_GROUP_SPANS
        self.new.append(p)

    def count_rows(self) -> None:
        """Tree and orphan rows in use, from the rows the spans were placed at (right
        for a lane drawn for the first time: no parent came late, no link joined)."""
        tree_rows = orphan_rows = 0
        for p in self.spans.values():
            if p.tree:
                if p.row >= tree_rows:
                    tree_rows = p.row + 1
            elif p.row >= orphan_rows:
                orphan_rows = p.row + 1
        self.tree_rows, self.orphan_rows = tree_rows, orphan_rows

    def find(self, key: tuple[int, int]) -> Placed | None:
        p = self.spans.get(key)
        if p is None and self.slim:
            code = self.slim.get(key)
            if code is not None:  # enough of it to place its children
                p = Placed(key[0], key[1], -1, 0, 0, "", "", False, False, 0,
                           tree=code >= 0, row=code if code >= 0 else -1 - code)
        return p

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.spans or key in self.slim

    @property
    def size(self) -> int:
        return len(self.spans) + len(self.slim)

    @property
    def scale(self) -> float:
        return FLAME_WIDTH / max(self.t1 - self.t0, 1)

    @property
    def orphan_base(self) -> int:
        return self.tree_rows + LANE_GAP

    def rows_used(self) -> int:
        return self.orphan_base + self.orphan_rows if self.orphan_rows else self.tree_rows

    def y(self, p: Placed) -> float:
        return self.lane + (p.row if p.tree else self.orphan_base + p.row)

    def fits(self, spans: Iterable[Placed]) -> bool:
        """Can ``spans`` be drawn without moving what is drawn (extent, tree rows)?"""
        tree_rows, orphan_rows = self.tree_rows, self.orphan_rows
        for p in spans:
            if p.start < self.t0 or p.end > self.t1:
                return False
            if p.tree:
                if p.row >= tree_rows:
                    if orphan_rows:
                        return False  # would run into the orphan rows
                    tree_rows = p.row + 1
            else:
                orphan_rows = max(orphan_rows, p.row + 1)
        self.tree_rows, self.orphan_rows = tree_rows, orphan_rows
        return True

    def slack(self) -> float:
        """Share of the extent left empty by growth room (0: drawn tight)."""
        if self.t1 <= self.t0:
            return 0.0
        return 1.0 - (self.hi - self.lo) / (self.t1 - self.t0)

    def extent(self, tight: bool) -> None:
        """Set ``t0``/``t1`` around the spans kept: ``t0`` always the earliest start;
        a lane that grows while drawn gets room to grow on the right, unless ``tight``."""
        lo, hi = self.lo, max(self.hi, self.lo + 1)
        if self.emitted and not tight:
            if lo < self.t0 or hi > self.t1:
                grow = GROW if len(self.spans) < BIG_LANE else BIG_GROW
                hi = lo + max(hi - lo, int((self.t1 - self.t0) * grow))
            else:  # nothing outside: the same extent
                hi = max(hi, self.t1)
        self.t0, self.t1 = lo, hi

    def rows(self) -> None:
        """Every kept span's row, from its parent (or link) among the spans kept."""
        spans = self.spans
        memo: dict[tuple[int, int], tuple[bool, int]] = {}
        for start in spans.values():
            if start.key in memo:
                continue
            chain: list[Placed] = []
            on_chain: set[tuple[int, int]] = set()
            cur: Placed | None = start
            base: tuple[bool, int] | None = None
            while cur is not None:
                k = cur.key
                got = memo.get(k)
                if got is not None:
                    base = got
                    break
                if k in on_chain:  # a cycle (hostile parents or links): cut it here
                    last = chain.pop()
                    base = memo[last.key] = (True, 0)
                    break
                on_chain.add(k)
                chain.append(cur)
                parent = spans.get((cur.trace_id, cur.parent_id)) if cur.parent_id else None
                if parent is None and cur.link is not None:
                    parent = spans.get(cur.link)
                if parent is None:
                    last = chain.pop()
                    base = memo[k] = _anchor(last)
                    break
                cur = parent
            assert base is not None
            for p in reversed(chain):
                base = (base[0], base[1] + 1)
                memo[p.key] = base
        tree_rows = orphan_rows = 0
        for k, p in spans.items():
            p.tree, p.row = memo[k]
            if p.tree:
                tree_rows = max(tree_rows, p.row + 1)
            else:
                orphan_rows = max(orphan_rows, p.row + 1)
        self.tree_rows, self.orphan_rows = tree_rows, orphan_rows


def _anchor(p: Placed) -> tuple[bool, int]:
    if p.parent_id == 0:
        return (True, 0)  # a root (or a linked root whose link is not drawn)
    if p.remote or p.early:
        return (True, 1)  # under where its parent (another process, not yet come) would be
    return (False, 0)


def label_width_px(text: str) -> float:
    return len(text) * PX_PER_CHAR + LABEL_PAD_PX


#: Fewest characters of a name worth showing cut short ("fol…"): fewer say nothing.
MIN_CUT = 4
#: A box narrower than this (px at PX_PER_UNIT) shows no label at all.
MIN_LABEL_PX = (MIN_CUT + 1) * PX_PER_CHAR + LABEL_PAD_PX


def fit_label(width_units: float, candidates: Sequence[str]) -> str | None:
    """The first (longest) of ``candidates`` that fits a box ``width_units`` wide, else
    the last one cut short with an ellipsis (as flame charts do), else nothing."""
    room = width_units * PX_PER_UNIT
    for text in candidates:
        if label_width_px(text) <= room:
            return text
    if not candidates:
        return None
    chars = int((room - LABEL_PAD_PX) / PX_PER_CHAR) - 1
    return candidates[-1][:chars] + "…" if chars >= MIN_CUT else None


@dataclass
class Lanes:
    """Where the next lane goes (lanes are stacked downward, first come first)."""

    next: float = 0.0
    last: Group | None = None

    def place(self, g: Group, rows: int) -> None:
        """Give ``g`` room for ``rows`` rows: where it is if it fits or is the last lane,
        else a new lane at the bottom."""
        rows = max(rows, 1)
        if g.emitted and (rows <= g.allotted or self.last is g):
            if self.last is g:
                self.next = max(self.next, g.lane + rows + LANE_GAP)
            g.allotted = max(g.allotted, rows)
            return
        g.lane, g.allotted = self.next, rows
        self.next = g.lane + rows + LANE_GAP
        self.last = g

    def release(self, g: Group) -> None:
        """``g`` is gone (merged into another, evicted): reuse its room if it was last."""
        if self.last is g:
            self.next, self.last = g.lane, None

