"""span_wire version 2: the frames the export process is sent carry everything OTLP
needs, so the child's OTLP bytes are the official encoder's bytes of the original spans."""

from __future__ import annotations

import marshal
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.trace import SpanKind

from otel_proofscope.otlp.encode import encode_export_request
from otel_proofscope.rerun import span_wire
from tests.test_fast_otlp import _make_spans, _span_plan
from tests.test_rerun_process import proof_spans
from tests.test_span_wire import _view


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_span_plan(), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_child_otlp_bytes_equal_the_official_encoder_on_the_original_spans(
        plans: list[dict[str, Any]], rnd: random.Random) -> None:
    spans = _make_spans(plans)
    rnd.shuffle(spans)  # interleave resources and scopes within the batch
    data, refused = span_wire.pack_spans_full(spans)
    assert refused == []
    back = span_wire.unpack_spans(data)
    assert (back.rejected_spans, back.first_error) == (0, "")
    assert encode_export_request(back.spans) == encode_spans(spans).SerializeToString()
    # ... and the Rerun translation reads the same fields as from a version 1 frame.
    assert [_view(s) for s in back.spans] == [_view(s) for s in spans]


def test_every_otlp_field_survives_beyond_the_bytes() -> None:
    spans = _make_spans([{
        "provider": 1, "scope": 1, "name": "n", "kind": SpanKind.CLIENT,
        "attrs": {f"a{i}": i for i in range(7)},  # over the limit of 5: 2 dropped
        "events": [("e", {f"k{i}": i for i in range(6)}, 5)] * 4,  # 1 dropped, 2 over
        "links": [((3, 4), True, [("vendor", "v")], {"l": 1})] * 3,  # 1 dropped
        "status": None, "parent": "remote", "remote": ((9, 10), [("a1", "123")]),
        "times": (100, 5)}])
    back = span_wire.unpack_spans(span_wire.pack_spans_full(spans)[0]).spans
    for a, b in zip(spans, back, strict=True):
        assert (a.dropped_attributes, a.dropped_events, a.dropped_links) == \
            (b.dropped_attributes, b.dropped_events, b.dropped_links)
        assert [e.dropped_attributes for e in a.events] == [e.dropped_attributes
                                                            for e in b.events]
        assert a.context == b.context and a.context.trace_state == b.context.trace_state
        # The parent's own flags and trace state are not carried (OTLP has no field).
        assert [(p.trace_id, p.span_id, p.is_remote) if p else None for p in (a.parent,)] \
            == [(p.trace_id, p.span_id, p.is_remote) if p else None for p in (b.parent,)]
        assert [(lk.context, lk.context.trace_state, dict(lk.attributes or {}))
                for lk in a.links] == [(lk.context, lk.context.trace_state,
                                        dict(lk.attributes or {})) for lk in b.links]
        assert a.resource == b.resource and a.resource.schema_url == b.resource.schema_url
        assert a.instrumentation_scope == b.instrumentation_scope
        assert a.status.status_code == b.status.status_code
    assert sum(s.dropped_attributes for s in spans) > 0
    assert sum(s.dropped_links for s in spans) > 0


def test_version_1_frames_are_still_read() -> None:
    spans = proof_spans(layers=2)
    v1 = span_wire.unpack_spans(span_wire.pack_spans(spans)[0]).spans
    v2 = span_wire.unpack_spans(span_wire.pack_spans_full(spans)[0]).spans
    assert [_view(s) for s in v1] == [_view(s) for s in v2] == [_view(s) for s in spans]


def test_one_resource_entry_per_frame_and_one_object_per_distinct_resource() -> None:
    spans = proof_spans(layers=4)
    data, _ = span_wire.pack_spans_full(spans)
    _, records, resources, scopes = marshal.loads(data)
    assert len(resources) == 1 and len(scopes) == 1 and len(records) == len(spans)
    again = span_wire.unpack_spans(span_wire.pack_spans_full(spans)[0]).spans
    first = span_wire.unpack_spans(data).spans
    assert first[0].resource is again[-1].resource  # rebuilt once, not per frame


def test_a_value_marshal_cannot_carry_refuses_that_span_only() -> None:
    spans = proof_spans(layers=2)
    bad = spans[0]
    bad._attributes = {"x": object()}  # type: ignore[attr-defined,dict-item]  # no SDK would
    data, refused = span_wire.pack_spans_full(spans)
    assert refused == [bad]
    assert [s.name for s in span_wire.unpack_spans(data).spans] == [s.name for s in spans[1:]]


def test_malformed_full_records_are_refused_and_counted_the_rest_kept() -> None:
    spans = proof_spans(layers=1)
    _, records, resources, scopes = marshal.loads(span_wire.pack_spans_full(spans)[0])
    good = records[0]
    bad = [good[:13],  # a version 1 record in a version 2 frame
           (*good[:13], 5, *good[14:]),  # no such resource
           (*good[:13], 0, 7, *good[15:]),  # no such scope
           (*good[:16], ("not pairs",), *good[17:]),
           (*good[:17], (("link",),), *good[18:])]
    out = span_wire.unpack_spans(marshal.dumps((2, [good, *bad, good], resources, scopes)))
    assert len(out.spans) == 2 and out.rejected_spans == len(bad)
    assert out.rejected_events == sum(len(r[10]) for r in bad)


