"""span_wire: the compact frames between the prover and its Rerun worker process carry
every field the translation reads, and refuse (counted) whatever is malformed."""

from __future__ import annotations

import contextlib
import marshal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_proofscope.rerun import span_wire
from otel_proofscope.rerun.columns import Frame
from otel_proofscope.rerun.model import ProofRegistry
from otel_proofscope.rerun.translate import GapTable, SpanTranslator
from tests.test_rerun_process import proof_spans

_SCALARS = st.one_of(st.text(max_size=10), st.booleans(),
                     st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False))
_VALUES = st.one_of(_SCALARS, st.lists(st.text(max_size=5), max_size=4),
                    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
                    st.lists(st.floats(allow_nan=False), max_size=3))
_ATTRS = st.dictionaries(st.text(min_size=1, max_size=10), _VALUES, max_size=6)


_SPAN_PLANS = st.lists(st.fixed_dictionaries({
    "name": st.text(max_size=12), "attrs": _ATTRS, "kind": st.sampled_from(list(SpanKind)),
    "events": st.lists(st.tuples(st.text(max_size=8), _ATTRS, st.integers(1, 2**63 - 1)),
                       max_size=4),
    "status": st.sampled_from(list(StatusCode)), "why": st.text(max_size=8),
    "child": st.booleans()}), min_size=1, max_size=4)


def _spans(plans: list[dict[str, Any]]) -> list[ReadableSpan]:
    """Real SDK spans (built outside the strategy: the SDK draws ids from ``random``)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("wire")
    for plan in plans:
        with tracer.start_as_current_span(plan["name"], attributes=plan["attrs"],
                                          kind=plan["kind"]) as outer:
            for name, attrs, timestamp in plan["events"]:
                outer.add_event(name, attrs, timestamp=timestamp)
            code = plan["status"]
            outer.set_status(Status(code, plan["why"] if code is StatusCode.ERROR else None))
            if plan["child"]:
                with tracer.start_as_current_span("child"):
                    pass
    return list(memory.get_finished_spans())


def _view(span: ReadableSpan) -> tuple[Any, ...]:
    """Everything the Rerun translation reads from a span, through the public API."""
    ctx = span.context
    assert ctx is not None
    return (span.name, ctx.trace_id, ctx.span_id,
            span.parent.span_id if span.parent else None, span.kind, span.start_time,
            span.end_time, span.status.status_code, span.status.description,
            dict(span.attributes or {}),
            [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_SPAN_PLANS)
def test_round_trip_keeps_every_field_the_translation_reads(plans: list[dict[str, Any]]) -> None:
    spans = _spans(plans)
    data, refused = span_wire.pack_spans(spans)
    assert refused == []
    back = span_wire.unpack_spans(data)
    assert (back.rejected_spans, back.first_error) == (0, "")
    assert [_view(s) for s in back.spans] == [_view(s) for s in spans]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_SPAN_PLANS)
def test_fast_field_access_equals_the_public_properties(plans: list[dict[str, Any]]) -> None:
    spans = _spans(plans)
    assert span_wire._FAST, "the installed SDK should allow the fast path"
    for span in spans:
        assert span_wire._record_fast(span) == span_wire._record(span)


def test_unpacked_spans_translate_to_the_same_rerun_sends() -> None:
    spans = proof_spans(layers=5)
    back = span_wire.unpack_spans(span_wire.pack_spans(spans)[0]).spans

    def sends(batch: list[ReadableSpan]) -> list[tuple[str, int]]:
        frame = Frame()
        SpanTranslator(ProofRegistry(), GapTable()).translate(batch, frame)
        return [(s.path, s.rows) for s in frame.sends()]

    assert sends(back) == sends(spans)
    assert len(sends(spans)) > 10


def test_a_value_marshal_cannot_carry_refuses_that_span_only() -> None:
    spans = proof_spans(layers=2)
    bad = spans[0]
    bad._attributes = {"x": object()}  # type: ignore[attr-defined]  # as no SDK would
    data, refused = span_wire.pack_spans(spans)
    assert refused == [bad]
    assert [s.name for s in span_wire.unpack_spans(data).spans] == [s.name for s in spans[1:]]


@pytest.mark.parametrize("data, what", [
    (b"", "unreadable"),
    (b"\xff" * 16, "unreadable"),
    (marshal.dumps((99, [])), "version 99"),
    (marshal.dumps((2, [])), "without its resource and scope tables"),
    (marshal.dumps((1, "not a list")), "records not a list"),
    (marshal.dumps(7), "unreadable"),
])
def test_unreadable_frames_raise_a_frame_error_naming_the_problem(data: bytes,
                                                                   what: str) -> None:
    with pytest.raises(span_wire.FrameError, match=what):
        span_wire.unpack_spans(data)


def test_malformed_records_are_refused_and_counted_the_rest_kept() -> None:
    good = span_wire._record(proof_spans(layers=1)[0])
    bad_events = (("e", 1, "attrs not a dict"),) * 3
    records = [good, ("short",), (*good[:10], ("not an event",)),
               (*good[:4], 99, *good[5:]),  # no such span kind
               ("n", 1, 2, 0, 0, 1, 2, 0, None, {}, bad_events), good]
    out = span_wire.unpack_spans(marshal.dumps((1, records)))
    assert len(out.spans) == 2
    assert out.rejected_spans == 4
    # the events of the refused records that are well-formed enough to count them
    assert out.rejected_events == 1 + len(good[10]) + 3
    assert out.first_error.startswith("span record 1:")


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4),
                              st.floats()),
                    lambda inner: st.lists(inner, max_size=4).map(tuple) | st.lists(inner,
                    max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=30))
def test_any_marshalled_value_is_a_frame_error_or_counted_refusals(value: Any) -> None:
    for frame in (marshal.dumps(value), marshal.dumps((1, [value])),
                  marshal.dumps((1, [value] if isinstance(value, tuple) else []))):
        try:
            out = span_wire.unpack_spans(frame)
        except span_wire.FrameError:
            continue
        assert len(out.spans) + out.rejected_spans == len(marshal.loads(frame)[1])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_anything_but_a_frame_error(data: bytes) -> None:
    with contextlib.suppress(span_wire.FrameError):
        span_wire.unpack_spans(data)
