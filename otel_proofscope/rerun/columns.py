"""Row buffers that become one columnar ``send_columns`` call per entity.

Translation appends rows (time + payload) to a :class:`Frame`; :meth:`Frame.sends`
turns every entity's rows into index columns and component columns, so a batch of
spans costs one Rerun call per entity touched — a handful per batch — instead of one
``rr.log`` per update. Geometry that comes in bulk (sumcheck round bars) is appended as
numpy blocks and its Arrow arrays are built directly: the SDK's per-row conversion
costs more than everything else together. Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import rerun as rr

from otel_proofscope.rerun.layout import Vec3

#: Timestamp timeline: when it happened (span / event / data-point time, ns since epoch).
PROOF_TIME = "proof_time"
#: Sequence timelines.
LAYER = "layer"
SUMCHECK_ROUND = "sumcheck_round"

_STRIP_TYPE = rr.components.LineStrip3DBatch._ARROW_DATATYPE


@dataclass
class Send:
    """One Rerun call: columnar rows (``indexes`` non-empty) or a static archetype."""

    path: str
    indexes: list[Any] = field(default_factory=list)
    columns: list[Any] = field(default_factory=list)
    static: Any = None
    rows: int = 0


class Node(NamedTuple):
    position: Vec3
    colour: int
    radius: float
    label: str


class _ArrowBatch:
    """A ready Arrow array as a component batch (for columns the archetype helpers reject)."""

    __slots__ = ("array",)

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def as_arrow_array(self) -> pa.Array:
        return self.array


class _Index:
    """A timeline column from an int64 array (what ``rr.TimeColumn`` builds, cheaper)."""

    __slots__ = ("array", "name")

    def __init__(self, name: str, array: pa.Array) -> None:
        self.name = name
        self.array = array

    def timeline_name(self) -> str:  # rr.send_columns reads indexes through this
        return self.name

    def as_arrow_array(self) -> pa.Array:
        return self.array


_POSITION_TYPE = rr.components.Position3DBatch._ARROW_DATATYPE
_HALF_SIZE_TYPE = rr.components.HalfSize3DBatch._ARROW_DATATYPE
_SOLID = int(rr.components.FillMode.Solid.value)


def _column(descriptor: Any, array: pa.Array, lengths: Sequence[int] | None = None) -> Any:
    """A component column from a ready Arrow array; unit rows unless ``lengths`` is given."""
    if lengths is None:
        return rr.ComponentColumn(descriptor, _ArrowBatch(array))
    return rr.ComponentColumn(descriptor, _ArrowBatch(array), lengths=lengths)


def _colours(values: Iterable[int] | np.ndarray) -> pa.Array:
    arr = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=np.uint32)
    return pa.array(arr.astype(np.uint32), type=pa.uint32())


def _floats32(values: Iterable[float] | np.ndarray) -> pa.Array:
    return pa.array(np.asarray(values if isinstance(values, np.ndarray) else list(values),
                               dtype=np.float32), type=pa.float32())


def _positions(points: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(points, dtype=np.float32).reshape(-1), type=pa.float32()),
        type=_POSITION_TYPE)


def _strip_array(points: np.ndarray, lengths: np.ndarray) -> _ArrowBatch:
    """LineStrip3D components from all points (k×3) and the strips' point counts."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = pa.FixedSizeListArray.from_arrays(
        pa.array(points.astype(np.float32).reshape(-1), type=pa.float32()),
        type=_STRIP_TYPE.value_type)
    return _ArrowBatch(pa.ListArray.from_arrays(pa.array(offsets), flat, type=_STRIP_TYPE))


_TENSOR_TYPE = rr.components.TensorDataBatch._ARROW_DATATYPE
_BUFFER_TYPE = _TENSOR_TYPE.field("buffer").type
_F32 = [f.name for f in _BUFFER_TYPE].index("F32")


