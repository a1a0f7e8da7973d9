"""Chrome import's column storage (issue 27 item 3's memory target): the parsed spans are
arrays, not objects, and everything read back from them (args, orders, screens) is what
the object form gave."""

from __future__ import annotations

import json
import tracemalloc
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_proofscope.cli.import_cmd import rebase_offset
from otel_proofscope.integrations.trace_import.chrome import ParseResult, Span, parse
from otel_proofscope.integrations.trace_import.convert import (
    _end_order,
    _outside,
    send_order,
)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 80, 2 ** 80),
                     st.text(max_size=6), st.floats(allow_nan=False, allow_infinity=False))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
_args = st.dictionaries(st.text(max_size=5), _json, max_size=4)


def _read_back(text: str) -> Any:
    """What the parser reads: non-integer numbers as exact Decimals."""
    return json.loads(text, parse_float=Decimal)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_args, _args, st.booleans())
def test_args_come_back_exactly_from_their_records(x_args: dict[str, Any],
                                                   e_args: dict[str, Any],
                                                   broken: bool) -> None:
    events = [{"ph": "X", "name": "x", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
               "args": x_args},
              {"ph": "B", "name": "b", "ts": 3, "pid": 1, "tid": 1, "args": x_args},
              {"ph": "E", "ts": 4, "pid": 1, "tid": 1, "args": e_args}]
    text = json.dumps(events)
    if broken:  # the tolerant reader (json, not ijson) from the first entry on
        text = "[{oops}, " + text[1:]
    r = parse(text.encode())
    expected = _read_back(json.dumps(events))
    x, b = (next(s for s in r.spans if s.name == n) for n in ("x", "b"))
    assert x.args == expected[0]["args"]
    assert b.args == {**expected[1]["args"], **expected[2]["args"]}
    assert all(type(k) is str for k in b.args)


def test_decimals_and_big_ints_keep_their_exact_values_and_types() -> None:
    r = parse(b'[{"ph":"X","name":"a","ts":0,"dur":0,"args":{"f":0.1,"e":1e-7,'
              b'"big":123456789012345678901234567890,"n":[1.50,{"g":2.25}],"s":"t"}}]')
    args = r.spans[0].args
    assert args == {"f": Decimal("0.1"), "e": Decimal("1e-7"),
                    "big": 123456789012345678901234567890,
                    "n": [Decimal("1.50"), {"g": Decimal("2.25")}], "s": "t"}
    assert type(args["f"]) is Decimal and str(args["n"][0]) == "1.50"


def test_a_span_is_a_copy_of_its_row() -> None:
    r = parse(b'[{"ph":"X","name":"a","ts":0,"dur":5,"pid":1,"tid":2},'
              b'{"ph":"X","name":"b","ts":1,"dur":1,"pid":1,"tid":2}]')
    first, last = r.spans[0], r.spans[-1]
    assert isinstance(first, Span) and (first.index, last.index) == (0, 1)
    assert last.parent == 0 and r.spans.index(last) == 1
    assert r.spans[np.int64(1)] == last
    last.parent = None  # changes the copy only
    assert r.spans[1].parent == 0
    with pytest.raises(IndexError):
        r.spans[2]
    assert [s.name for s in r.spans] == ["a", "b"]


def test_parsed_spans_cost_columns_not_objects() -> None:
    """Python heap kept per parsed span (two args, as tracing-chrome writes fields):
    ~100 bytes as columns; the one-object-a-span form kept ~450."""
    n = 20_000
    events = [{"ph": "X", "name": f"f{k % 40}", "ts": k * 10 + 0.125, "dur": 5.5,
               "pid": 1, "tid": 1 + k % 4, "args": {"shard": k, "round": k % 9}}
              for k in range(n)]
    raw = json.dumps(events).encode()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        r = parse(raw)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(r.spans) == n and r.spans[n - 1].args == {"shard": n - 1,
                                                           "round": (n - 1) % 9}
    assert kept / n < 160, f"{kept / n:.0f} bytes a span"


