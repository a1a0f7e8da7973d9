"""Where the spans of a frozen lane were drawn: the row each one's children go under.

A lane past :data:`~otel_proofscope.rerun.flame.MAX_GROUP_SPANS` is drawn on and never
redrawn, so of each span it places it keeps only the span's row. A dict of
``(trace id, span id) → row`` costs ~170 bytes a span (the key tuple, two int objects,
the slot): 160 MB for a 1M-event Chrome import, which is a single lane (issue 27 item 3
caps such an import at 4× the file, export process included). Here a span costs
12 bytes in two sorted numpy columns once merged, ~20 in all (the newest spans wait in
a small dict, merged into the columns in bulk; a bit filter answers most lookups of an
absent id), and a lookup stays a dict probe or one binary search.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Recent spans a table holds before it merges them: at least this many, and at least
#: an eighth of what is merged (each span is copied O(log n) times by merges).
MIN_RECENT = 4096
#: Bits of the merged ids' filter per merged span (one hash: ~6 % of absent ids pass).
FILTER_BITS = 16


def _slot(span_id: int) -> int:
    # Ids are random in OTel, but an importer or a test may number them: fold high bits in.
    return span_id ^ (span_id >> 29)


class _Table:
    """One trace's spans: span id → row code, sorted columns plus a recent dict."""

    __slots__ = ("codes", "filter", "ids", "mask", "recent")

    def __init__(self) -> None:
        self.recent: dict[int, int] = {}
        self.ids: npt.NDArray[np.uint64] = np.empty(0, np.uint64)
        self.codes: npt.NDArray[np.int32] = np.empty(0, np.int32)
        # A bit per hashed merged id: most lookups are of new spans (is it a duplicate?)
        # and a binary search costs ~1.6 µs (np.uint64 scalar), the filter ~0.1.
        self.filter = b""
        self.mask = 0

    def _index(self, span_id: int) -> int:
        """Position of ``span_id`` in the merged columns, -1 if not there."""
        h = _slot(span_id) & self.mask
        if not self.filter or not (self.filter[h >> 3] >> (h & 7)) & 1:
            return -1
        i = int(np.searchsorted(self.ids, np.uint64(span_id)))
        return i if i < self.ids.size and self.ids.item(i) == span_id else -1

    def get(self, span_id: int) -> int | None:
        code = self.recent.get(span_id)
        if code is None:
            i = self._index(span_id)
            if i >= 0:
                code = int(self.codes.item(i))
        return code

    def put(self, span_id: int, code: int) -> bool:
        """Keep ``span_id``'s row (the newest wins); True if it was not kept before."""
        i = self._index(span_id)
        if i >= 0:
            self.codes[i] = code
            return False
        new = span_id not in self.recent
        self.recent[span_id] = code
        if len(self.recent) >= max(MIN_RECENT, self.ids.size >> 3):
            self._merge()
        return new

    def _merge(self) -> None:
        n = len(self.recent)
        ids = np.fromiter(self.recent.keys(), np.uint64, n)
        codes = np.fromiter(self.recent.values(), np.int32, n)
        order = np.argsort(ids, kind="stable")
        ids, codes = ids[order], codes[order]
        at = np.searchsorted(self.ids, ids)  # none is merged already (put checked)
        self.ids = np.insert(self.ids, at, ids)
        self.codes = np.insert(self.codes, at, codes)
        self.recent = {}
        bits = 1 << max(6, (self.ids.size * FILTER_BITS - 1).bit_length())
        self.mask = bits - 1
        h = (self.ids ^ (self.ids >> np.uint64(29))) & np.uint64(self.mask)
        packed = np.zeros(bits >> 3, np.uint8)
        np.bitwise_or.at(packed, h >> np.uint64(3),
                         np.left_shift(1, h & np.uint64(7)).astype(np.uint8))
        self.filter = packed.tobytes()

    def __len__(self) -> int:
        return self.ids.size + len(self.recent)


class FrozenRows:
    """``(trace id, span id) → row code`` for the spans a frozen lane placed (a code
    ``n >= 0``: tree row n; ``-1 - n``: orphan level n)."""

    __slots__ = ("_size", "_tables")

    def __init__(self) -> None:
        self._tables: dict[int, _Table] = {}  # a lane holds one trace, or a few linked
        self._size = 0

    def get(self, key: tuple[int, int]) -> int | None:
        table = self._tables.get(key[0])
        return None if table is None else table.get(key[1])

    def __setitem__(self, key: tuple[int, int], code: int) -> None:
        table = self._tables.get(key[0])
        if table is None:
            table = self._tables[key[0]] = _Table()
        self._size += table.put(key[1], code)

    def __contains__(self, key: tuple[int, int]) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return self._size