def _tensors(arrays: Sequence[np.ndarray]) -> _ArrowBatch:
    """A column of float32 tensors of any shapes, built directly in Arrow.

    The SDK converts one tensor per batch (~0.4 ms each); a bar chart that grows needs
    a column of differently shaped tensors, so the union layout is assembled here.
    """
    flat = [np.asarray(a, dtype=np.float32) for a in arrays]
    n = len(flat)
    sizes = np.fromiter((f.size for f in flat), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    values = pa.array(np.concatenate([f.ravel() for f in flat]), type=pa.float32())
    children = [pa.nulls(0, type=f.type) for f in _BUFFER_TYPE]
    children[_F32] = pa.ListArray.from_arrays(pa.array(offsets), values,
                                              type=_BUFFER_TYPE[_F32].type)
    buffer = pa.Array.from_buffers(
        type=_BUFFER_TYPE, length=n,
        buffers=[None, pa.array(np.full(n, _F32, np.int8)).buffers()[1],
                 pa.array(np.arange(n, dtype=np.int32)).buffers()[1]],
        children=children)
    shapes = pa.array([list(f.shape) for f in flat], type=_TENSOR_TYPE.field("shape").type)
    names = pa.nulls(n, type=_TENSOR_TYPE.field("names").type)
    return _ArrowBatch(pa.StructArray.from_arrays([shapes, names, buffer],
                                                  fields=list(_TENSOR_TYPE)))


class _Rows:
    """Rows of one entity sharing one set of timelines.

    Single rows are appended to lists; bulk rows (a batch's sumcheck rounds) arrive as
    numpy blocks and stay numpy until they become Arrow arrays.
    """

    __slots__ = ("blocks", "layer", "path", "rnd", "times")

    def __init__(self, path: str) -> None:
        self.path = path
        self.times: list[int] = []
        self.layer: list[int] = []
        self.rnd: list[int] = []
        self.blocks: list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] = []

    def _index(self, t: int, layer: int | None, rnd: int | None) -> None:
        self.times.append(t)
        if layer is not None:
            self.layer.append(layer)
        if rnd is not None:
            self.rnd.append(rnd)

    def __len__(self) -> int:
        return len(self.times) + sum(len(b[0]) for b in self.blocks)

    def _cat(self, singles: list[int], k: int) -> np.ndarray:
        parts = [np.asarray(singles, dtype=np.int64)] if singles else []
        parts += [b[k] for b in self.blocks if b[k] is not None]  # type: ignore[misc]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def order(self) -> np.ndarray | None:
        """Row permutation that sorts bulk rows by time (None: already sorted).

        Blocks of concurrent proofs interleave in time; Rerun re-sorts an unsorted chunk
        at a cost far above the send, so bulk entities are sent sorted.
        """
        if not self.blocks:
            return None
        t = self._cat(self.times, 0)
        if len(t) < 2 or bool((t[1:] >= t[:-1]).all()):
            return None
        return np.argsort(t, kind="stable")

    def indexes(self, order: np.ndarray | None = None) -> list[_Index]:
        def col(values: np.ndarray) -> np.ndarray:
            return values if order is None else values[order]

        out = [_Index(PROOF_TIME, pa.array(col(self._cat(self.times, 0)),
                                           type=pa.timestamp("ns")))]
        if self.layer or (self.blocks and self.blocks[0][1] is not None):
            out.append(_Index(LAYER, pa.array(col(self._cat(self.layer, 1)))))
        if self.rnd or (self.blocks and self.blocks[0][2] is not None):
            out.append(_Index(SUMCHECK_ROUND, pa.array(col(self._cat(self.rnd, 2)))))
        return out

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        raise NotImplementedError


class _Scalars(_Rows):
    __slots__ = ("value_blocks", "values")

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.values: list[float] = []
        self.value_blocks: list[np.ndarray] = []

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        parts = ([np.asarray(self.values, dtype=np.float64)] if self.values else []) \
            + self.value_blocks
        values = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if order is not None:
            values = values[order]
        return [_column(rr.Scalars.descriptor_scalars(),
                        pa.array(values.astype(np.float64, copy=False), type=pa.float64()))]