def _prover_spans(limits: Any, rounds: int, user_events: bool) -> list[Any]:
    """Spans of ProofTracer whose round records nobody has read yet (their events
    unbuilt), some with a user's own add_event between the rounds."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_proofscope.instrumentation import ProofTracer

    keep = InMemorySpanExporter()  # keeps the spans without reading their events
    tp = TracerProvider(span_limits=SpanLimits(**limits))
    tp.add_span_processor(SimpleSpanProcessor(keep))
    tracer = ProofTracer(tp)
    with tracer.proof(system="gkr", layers=2):
        for index in range(2):
            with tracer.layer(index=index, kind="MatMul", rounds=rounds) as layer:
                for r in range(rounds):
                    tracer.sumcheck_round(r, [(r, 2, 3, 4), (5, 6, 7, 8 + r)],
                                          (r * 7919, 1, 2, 3), challenge=r + 11)
                    if user_events and r == 1:
                        layer.span.add_event("user", {"note": "x" * 40})
    return list(keep.get_finished_spans())


#: (span limits, rounds per layer, a user's own event among the rounds) for _prover_spans.
_PROVER_SPAN_CASES = (st.sampled_from([{}, {"max_events": 3}, {"max_event_attributes": 2},
                                       {"max_attribute_length": 5}]),
                      st.integers(min_value=1, max_value=6), st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*_PROVER_SPAN_CASES)
def test_round_records_travel_unbuilt_and_build_the_same_bytes_in_the_child(
        limits: dict[str, int], rounds: int, user_events: bool) -> None:
    from otel_proofscope.otlp import deferred_events, sdk_fields

    spans = _prover_spans(limits, rounds, user_events)
    layers = [s for s in spans if s.name == "proof.layer"]
    assert all(sdk_fields.unbuilt_events(s) is not None for s in layers)
    data, refused = span_wire.pack_spans_full(spans)
    assert refused == []
    # Packing built nothing here: the records are still records in this process.
    assert all(sdk_fields.unbuilt_events(s) is not None for s in layers)
    back = span_wire.unpack_spans(data)
    assert (back.rejected_spans, back.first_error) == (0, "")
    # The child keeps them as a deferred list: its encoder reads the fields built at
    # unpacking (no Event), and the bytes are the official encoder's on the originals.
    assert any(type(s._events) is deferred_events.DeferredEvents for s in back.spans)
    assert encode_export_request(back.spans) == encode_spans(spans).SerializeToString()
    assert [_view(s) for s in back.spans] == [_view(s) for s in spans]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*_PROVER_SPAN_CASES)
def test_version_1_frames_carry_round_records_unbuilt_too(
        limits: dict[str, int], rounds: int, user_events: bool) -> None:
    """The Rerun-only child's frames: the records cross unbuilt and the child's spans
    read exactly as the originals would."""
    from otel_proofscope.otlp import sdk_fields

    spans = _prover_spans(limits, rounds, user_events)
    layers = [s for s in spans if s.name == "proof.layer"]
    data, refused = span_wire.pack_spans(spans)
    assert refused == []
    assert all(sdk_fields.unbuilt_events(s) is not None for s in layers)
    back = span_wire.unpack_spans(data)
    assert (back.rejected_spans, back.first_error) == (0, "")
    assert [_view(s) for s in back.spans] == [_view(s) for s in spans]


@pytest.mark.parametrize("spoil", [
    lambda entry: (("not", "a", "record"), None, None),  # the builder cannot build it
    lambda entry: ((), entry[1], entry[2]),  # an empty record
    lambda entry: (("0", *entry[0][1:]), entry[1], entry[2]),  # a timestamp not an int
    lambda entry: (entry[0], "128", entry[2]),  # a limit not an int
    lambda entry: (entry[0], 7, entry[2]),  # limits unlike the span's other records
], ids=["unbuildable", "empty", "timestamp", "limit-type", "limits-differ"])
def test_a_malformed_round_record_refuses_its_span_only(spoil: Any) -> None:
    spans = _prover_spans({}, 2, False)
    version, records, resources, scopes = marshal.loads(span_wire.pack_spans_full(spans)[0])
    bad = next(i for i, r in enumerate(records) if r[0] == "proof.layer")
    events = list(records[bad][10])
    events[-1] = spoil(events[-1])
    records[bad] = (*records[bad][:10], tuple(events), *records[bad][11:])
    back = span_wire.unpack_spans(marshal.dumps((version, records, resources, scopes)))
    assert back.rejected_spans == 1 and len(back.spans) == len(spans) - 1
    assert "round record" in back.first_error
