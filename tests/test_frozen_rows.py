"""The rows a frozen lane keeps (issue 27 item 3): the same answers as a dict, at a
tenth of its memory."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_proofscope.rerun import frozen_rows
from otel_proofscope.rerun.frozen_rows import FrozenRows

_KEYS = st.tuples(st.sampled_from([1, 2, 2**127 + 5]),
                  st.one_of(st.integers(1, 40), st.integers(2**64 - 40, 2**64 - 1)))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(_KEYS, st.integers(-1000, 1000), st.booleans()),
                    max_size=300))
def test_frozen_rows_answer_as_a_dict_does(ops: list[tuple[tuple[int, int], int, bool]],
                                           ) -> None:
    frozen_rows.MIN_RECENT = 4  # merge often: the sorted columns do most of the work
    try:
        rows, model = FrozenRows(), {}
        for key, code, write in ops:
            if write:
                rows[key] = code
                model[key] = code
            assert rows.get(key) == model.get(key)
            assert (key in rows) == (key in model)
            assert len(rows) == len(model)
        for key, code in model.items():
            assert rows.get(key) == code
    finally:
        frozen_rows.MIN_RECENT = 4096


def test_a_frozen_span_costs_a_few_bytes() -> None:
    n = 300_000
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        rows = FrozenRows()
        trace = 0x0123456789ABCDEF0123456789ABCDEF
        for i in range(n):  # fresh ints, as a decoder makes them
            rows[(int.from_bytes(trace.to_bytes(16, "big"), "big"), 7_000_000 + i)] = i % 9
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(rows) == n
    assert rows.get((trace, 7_000_000 + n - 1)) == (n - 1) % 9
    assert rows.get((trace, 6_999_999)) is None
    # CPython 3.11, numpy 2.4: ~20 B a span with random ids (the dict it replaced: ~167).
    assert kept / n < 30, f"{kept / n:.0f} B a frozen span"


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
def test_rows_survive_every_arrival_order(order: str) -> None:
    ids = list(range(1, 20_001))
    if order == "descending":
        ids.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(ids)
    rows = FrozenRows()
    for i in ids:
        rows[(9, i * 3)] = i % 5
    assert len(rows) == len(ids)
    assert all(rows.get((9, i * 3)) == i % 5 for i in ids)
    assert rows.get((9, 1)) is None and rows.get((8, 3)) is None
