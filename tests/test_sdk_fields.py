"""otlp.sdk_fields: the private-field readers agree with the installed SDK's public API."""

from __future__ import annotations

from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.trace import Link
from opentelemetry.trace.status import Status, StatusCode

from otel_proofscope.otlp import sdk_fields
from otel_proofscope.otlp.sdk_fields import (
    bounded_attributes,
    event_fields,
    events_fields,
    plain_attributes,
    span_fields,
)


def _public(span: ReadableSpan) -> tuple[Any, ...]:
    return (span.get_span_context(), span.parent, span.name, span.kind, span.start_time,
            span.end_time, span.status, dict(span.attributes or {}), span.dropped_attributes,
            tuple(span.events), span.dropped_events, tuple(span.links), span.dropped_links)


def _normal(fields: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*fields[:7], dict(fields[7] or {}), fields[8], tuple(fields[9]), fields[10],
            tuple(fields[11]), fields[12])


def _span_with_drops() -> ReadableSpan:
    provider = TracerProvider(span_limits=SpanLimits(max_attributes=2, max_events=2,
                                                     max_links=1))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent:
        link = Link(parent.get_span_context(), {"l": 1})
        with tracer.start_as_current_span(
                "child", attributes={"a": 1, "b": "x", "c": (1, 2)},
                links=[link, link]) as span:
            for i in range(3):
                span.add_event(f"e{i}", {"i": i}, timestamp=10 + i)
            span.set_status(Status(StatusCode.ERROR, "why"))
    return span  # type: ignore[return-value]


def test_probe_passes_on_the_installed_sdk() -> None:
    # The package pins an SDK range; a failing probe there would silently cost speed.
    assert sdk_fields.FIELDS_OK


def test_span_fields_equal_the_public_properties_including_drop_counts() -> None:
    span = _span_with_drops()
    fields = span_fields(span)
    assert _normal(fields) == _public(span)
    assert (fields[8], fields[10], fields[12]) == (1, 1, 1)
    assert type(fields[7]) is dict  # the plain store, not a proxy


def test_a_span_class_overriding_a_property_is_read_through_it() -> None:
    class Renamed(ReadableSpan):
        @property
        def name(self) -> str:
            return "renamed"

    span = Renamed("original", attributes={"k": "v"})
    assert span_fields(span)[2] == "renamed"
    assert _normal(span_fields(span)) == _public(span)


def test_event_fields_match_public_for_sdk_and_foreign_events() -> None:
    span = _span_with_drops()
    public = [(e.name, e.timestamp, dict(e.attributes or {}), e.dropped_attributes)
              for e in span.events]
    assert [(n, t, dict(a), d) for n, t, a, d in events_fields(span.events)] == public
    assert [(n, t, dict(a), d) for n, t, a, d in map(event_fields, span.events)] == public

    class Custom(Event):
        @property
        def name(self) -> str:
            return "custom"

    custom = Custom("raw", {"x": 1}, timestamp=5)
    assert event_fields(custom)[0] == "custom"
    assert events_fields([custom])[0][0] == "custom"


def test_plain_attributes() -> None:
    bounded = BoundedAttributes(None, {"a": 1}, immutable=False)
    plain = plain_attributes(bounded)
    assert type(plain) is dict and plain == {"a": 1}
    assert plain_attributes(None) == {}
    other = {"b": 2}
    assert plain_attributes(other) is other


def test_bounded_attributes_keeps_values_and_dropped_count() -> None:
    attrs = bounded_attributes({"k": "v", "n": (1, 2)}, 3)
    assert dict(attrs) == {"k": "v", "n": (1, 2)}
    assert attrs.dropped == 3
    span = ReadableSpan("s", attributes=attrs)
    assert span.dropped_attributes == 3