# ── orders and screens over the columns, against the object form's sorts ──────────────

@st.composite
def _trace(draw: st.DrawFn) -> list[dict[str, Any]]:
    """X and B/E spans on a few threads with times from a tiny range (ties everywhere)."""
    events: list[dict[str, Any]] = []
    for tid in range(draw(st.integers(1, 3))):
        stack: list[int] = []
        clock = 0
        for _ in range(draw(st.integers(0, 25))):
            clock += draw(st.sampled_from([0, 0, 1, 2]))
            kind = draw(st.sampled_from(["X", "B", "E"]))
            if kind == "X":
                events.append({"ph": "X", "name": f"x{len(events) % 5}", "ts": clock,
                               "dur": draw(st.integers(0, 3)), "pid": 1, "tid": tid})
            elif kind == "B" or not stack:
                stack.append(clock)
                events.append({"ph": "B", "name": f"b{len(events) % 5}", "ts": clock,
                               "pid": 1, "tid": tid})
            else:
                stack.pop()
                events.append({"ph": "E", "ts": clock, "pid": 1, "tid": tid})
    return events


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trace(), st.sets(st.sampled_from([f"{p}{k}" for p in "xb" for k in range(5)])))
def test_send_orders_are_the_object_forms_sorts(events: list[dict[str, Any]],
                                                mapped_names: set[str]) -> None:
    r = parse(json.dumps(events))
    spans = list(r.spans)
    n = len(spans)

    def end_key(i: int) -> tuple[int, ...]:
        s = spans[i]
        return (s.end_ns, -s.start_ns, -s.depth, i)

    assert _end_order(r) == sorted(range(n), key=end_key)
    assert list(send_order(r)) == sorted(range(n), key=lambda i: (
        spans[i].start_ns, spans[i].depth, spans[i].seq))
    first = sorted((i for i in range(n) if spans[i].name in mapped_names), key=end_key)
    rest = sorted((i for i in range(n) if spans[i].name not in mapped_names),
                  key=lambda i: (spans[i].start_ns, spans[i].depth, spans[i].seq))
    assert list(send_order(r, lambda s: s.name in mapped_names)) == first + rest


_times = st.integers(-2 ** 63, 2 ** 63 - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_times, _times), max_size=8),
       st.one_of(st.integers(-2 ** 65, 2 ** 65), st.sampled_from(
           [0, 2 ** 63, -2 ** 63, 2 ** 63 - 1, 1 - 2 ** 63, 2 ** 64])))
def test_the_time_screen_never_overflows(pairs: list[tuple[int, int]], offset: int) -> None:
    starts = np.array([min(p) for p in pairs], np.int64)
    ends = np.array([max(p) for p in pairs], np.int64)
    expected = [i for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))
                if not (s + offset >= 0 and e + offset < 2 ** 63)]
    assert _outside(starts, ends, offset).tolist() == expected


def test_rebase_reads_the_first_start_from_the_column_and_the_counters() -> None:
    r = parse(b'[{"ph":"X","name":"a","ts":7,"dur":1},{"ph":"C","name":"c","ts":5,'
              b'"args":{"v":1}},{"ph":"X","name":"b","ts":6,"dur":1}]')
    assert rebase_offset("now", r, now_ns=10_000) == 10_000 - 5_000
    only_spans = parse(b'[{"ph":"X","name":"a","ts":7,"dur":1},{"ph":"X","name":"b",'
                       b'"ts":6,"dur":1}]')
    assert rebase_offset("now", only_spans, now_ns=10_000) == 10_000 - 6_000
    assert rebase_offset("now", ParseResult(), now_ns=10_000) == 0
    counters = SimpleNamespace(spans=ParseResult().spans, counters=[
        SimpleNamespace(ts_ns=3)])
    assert rebase_offset("now", counters, now_ns=10) == 7
