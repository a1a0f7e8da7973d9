"""The Chrome trace-event parser: exact timestamps, every shape of event, bad input
counted with its position, and (hypothesis) arbitrary input never raising with counts
that always add up."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource

from otel_proofscope.integrations.trace_import.chrome import (
    ChromeFormatError,
    ParseResult,
    looks_like_chrome,
    parse,
    ts_to_ns,
)
from otel_proofscope.integrations.trace_import.convert import convert
from otel_proofscope.mapping.apply import Mapper
from otel_proofscope.mapping.rules import load_rules


def _check_accounting(r: ParseResult) -> None:
    """Every entry is used, ignored or skipped, exactly once; spans and instants add up."""
    assert r.entries == sum(r.used.values()) + sum(r.ignored.values()) \
        + sum(r.skipped.values())
    assert len(r.spans) == r.used["X"] + r.used["B"] + r.used["b"] + r.instants_as_spans
    assert r.used["i"] + r.used["I"] + r.used["n"] == r.instants + r.instants_as_spans
    assert len(r.errors) == min(sum(r.skipped.values()), 20)
    for s in r.spans:
        assert s.end_ns >= s.start_ns
        assert s.parent is None or 0 <= s.parent < len(r.spans)
        for ev in s.events:
            assert s.start_ns <= ev.ts_ns <= s.end_ns


@pytest.mark.parametrize(("text", "ns"), [
    ("0", 0), ("1234.567", 1_234_567), ("1234.5678", 1_234_568), ("0.0005", 0),
    ("0.0015", 2), ("-3.5", -3_500), ("1700000000123456.789", 1_700_000_000_123_456_789),
    ("9.724443874170868", 9_724), ("1e3", 1_000_000),
])
def test_microseconds_become_exact_nanoseconds(text: str, ns: int) -> None:
    assert ts_to_ns(Decimal(text)) == ns
    r = parse(f'[{{"ph":"X","name":"a","ts":{text},"dur":0}}]')
    assert (r.spans[0].start_ns, r.spans[0].end_ns) == (ns, ns)


def test_a_float_that_binary_floating_point_would_round() -> None:
    # Through a binary float, 1.005 µs is 1004.9999999999999 ns (truncated: 1004) and an
    # epoch-based 1700000000123456.789 µs loses its last three digits.
    assert int(float("1.005") * 1000) == 1004
    assert int(float("1700000000123456.789") * 1000) != 1_700_000_000_123_456_789
    r = parse('[{"ph":"X","name":"a","ts":1.005,"dur":0.001,"pid":1,"tid":1},'
              '{"ph":"X","name":"b","ts":1700000000123456.789,"dur":0,"pid":1,"tid":1}]')
    assert (r.spans[0].start_ns, r.spans[0].end_ns) == (1_005, 1_006)
    assert r.spans[1].start_ns == 1_700_000_000_123_456_789


EVENTS: list[dict[str, Any]] = [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "prover"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
    {"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 0}},
    {"ph": "B", "name": "prove", "ts": 10, "pid": 1, "tid": 2, "args": {"a": 1}},
    {"ph": "X", "name": "layer", "ts": 11, "dur": 3, "pid": 1, "tid": 2, "args": {"i": 0}},
    {"ph": "i", "name": "round", "ts": 12, "pid": 1, "tid": 2, "s": "t"},
    {"ph": "I", "name": "mark", "ts": 15, "pid": 1, "tid": 2},
    {"ph": "C", "name": "mem", "ts": 13, "pid": 1, "args": {"rss": 5, "heap": 1.5, "x": "no"}},
    {"ph": "E", "ts": 20, "pid": 1, "tid": 2, "args": {"b": 2}},
    {"ph": "b", "name": "io", "cat": "net", "id": 7, "ts": 14, "pid": 1, "tid": 3},
    {"ph": "e", "name": "io", "cat": "net", "id": 7, "ts": 18, "pid": 1, "tid": 4},
    {"ph": "i", "name": "lonely", "ts": 100, "pid": 1, "tid": 9},
    {"ph": "s", "name": "flow", "ts": 12, "pid": 1, "tid": 2, "id": 1},
]


@pytest.mark.parametrize("form", ["array", "object"])
def test_every_kind_of_event(form: str) -> None:
    text = json.dumps(EVENTS if form == "array" else {"traceEvents": EVENTS,
                                                       "displayTimeUnit": "ms"})
    r = parse(text.encode())
    _check_accounting(r)
    by_name = {s.name: s for s in r.spans}
    prove, layer = by_name["prove"], by_name["layer"]
    assert (prove.start_ns, prove.end_ns, prove.args) == (10_000, 20_000, {"a": 1, "b": 2})
    assert layer.parent == r.spans.index(prove) and prove.parent is None
    assert [e.name for e in layer.events] == ["round"]
    assert [e.name for e in prove.events] == ["mark"]
    assert (by_name["io"].start_ns, by_name["io"].end_ns) == (14_000, 18_000)
    assert by_name["lonely"].start_ns == by_name["lonely"].end_ns == 100_000
    assert r.instants_as_spans == 1
    assert [(c.series, c.value, c.ts_ns) for c in r.counters] == [("rss", 5, 13_000),
                                                                  ("heap", 1.5, 13_000)]
    assert r.process_names == {1: "prover"} and r.thread_names == {(1, 2): "main"}
    assert r.ignored == {"metadata 'process_sort_index'": 1}
    assert r.skipped == {"unsupported phase 's'": 1}
    flow = text.index('{"ph": "s"')
    assert r.errors == [f"event #12 (byte {flow}): unsupported phase 's'"]


def test_malformed_entries_are_skipped_with_their_position_and_the_rest_imported() -> None:
    good = '{"ph":"X","name":"a","ts":1,"dur":1,"pid":1,"tid":1}'
    text = (f'[{good},\n{{"ph":"X","name":"b","ts":2,"dur":-1}},\n{{"ph": X broken}},\n'
            f'{{"ph":"E","ts":5,"pid":1,"tid":1}},\n"text",\n{good}]')
    r = parse(text.encode())
    _check_accounting(r)
    assert [s.name for s in r.spans] == ["a", "a"]
    assert r.entries == 6
    assert r.skipped == {"negative dur": 1, "malformed JSON": 1,
                         "'E' without an open 'B' on its thread": 1,
                         "entry is not a JSON object": 1}
    offset = text.index('{"ph": X broken}')
    assert any(e.startswith(f"event #2 (byte {offset}): malformed JSON") for e in r.errors)
    second = text.index('{"ph":"X","name":"b"')
    assert r.errors[0] == f"event #1 (byte {second}): negative dur: -1"


def test_byte_offsets_count_utf8_bytes() -> None:
    text = '[{"ph":"X","name":"π≈3","ts":1,"dur":1},\n{bad}]'
    r = parse(text.encode())
    assert r.errors == [f"event #1 (byte {text.encode().index(b'{bad}')}): malformed JSON: "
                        "Expecting property name enclosed in double quotes"]


def test_a_file_cut_short_keeps_what_came_before_and_closes_open_spans() -> None:
    # tracing-chrome's output when the prover dies: no closing bracket, an open B
    text = ('[\n{"ph":"B","name":"prove","ts":1,"pid":1,"tid":1},\n'
            '{"ph":"X","name":"shard","ts":2,"dur":5,"pid":1,"tid":1},\n'
            '{"ph":"X","name":"sha')
    r = parse(text.encode())
    _check_accounting(r)
    prove = next(s for s in r.spans if s.name == "prove")
    assert prove.unterminated and prove.end_ns == 7_000 and r.unterminated == 1
    assert any("not closed" in n for n in r.notes)
    assert r.skipped == {"malformed JSON": 1}


def test_not_a_trace_at_all() -> None:
    for text in ('{"hello": 1}', "not json", "42", ""):
        with pytest.raises(ChromeFormatError):
            parse(text)
    assert looks_like_chrome(b' [{"ph":"X"}]') and looks_like_chrome(b'{"traceEvents": [')
    assert not looks_like_chrome(b'{"resourceSpans": []}') and not looks_like_chrome(b"id,ts")


# ── property-based ───────────────────────────────────────────────────────────────────

_numbers = st.one_of(st.integers(-10**18, 10**18), st.floats(allow_nan=True,
                                                             allow_infinity=True),
                     st.decimals(allow_nan=False, allow_infinity=False, places=6,
                                 min_value=-10**12, max_value=10**12).map(float),
                     st.none(), st.text(max_size=5), st.booleans())
_ids = st.one_of(st.integers(0, 3), st.sampled_from(["a", "b"]), st.none())
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
                               st.floats(allow_nan=False, allow_infinity=False)),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_event = st.fixed_dictionaries({"ph": st.sampled_from(list("XBEiICMbenfsP")) | st.none()},
                               optional={"name": st.text(max_size=6) | st.none(),
                                         "ts": _numbers, "dur": _numbers, "pid": _ids,
                                         "tid": _ids, "cat": st.text(max_size=3),
                                         "id": st.integers(0, 2), "s": st.text(max_size=1),
                                         "args": st.dictionaries(st.text(max_size=4), _json,
                                                                 max_size=3) | _json})
_entries = st.lists(st.one_of(_event, _json), max_size=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_entries, st.booleans())
def test_arbitrary_events_never_raise_and_counts_add_up(events: list[Any],
                                                        wrapped: bool) -> None:
    doc: Any = {"traceEvents": events} if wrapped else events
    r = parse(json.dumps(doc, allow_nan=True).encode())
    _check_accounting(r)
    assert r.entries == len(events)
    # and what was read always converts, and maps, without raising
    out = convert(r, Resource({}), seed=1)
    # a time before 1970 (or past 2**63 ns) is refused, counted, never written
    assert len(out.spans) + out.refused.spans == len(r.spans)
    assert out.points + out.refused.points == len(r.counters)
    for span in out.spans:
        assert 0 <= span.start_time <= span.end_time < 2 ** 63
    by_id = {s.context.span_id: s for s in out.spans}
    for span in out.spans:
        if span.parent is not None:
            assert span.parent.span_id in by_id
            assert by_id[span.parent.span_id].context.trace_id == span.context.trace_id
    Mapper(load_rules("jolt")).map_spans(out.spans)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_entries, st.data())
def test_cut_and_corrupted_files_never_raise_and_counts_add_up(events: list[Any],
                                                               data: st.DataObject) -> None:
    text = json.dumps(events, allow_nan=True)
    cut = data.draw(st.integers(1, max(1, len(text))))
    junk = data.draw(st.text(max_size=8))
    at = data.draw(st.integers(1, cut))
    broken = text[:at] + junk + text[at:cut]
    try:
        r = parse(broken.encode())
    except ChromeFormatError:
        return  # only when no array is there at all
    _check_accounting(r)


def test_a_valid_file_is_streamed_not_read_whole() -> None:
    """Memory follows the spans kept, not the text: a valid file is read in the
    parser's small buffers (the tolerant reader, which holds the text, is not used)."""
    import io

    from otel_proofscope.integrations.trace_import.chrome import parse_file

    events = [{"ph": "X", "name": f"f{k % 50}", "ts": k * 10 + 0.125, "dur": 5,
               "pid": 1, "tid": 1 + k % 3, "args": {"k": k}} for k in range(20_000)]
    raw = json.dumps({"traceEvents": events}).encode()
    assert len(raw) > 1 << 20

    class Reads(io.BytesIO):
        largest = 0

        def read(self, n: int | None = -1) -> bytes:
            chunk = super().read(n)
            Reads.largest = max(Reads.largest, len(chunk))
            return chunk

    r = parse_file(Reads(raw))
    assert Reads.largest <= 1 << 16 and r.entries == 20_000 and not r.skipped
    assert [(s.name, s.start_ns, s.end_ns, s.parent) for s in r.spans] == [
        (s.name, s.start_ns, s.end_ns, s.parent) for s in parse(raw).spans]
    # a malformed entry near the end: read on from there, byte offsets exact
    at = raw.rindex(b', {"ph"') + 2
    r = parse_file(Reads(raw[:at] + b"{oops}, " + raw[at:]))
    assert r.skipped == {"malformed JSON": 1} and r.entries == 20_001
    assert r.errors[0].startswith(f"event #19999 (byte {at}): malformed JSON")
    assert len(r.spans) == 20_000
