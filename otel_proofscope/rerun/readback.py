"""Read a written ``.rrd`` back into plain Python rows (tests, CI checks, scripts).

Uses ``rerun.chunk.RrdReader`` (``rerun.dataframe`` no longer exists in 0.41). Rows of
an entity are returned in the order Rerun would resolve them: by ``proof_time``, then
by row id, so "the last row at a time" is what the viewer shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from rerun.chunk import RrdReader

from otel_proofscope.rerun.columns import PROOF_TIME

_ROW_ID = "rerun.controls.RowId"


@dataclass
class Row:
    row_id: bytes
    times: dict[str, int]  # timeline → value (timestamps as ns since epoch, durations ns)
    values: dict[str, Any]  # component ("Points3D:positions") → its batch as Python lists


@dataclass
class Recording:
    application_id: str
    recording_id: str
    entities: dict[str, list[Row]] = field(default_factory=dict)  # temporal rows
    statics: dict[str, dict[str, Any]] = field(default_factory=dict)  # static components
    #: component column → archetype, e.g. "Points3D:positions" → "rerun.archetypes.Points3D"
    archetypes: dict[str, dict[str, str]] = field(default_factory=dict)
    blueprints: int = 0

    def rows(self, path: str) -> list[Row]:
        """Temporal rows of ``path`` in the order Rerun resolves them."""
        return self.entities.get(path if path.startswith("/") else "/" + path, [])

    def static(self, path: str) -> dict[str, Any]:
        """Static components of ``path`` (series styles, view coordinates)."""
        return self.statics.get(path if path.startswith("/") else "/" + path, {})

    def values(self, path: str, component: str) -> list[Any]:
        """The component's batch of every row that has it, in timeline order."""
        return [r.values[component] for r in self.rows(path) if r.values.get(component)
                is not None]

    def paths(self) -> set[str]:
        return set(self.entities) | set(self.statics)

    def latest(self, path: str) -> dict[tuple[tuple[str, int], ...], dict[str, Any]]:
        """Per distinct time point, the values Rerun resolves there (the newest row wins)."""
        out: dict[tuple[tuple[str, int], ...], dict[str, Any]] = {}
        for row in self.rows(path):
            key = tuple(sorted(row.times.items()))
            out.setdefault(key, {}).update({k: v for k, v in row.values.items()
                                            if v is not None})
        return out


def _py(column: pa.Array) -> list[Any]:
    # Timestamps and durations (``proofscope diff`` aligns runs on a duration timeline)
    # as plain nanoseconds: datetime/timedelta would drop the nanoseconds or refuse them.
    if pa.types.is_timestamp(column.type) or pa.types.is_duration(column.type):
        return column.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]
    return column.to_pylist()  # type: ignore[no-any-return]


def read(path: str | Path, recording: int = 0) -> Recording:
    """Every chunk of one recording of ``path``, as rows per entity."""
    reader = RrdReader(path)
    stores = reader.recordings()
    entry = stores[recording]
    rec = Recording(entry.application_id, entry.recording_id,
                    blueprints=len(reader.blueprints()))
    store = reader.stream(store=entry).collect()
    for chunk in store.stream().to_chunks():
        batch = chunk.to_record_batch()
        entity = chunk.entity_path
        names = batch.schema.names
        timelines = [n for n in names if (batch.schema.field(n).metadata or {}).get(
            b"rerun:kind") == b"index"]
        components = [n for n in names if n != _ROW_ID and n not in timelines]
        arch = rec.archetypes.setdefault(entity, {})
        for name in components:
            meta = batch.schema.field(name).metadata or {}
            arch[name] = meta.get(b"rerun:archetype", b"").decode()
        ids = batch.column(_ROW_ID).to_pylist()
        cols = {n: _py(batch.column(n)) for n in timelines + components}
        if chunk.is_static:
            # A compacted static chunk holds one row per log call: each component's
            # value is the last row that has it.
            last = {c: next((v for v in reversed(cols[c]) if v is not None), None)
                    for c in components}
            rec.statics.setdefault(entity, {}).update(
                {c: v for c, v in last.items() if v is not None})
            continue
        rows = rec.entities.setdefault(entity, [])
        for i, row_id in enumerate(ids):
            rows.append(Row(row_id, {t: cols[t][i] for t in timelines},
                            {c: cols[c][i] for c in components}))
    for rows in rec.entities.values():
        rows.sort(key=lambda r: (r.times.get(PROOF_TIME, -1), r.row_id))
    return rec


def recording_count(path: str | Path) -> int:
    return len(RrdReader(path).recordings())