class _Texts(_Rows):
    __slots__ = ("levels", "texts")

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.texts: list[str] = []
        self.levels: list[str] = []

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        return [_column(rr.TextLog.descriptor_text(), pa.array(self.texts, type=pa.utf8())),
                _column(rr.TextLog.descriptor_level(), pa.array(self.levels, type=pa.utf8()))]


class _Documents(_Rows):
    __slots__ = ("texts",)

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.texts: list[str] = []

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        return [_column(rr.TextDocument.descriptor_text(), pa.array(self.texts, type=pa.utf8())),
                _column(rr.TextDocument.descriptor_media_type(),
                        pa.array(["text/markdown"] * len(self.texts), type=pa.utf8()))]


class _Points(_Rows):
    __slots__ = ("lengths", "nodes", "show_labels")

    def __init__(self, path: str, show_labels: bool) -> None:
        super().__init__(path)
        self.nodes: list[Node] = []
        self.lengths: list[int] = []
        self.show_labels = show_labels

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        # An empty row is an explicit empty batch of every component: it clears the
        # points from then on (the cursor when a proof ends).
        nodes = self.nodes
        lengths = self.lengths
        cols = [
            _column(rr.Points3D.descriptor_positions(),
                    _positions(np.asarray([n.position for n in nodes],
                                          dtype=np.float32).reshape(-1, 3)), lengths),
            _column(rr.Points3D.descriptor_colors(), _colours([n.colour for n in nodes]),
                    lengths),
            _column(rr.Points3D.descriptor_radii(), _floats32([n.radius for n in nodes]),
                    lengths),
            _column(rr.Points3D.descriptor_labels(),
                    pa.array([n.label for n in nodes], type=pa.utf8()), lengths),
        ]
        if not self.show_labels:
            cols.append(_column(rr.Points3D.descriptor_show_labels(),
                                pa.array(np.zeros(len(lengths), dtype=bool))))
        return cols


class _Strips(_Rows):
    __slots__ = ("colour", "lengths", "radius", "strips")

    def __init__(self, path: str, colour: int, radius: float) -> None:
        super().__init__(path)
        self.strips: list[Sequence[Vec3]] = []
        self.lengths: list[int] = []
        self.colour = colour
        self.radius = radius

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        n = len(self.strips)
        points = np.asarray([p for s in self.strips for p in s],
                            dtype=np.float32).reshape(-1, 3)
        sizes = np.fromiter((len(s) for s in self.strips), dtype=np.int32, count=n)
        return [
            rr.ComponentColumn(rr.LineStrips3D.descriptor_strips(), _strip_array(points, sizes),
                               lengths=self.lengths),
            _column(rr.LineStrips3D.descriptor_colors(),
                    _colours(np.full(n, self.colour, np.uint32)), self.lengths),
            _column(rr.LineStrips3D.descriptor_radii(),
                    _floats32(np.full(n, self.radius, np.float32)), self.lengths),
        ]


class _Segments(_Rows):
    """One 2-point line strip per row, appended as numpy blocks (round bars, trail)."""

    __slots__ = ("a", "b", "colours", "labels", "radius")

    def __init__(self, path: str, radius: float) -> None:
        super().__init__(path)
        self.a: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.colours: list[np.ndarray] = []
        self.labels: list[str] = []
        self.radius = radius

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        a, b = np.concatenate(self.a), np.concatenate(self.b)
        colours = np.concatenate(self.colours)
        if order is not None:
            a, b, colours = a[order], b[order], colours[order]
        n = len(a)
        points = np.stack([a, b], axis=1).reshape(-1, 3)
        cols = [
            rr.ComponentColumn(rr.LineStrips3D.descriptor_strips(),
                               _strip_array(points, np.full(n, 2, np.int32))),
            _column(rr.LineStrips3D.descriptor_colors(), _colours(colours)),
            _column(rr.LineStrips3D.descriptor_radii(),
                    _floats32(np.full(n, self.radius, np.float32))),
        ]
        if self.labels:
            labels = self.labels if order is None else [self.labels[i] for i in order]
            cols += [_column(rr.LineStrips3D.descriptor_labels(),
                             pa.array(labels, type=pa.utf8())),
                     _column(rr.LineStrips3D.descriptor_show_labels(),
                             pa.array(np.zeros(n, dtype=bool)))]
        return cols


