"""Reading the trace view's flame chart back from a ``.rrd`` (the live layout only).

A lane drawn again (a late parent, an earlier start, a link) goes to ``{trace}.{n}`` and
its earlier entities are shadowed by static empty boxes: what the viewer shows is the
boxes of the entities not shadowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from otel_proofscope.rerun import readback
from otel_proofscope.rerun.translate_trace import FLAME, part

_NAME = re.compile(r"^(.*?) \d+\.\d+ m?s\b")


@dataclass
class Box:
    label: str
    x0: float
    x1: float
    y: float
    time: int

    @property
    def name(self) -> str:
        """The span name: the label up to its duration (``prove shard 1.20 ms …``)."""
        m = _NAME.match(self.label)
        return m.group(1) if m else self.label.split(" ")[0]


def shadowed(rec: readback.Recording, path: str) -> bool:
    return rec.static(path).get("Boxes2D:half_sizes") == []


def live_paths(rec: readback.Recording, prefix: str = f"/{FLAME}/") -> list[str]:
    """Flame entities under ``prefix`` that the viewer draws (not shadowed)."""
    return sorted(p for p in rec.entities if p.startswith(prefix) and not shadowed(rec, p)
                  and any("Boxes2D:centers" in r.values for r in rec.rows(p)))


def boxes(rec: readback.Recording, path: str) -> list[Box]:
    out = []
    for r in rec.rows(path):
        if r.values.get("Boxes2D:centers") is None:
            continue
        for label, (cx, cy), (hw, _) in zip(r.values["Boxes2D:labels"],
                                            r.values["Boxes2D:centers"],
                                            r.values["Boxes2D:half_sizes"], strict=True):
            out.append(Box(label, cx - hw, cx + hw, cy, r.times["proof_time"]))
    return out


def trace_boxes(rec: readback.Recording, service: str, key: str) -> list[Box]:
    """The drawn boxes of ``service`` in the lane of trace ``key`` (its live entity)."""
    base = f"/{FLAME}/{part(service)}/{key}"
    paths = [p for p in live_paths(rec, base) if p == base or p.startswith(base + ".")]
    assert len(paths) == 1, paths
    return boxes(rec, paths[0])


def shown_labels(rec: readback.Recording, path: str) -> list[str]:
    """The labels drawn inside boxes (the rest show on hover)."""
    return [lab for r in rec.rows(path) for lab in (r.values.get("Points2D:labels") or [])]
