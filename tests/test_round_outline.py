"""round_outline: the Rerun translations read round records without building their OTLP
attributes, and draw exactly what they draw from the built events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.sdk_fields import events_fields, span_events_unread
from otel_proofscope.rerun import span_wire
from otel_proofscope.rerun.round_outline import full, outline
from tests.test_rerun_translate import _resolved, export

FIELD = 2**61 - 1
element = st.one_of(st.integers(0, FIELD), st.tuples(st.integers(0, 2**31 - 2)),
                    st.tuples(*[st.integers(0, 2**31 - 2)] * 4))
claims = st.one_of(st.none(), element, st.just(2**200))
rounds = st.lists(st.tuples(st.integers(-1, 40), st.lists(element, min_size=1, max_size=4),
                            claims, st.one_of(st.none(), element)),
                  min_size=1, max_size=12)


def _spans(layers: list[list[tuple[Any, ...]]]) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    with tracer.proof(system="gkr", layers=len(layers)):
        for i, layer in enumerate(layers):
            with tracer.layer(index=i, kind="MatMul", rounds=8):
                for index, poly, claim, challenge in layer:
                    tracer.sumcheck_round(index, poly, claim, challenge=challenge)
    return list(memory.get_finished_spans())


def _built(span: ReadableSpan) -> ReadableSpan:
    """The same span with every round built into an SDK Event (the path a span from
    any other producer takes)."""
    events = span_events_unread(span)
    built = tuple(events.events()) if type(events) is DeferredEvents else tuple(events)
    return ReadableSpan(span.name, span.context, span.parent, span.resource,
                        span.attributes, built, span.links, span.kind, None, span.status,
                        span.start_time, span.end_time,
                        instrumentation_scope=span.instrumentation_scope)


@settings(max_examples=40, deadline=None)
@given(st.lists(rounds, min_size=1, max_size=3))
def test_full_gives_exactly_the_built_fields(layers: list[list[tuple[Any, ...]]]) -> None:
    for span in _spans(layers):
        events = span_events_unread(span)
        if type(events) is DeferredEvents:
            assert [full(item) for item in outline(events)] == events_fields(events)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rounds, min_size=1, max_size=3))
def test_the_view_is_the_same_from_records_and_from_built_events(
        tmp_path_factory: Any, layers: list[list[tuple[Any, ...]]]) -> None:
    tmp = tmp_path_factory.mktemp("outline")
    spans = _spans(layers)
    assert any(type(span_events_unread(s)) is DeferredEvents for s in spans)
    from_records = _resolved(export(tmp / "records.rrd", [spans]))
    from_events = _resolved(export(tmp / "events.rrd", [[_built(s) for s in spans]]))
    assert from_records == from_events


def test_a_held_frame_unpacked_without_fields_draws_the_same(tmp_path: Path) -> None:
    spans = _spans([[(r, [r, r + 1, 2**60 + r], (r * 7, 1, 2, 3), 9) for r in range(8)]
                    for _ in range(3)])
    payload, refused = span_wire.pack_spans_full(spans)
    assert not refused
    built = span_wire.unpack_spans(payload).spans
    unbuilt = span_wire.unpack_spans(payload, check_records=False).spans
    layer = next(s for s in unbuilt if type(span_events_unread(s)) is DeferredEvents)
    assert span_events_unread(layer)._fields is None  # nothing was built
    assert _resolved(export(tmp_path / "a.rrd", [built])) == \
        _resolved(export(tmp_path / "b.rrd", [unbuilt]))


def test_fields_already_built_are_read_as_they_are() -> None:
    [layer] = [s for s in _spans([[(0, [1, 2], 3, 4), (1, [5, 6], (7, 8, 9, 10), None)]])
               if type(span_events_unread(s)) is DeferredEvents]
    events = span_events_unread(layer)
    assert events.fields_if_built() is None
    light = outline(events)
    assert type(light[0][3]) is tuple  # a record, outlined: nothing was built
    assert events.fields_if_built() is None
    built = events.fields()  # the OTLP encoder's read, in the export process
    assert outline(events) is built