class _Boxes(_Rows):
    """One solid box per row, appended as numpy blocks (sumcheck round bars).

    Boxes are two fixed-size vectors per row; Rerun ingests them ~20x faster than the
    nested lists of line strips.
    """

    __slots__ = ("centers", "colours", "half_sizes")

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.centers: list[np.ndarray] = []
        self.half_sizes: list[np.ndarray] = []
        self.colours: list[np.ndarray] = []

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        centers = np.concatenate(self.centers)
        half = np.concatenate(self.half_sizes)
        colours = np.concatenate(self.colours)
        if order is not None:
            centers, half, colours = centers[order], half[order], colours[order]
        n = len(centers)
        return [
            _column(rr.Boxes3D.descriptor_centers(), _positions(centers)),
            _column(rr.Boxes3D.descriptor_half_sizes(), pa.FixedSizeListArray.from_arrays(
                pa.array(half.astype(np.float32).reshape(-1), type=pa.float32()),
                type=_HALF_SIZE_TYPE)),
            _column(rr.Boxes3D.descriptor_colors(), _colours(colours)),
            _column(rr.Boxes3D.descriptor_fill_mode(),
                    pa.array(np.full(n, _SOLID, np.uint8), type=pa.uint8())),
        ]


class _BarCharts(_Rows):
    __slots__ = ("colour", "values")

    def __init__(self, path: str, colour: int) -> None:
        super().__init__(path)
        self.values: list[np.ndarray] = []
        self.colour = colour

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        n = len(self.values)
        return [
            rr.ComponentColumn(rr.BarChart.descriptor_values(), _tensors(self.values)),
            _column(rr.BarChart.descriptor_color(), _colours(np.full(n, self.colour, np.uint32))),
        ]


class _Tensors(_Rows):
    __slots__ = ("arrays",)

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.arrays: list[np.ndarray] = []

    def columns(self, order: np.ndarray | None = None) -> list[Any]:
        return [rr.ComponentColumn(rr.Tensor.descriptor_data(), _tensors(self.arrays))]


