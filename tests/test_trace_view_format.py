"""The trace view's row text: the fast ``format_attrs`` writes what the plain one did."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from otel_proofscope.rerun import translate_trace as tt


def _value(v: object) -> str:  # the implementation before the fast paths
    if isinstance(v, tuple | list):
        items = ",".join(str(x) for x in v[:8])
        return f"[{items}{',…' if len(v) > 8 else ''}]"
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "…"


def plain_format_attrs(attrs: Mapping[str, Any]) -> str:
    if not attrs:
        return ""
    keys = sorted(str(k) for k in attrs)
    shown = [f"{k}={_value(attrs[k])}" for k in keys[:tt.MAX_ATTRS]]
    more = len(keys) - tt.MAX_ATTRS
    return " ".join(shown) + (f" (+{more} more)" if more > 0 else "")


scalars = st.one_of(st.text(max_size=120), st.integers(), st.booleans(),
                    st.floats(allow_nan=True), st.binary(max_size=20))
values = st.one_of(scalars, st.lists(scalars, max_size=12).map(tuple),
                   st.lists(scalars, max_size=12))
attr_dicts = st.dictionaries(st.text(max_size=12), values, max_size=30)


@given(st.lists(attr_dicts, min_size=1, max_size=4), st.sampled_from([1, 2, tt.COMPILE_AFTER]))
def test_format_attrs_matches_the_plain_implementation(batch: list[dict[str, Any]],
                                                       compile_after: int) -> None:
    # Several dicts in a row: the key-set caches are hit by equal key sets, and with a
    # low threshold the generated formatter writes the rows (it is compiled on the
    # first or second sighting).
    with mock.patch.object(tt, "COMPILE_AFTER", compile_after):
        for attrs in batch + batch:
            assert tt.format_attrs(attrs) == plain_format_attrs(attrs)


def test_a_key_set_is_compiled_only_once_it_repeats() -> None:
    attrs = {"only.here": 1, "and.here": "x"}
    tt._FORMATTERS.pop(tuple(attrs), None)
    tt._PLANS.pop(tuple(attrs), None)
    for _ in range(tt.COMPILE_AFTER - 1):
        tt.format_attrs(attrs)
    assert tuple(attrs) not in tt._FORMATTERS  # a one-off key set never pays ~350 µs
    assert tt.format_attrs(attrs) == "and.here=x only.here=1"
    assert tuple(attrs) in tt._FORMATTERS
    assert tt.format_attrs(attrs) == "and.here=x only.here=1"


def test_same_keys_other_order_and_values() -> None:
    a = {"b": 1, "a": "x" * 100}
    b = {"a": (1, 2), "b": True}
    with mock.patch.object(tt, "COMPILE_AFTER", 1):
        for attrs in (a, b, a, b):
            assert tt.format_attrs(attrs) == plain_format_attrs(attrs)


def test_keys_with_braces_and_many_keys() -> None:
    attrs: dict[str, Any] = {"a{b}": 1, "{}": "x", "{0}": (1, 2)}
    attrs.update({f"k{i:02d}": i for i in range(30)})
    for after in (1, 2):
        with mock.patch.object(tt, "COMPILE_AFTER", after):
            for _ in range(2):
                assert tt.format_attrs(attrs) == plain_format_attrs(attrs)
