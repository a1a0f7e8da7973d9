"""The viewer layout, declared once per recording (stwo-ml's Rerun arrangement).

Left (3 : 2 split) the 3D "ZK Proof Walk"; right the claim / progress series above
"Layer Stats & GPU" and a tab strip with logs, per-layer durations, capability gaps and
attention heatmaps. Below, across the whole width, the "Trace" strip: every span's
flame chart (any prover, contract or not; :mod:`otel_proofscope.rerun.translate_trace`)
next to its span log and per-span-name durations. Filters select by the quantity's group
(``gkr/claim/**``), which is why entity paths put the proof id *after* the group: one
static blueprint covers any number of proofs.
"""

from __future__ import annotations

import functools

import rerun.blueprint as rrb

from otel_proofscope.rerun.columns import LAYER, PROOF_TIME, SUMCHECK_ROUND
from otel_proofscope.rerun.translate import ACCUMULATING
from otel_proofscope.rerun.translate_trace import DURATIONS, FLAME, LOGS


@functools.cache
def accumulate() -> rrb.VisibleTimeRanges:
    """Everything from the start of the timeline up to the time cursor (one object,
    shared: converting it to Arrow costs ~1 ms each time, and the walk has 4 users)."""
    start = rrb.TimeRangeBoundary.infinite()
    end = rrb.TimeRangeBoundary.cursor_relative()
    return rrb.VisibleTimeRanges([rrb.VisibleTimeRange(timeline, start=start, end=end)
                                  for timeline in (PROOF_TIME, LAYER, SUMCHECK_ROUND)])


def build() -> rrb.Blueprint:
    # Layer nodes, round bars and the trail are one row per event on shared entities;
    # shown accumulated, they build the walk up as the time cursor advances.
    walk = rrb.Spatial3DView(
        name="ZK Proof Walk", origin="/",
        contents=["+ /circuit/**", "+ /gkr/walk/**"],
        overrides={path: accumulate() for path in ACCUMULATING})
    claim = rrb.TimeSeriesView(
        name="GKR Claim & Progress", origin="/",
        contents=["+ /gkr/claim/**", "+ /gkr/remaining/**", "+ /proof/progress/**"])
    stats = rrb.TimeSeriesView(
        name="Layer Stats & GPU", origin="/",
        contents=["+ /gpu/**", "+ /inference/stats/**", "+ /gkr/round_ms/**",
                  "+ /proof/binding_ms/**"])
    tabs = rrb.Tabs(
        rrb.TextLogView(name="Logs", origin="/logs"),
        rrb.BarChartView(name="Layer seconds by kind", origin="/proof/layer_seconds"),
        rrb.TextDocumentView(name="Capability gaps", origin="/gpu/capability_gaps"),
        rrb.TimeSeriesView(name="Proof metrics", origin="/",
                           contents=["+ /proof/**", "- /proof/progress/**",
                                     "- /proof/layer_seconds/**", "+ /metrics/**"]),
        rrb.TensorView(name="Attention", origin="/inference"),
        name="Details",
    )
    # One box per span at its start time; accumulated, the flame chart grows as the
    # time cursor advances and is complete at the end of the timeline.
    flame = rrb.Spatial2DView(name="Trace", origin=f"/{FLAME}", time_ranges=accumulate())
    trace_tabs = rrb.Tabs(
        rrb.TextLogView(name="Span log", origin=f"/{LOGS}"),
        rrb.TimeSeriesView(name="Span durations (ms)", origin=f"/{DURATIONS}"),
        name="Trace details",
    )
    return rrb.Blueprint(
        rrb.Vertical(
            rrb.Horizontal(
                walk,
                rrb.Vertical(claim, stats, tabs, row_shares=[2, 2, 2]),
                column_shares=[3, 2],
            ),
            rrb.Horizontal(flame, trace_tabs, column_shares=[3, 2]),
            row_shares=[3, 2],
        ),
        rrb.TimePanel(timeline=PROOF_TIME),
        collapse_panels=True,
    )