class Frame:
    """Rows gathered while translating one batch; :meth:`sends` makes the Rerun calls."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str, bool, bool], _Rows] = {}
        self._static: list[Send] = []

    def _get(self, kind: str, path: str, layer: bool, rnd: bool, factory: Any) -> Any:
        key = (kind, path, layer, rnd)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = factory()
        return rows

    def scalar(self, path: str, t: int, value: float, *, layer: int | None = None,
               rnd: int | None = None) -> None:
        rows: _Scalars = self._get("scalar", path, layer is not None, rnd is not None,
                                   lambda: _Scalars(path))
        rows._index(t, layer, rnd)
        rows.values.append(value)

    def scalars(self, path: str, t: np.ndarray, values: np.ndarray, *,
                layer: np.ndarray | None = None, rnd: np.ndarray | None = None) -> None:
        """Many scalar rows at once (numpy columns of equal length)."""
        if len(t) == 0:
            return
        rows: _Scalars = self._get("scalar", path, layer is not None, rnd is not None,
                                   lambda: _Scalars(path))
        rows.blocks.append((t, layer, rnd))
        rows.value_blocks.append(values)

    def text(self, path: str, t: int, text: str, level: str = "INFO", *,
             layer: int | None = None) -> None:
        rows: _Texts = self._get("text", path, layer is not None, False, lambda: _Texts(path))
        rows._index(t, layer, None)
        rows.texts.append(text)
        rows.levels.append(level)

    def texts(self, path: str, times: Sequence[int], texts: Sequence[str],
              levels: Sequence[str]) -> None:
        """Many text rows of one entity at once (a span's events), no sequence index."""
        if not times:
            return
        rows: _Texts = self._get("text", path, False, False, lambda: _Texts(path))
        rows.times.extend(times)
        rows.texts.extend(texts)
        rows.levels.extend(levels)

    def document(self, path: str, t: int, markdown: str) -> None:
        rows: _Documents = self._get("doc", path, False, False, lambda: _Documents(path))
        rows._index(t, None, None)
        rows.texts.append(markdown)

    def point(self, path: str, t: int, node: Node, *, layer: int | None = None,
              show_labels: bool = True) -> None:
        """One row with one point (the per-layer hot path of :meth:`points`)."""
        key = ("points", path, layer is not None, False)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = _Points(path, show_labels)
        rows.times.append(t)
        if layer is not None:
            rows.layer.append(layer)
        rows.nodes.append(node)  # type: ignore[attr-defined]
        rows.lengths.append(1)  # type: ignore[attr-defined]

    def points(self, path: str, t: int, nodes: Sequence[Node], *, layer: int | None = None,
               show_labels: bool = True) -> None:
        """One row of points; an empty ``nodes`` row clears the entity from ``t`` on."""
        rows: _Points = self._get("points", path, layer is not None, False,
                                  lambda: _Points(path, show_labels))
        rows._index(t, layer, None)
        rows.nodes.extend(nodes)
        rows.lengths.append(len(nodes))

    def strips(self, path: str, t: int, strips: Sequence[Sequence[Vec3]], *, colour: int,
               radius: float) -> None:
        rows: _Strips = self._get("strips", path, False, False,
                                  lambda: _Strips(path, colour, radius))
        rows._index(t, None, None)
        rows.strips.extend(strips)
        rows.lengths.append(len(strips))

    def segments(self, path: str, t: np.ndarray, a: np.ndarray, b: np.ndarray,
                 colours: np.ndarray, *, radius: float, labels: Sequence[str] = (),
                 layer: np.ndarray | None = None, rnd: np.ndarray | None = None) -> None:
        """Rows of one segment each (a[k] → b[k] at time t[k]), appended as numpy blocks."""
        if len(t) == 0:
            return
        rows: _Segments = self._get("segments", path, layer is not None, rnd is not None,
                                    lambda: _Segments(path, radius))
        rows.blocks.append((t, layer, rnd))
        rows.a.append(a)
        rows.b.append(b)
        rows.colours.append(colours)
        rows.labels.extend(labels)

    def boxes(self, path: str, t: np.ndarray, centers: np.ndarray, half_sizes: np.ndarray,
              colours: np.ndarray, *, layer: np.ndarray | None = None,
              rnd: np.ndarray | None = None) -> None:
        """Rows of one solid box each, appended as numpy blocks."""
        if len(t) == 0:
            return
        rows: _Boxes = self._get("boxes", path, layer is not None, rnd is not None,
                                 lambda: _Boxes(path))
        rows.blocks.append((t, layer, rnd))
        rows.centers.append(centers)
        rows.half_sizes.append(half_sizes)
        rows.colours.append(colours)

    def bar_chart(self, path: str, t: int, values: Sequence[float] | np.ndarray, *,
                  colour: int) -> None:
        """One bar per index 0..n-1 (a zero bar is no bar)."""
        rows: _BarCharts = self._get("bars", path, False, False,
                                     lambda: _BarCharts(path, colour))
        rows._index(t, None, None)
        rows.values.append(np.asarray(values, dtype=np.float32))

    def tensor(self, path: str, t: int, array: np.ndarray, *, layer: int | None = None) -> None:
        rows: _Tensors = self._get("tensor", path, layer is not None, False,
                                   lambda: _Tensors(path))
        rows._index(t, layer, None)
        rows.arrays.append(array)

    def static(self, path: str, archetype: Any) -> None:
        self._static.append(Send(path, static=archetype))

    def columns(self, path: str, indexes: list[Any], columns: list[Any], rows: int) -> None:
        """Ready ``send_columns`` input (a translator that builds its own columns)."""
        self._static.append(Send(path, indexes, columns, rows=rows))

    def __len__(self) -> int:
        return len(self._rows) + len(self._static)

    def sends(self) -> list[Send]:
        out = list(self._static)
        for rows in self._rows.values():
            order = rows.order()
            out.append(Send(rows.path, rows.indexes(order), rows.columns(order), rows=len(rows)))
        return out
