"""The OpenTelemetry SDK's private span, event and attribute fields: one probe, one set
of readers.

Why read private fields at all: the public properties copy. ``ReadableSpan.attributes``
wraps the attributes in a ``MappingProxyType``, ``.events`` builds a new tuple, and
``BoundedAttributes.get`` is Python code about six times slower than the plain dict it
wraps. On the export thread, which competes with the prover for the GIL, those copies
doubled the cost of encoding a span (OTLP encoder and Rerun span frames alike).

This module (with :mod:`~otel_proofscope.otlp.deferred_events`, the span event list
it installs) is the only one that names those fields. :data:`FIELDS_OK` is the result of
one probe, run at import on a real SDK span, that checks every private field read here
against its public property; when it fails (a future SDK moved something), every
reader below falls back to the public API, which is slower and equally correct.
:func:`bounded_attributes` is one write: it fills a ``BoundedAttributes`` with
values that are already valid, skipping the SDK's per-value re-validation.
:func:`deferred_events` is the other: it swaps a live span's event list for one that
takes compact records on the prover thread (a sumcheck round) and builds the SDK's
events when they are read; :data:`DEFERRED_OK` is its own probe, and without it the
caller uses ``add_event``. The readers below also know the receiver's event list
(:class:`~otel_proofscope.otlp.received_events.ReceivedEvents`, events read from the
protobuf on demand), which is public code of this package, not SDK internals.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanLimits, TracerProvider
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace.status import Status, StatusCode

from otel_proofscope.otlp.deferred_events import (
    Build,
    DeferredEvents,
    EventFields,
)
from otel_proofscope.otlp.deferred_events import private_event_fields as _private_event
from otel_proofscope.otlp.deferred_events import public_event_fields as _public_event
from otel_proofscope.otlp.received_events import ReceivedEvents

#: The event lists of this package that read their events on demand (the prover's round
#: records, a received span's protobuf): the readers below ask them, never iterate them.
LAZY_EVENTS = (DeferredEvents, ReceivedEvents)
#: Event containers that are never lazy, told apart by their exact type: isinstance()
#: against the lazy lists goes through ABCMeta (they are BoundedLists, hence Sequences),
#: ~0.5 µs for a container that is none of them, and the readers below ask per span (a
#: span unpacked in the export process without events holds a tuple).
_PLAIN_CONTAINERS = frozenset((tuple, list, BoundedList))


def is_lazy(events: Any) -> TypeGuard[DeferredEvents | ReceivedEvents]:
    """Whether ``events`` is one of :data:`LAZY_EVENTS` (or a subclass)."""
    kind = type(events)
    if kind in _PLAIN_CONTAINERS:
        return False
    return kind is DeferredEvents or kind is ReceivedEvents or isinstance(events, LAZY_EVENTS)

#: The public ``ReadableSpan`` properties whose storage the private readers bypass; a
#: class that overrides any of them is read through the public API.
_READABLE_SPAN_PROPS = ("parent", "name", "kind", "start_time",
                        "end_time", "status", "attributes", "events", "links",
                        "dropped_attributes", "dropped_events", "dropped_links")
_PLAIN_SPAN_TYPES: dict[type, bool] = {}

#: ``(context, parent, name, kind, start, end, status, attributes, dropped_attributes,
#: events, dropped_events, links, dropped_links)``; ``attributes`` is a plain mapping
#: where the probe allows, ``events`` and ``links`` are iterables.
SpanFields = tuple[Any, Any, str, Any, "int | None", "int | None", Any, Any, int, Any,
                   int, Any, int]


def _sdk_span_storage(cls: type) -> bool:
    """True when ``cls`` keeps the SDK's storage, so its private fields hold what its
    public properties return (the SDK's live ``Span`` overrides ``get_span_context``
    only to return the same ``_context``)."""
    plain = _PLAIN_SPAN_TYPES.get(cls)
    if plain is None:
        plain = (issubclass(cls, ReadableSpan)
                 and cls.get_span_context in (ReadableSpan.get_span_context,
                                              Span.get_span_context)
                 and all(getattr(cls, p, None) is getattr(ReadableSpan, p)
                         for p in _READABLE_SPAN_PROPS))
        _PLAIN_SPAN_TYPES[cls] = plain
    return plain


def _private_span(span: Any, deferred: bool = False) -> SpanFields:
    attrs: Any = span._attributes
    events: Any = span._events
    links: Any = span._links
    if type(attrs) is BoundedAttributes:
        dropped_attrs = attrs.dropped
        attrs = attrs._dict
    else:
        dropped_attrs = 0
    if type(events) is BoundedList:
        dropped_events = events.dropped
        events = events._dq  # type: ignore[attr-defined]
    elif is_lazy(events):
        dropped_events = events.dropped
        if not deferred:
            events = events.events()
    else:
        dropped_events = 0
    if type(links) is BoundedList:
        dropped_links = links.dropped
        links = links._dq  # type: ignore[attr-defined]
    else:
        dropped_links = 0
    return (span._context, span._parent, span._name, span._kind, span._start_time,
            span._end_time, span._status, attrs, dropped_attrs, events, dropped_events,
            links, dropped_links)


def _public_span(span: ReadableSpan) -> SpanFields:
    return (span.get_span_context(), span.parent, span.name, span.kind, span.start_time,
            span.end_time, span.status, span.attributes, span.dropped_attributes,
            span.events, span.dropped_events, span.links, span.dropped_links)


def _comparable(f: SpanFields) -> tuple[Any, ...]:
    return (*f[:7], dict(f[7]), f[8], tuple(f[9]), f[10], tuple(f[11]), f[12])


def _probe() -> bool:
    """Whether the installed SDK keeps span, event and attribute fields where the
    private readers look: checked once, on a real span, against the public API."""
    try:
        tracer = TracerProvider().get_tracer("proofscope.probe")
        with tracer.start_as_current_span("outer"), \
                tracer.start_as_current_span("probe", attributes={"a": 1, "b": (2, 3)},
                                             links=()) as span:
            span.add_event("e", {"k": "v"}, timestamp=7)
            span.set_status(Status(StatusCode.ERROR, "why"))
        if not _sdk_span_storage(type(span)):
            return False
        private, public = _private_span(span), _public_span(span)  # type: ignore[arg-type]
        same_span = _comparable(private) == _comparable(public)
        event = public[9][0]
        ev_private, ev_public = _private_event(event), _public_event(event)
        same_event = (type(event) is Event and ev_private[:2] == ev_public[:2]
                      and dict(ev_private[2]) == dict(ev_public[2])
                      and ev_private[3] == ev_public[3])
        bounded = bounded_attributes({"x": 1}, 2)
        same_store = type(bounded._dict) is dict and dict(bounded) == {"x": 1}
        return bool(same_span and same_event and same_store
                    and type(private[7]) is dict and type(ev_private[2]) is dict)
    except Exception:
        return False


def span_fields(span: ReadableSpan, *, deferred: bool = False) -> SpanFields:
    """Every field the OTLP encoder and the Rerun frames read, in one call. With
    ``deferred``, a deferred event list is given as it is, for :func:`events_fields` to
    read without building an ``Event`` (or for its records, :meth:`DeferredEvents.items`)."""
    if FIELDS_OK and _sdk_span_storage(type(span)):
        return _private_span(span, deferred)
    return _public_span(span)


def span_attributes(span: Any) -> Mapping[str, Any]:
    """A span's attributes as a plain mapping, without the copy or proxy the public
    property builds on every read (the translations read them several times a span)."""
    if FIELDS_OK and _sdk_span_storage(type(span)):
        attrs = span._attributes
        if type(attrs) is BoundedAttributes:
            return attrs._dict  # type: ignore[no-any-return]
        return attrs if attrs is not None else {}  # type: ignore[no-any-return]
    return plain_attributes(getattr(span, "attributes", None))


def unbuilt_events(span: Any) -> DeferredEvents | None:
    """The span's event list when it still holds round records that nobody has built
    (a process that only forwards the span can send the records instead), else None."""
    if FIELDS_OK and _sdk_span_storage(type(span)):
        events = span._events
        if type(events) is DeferredEvents and events._pending:
            return events
    return None


def span_events(span: Any) -> Sequence[Any]:
    """A span's events, oldest first, without the tuple the public property copies on
    every read (records of a deferred list are built once, as on any read)."""
    if FIELDS_OK and _sdk_span_storage(type(span)):
        events = span._events
        kind = type(events)
        if kind is BoundedList:
            return events._dq  # type: ignore[attr-defined, no-any-return]
        if kind is tuple:  # what the public property would copy it into
            return events  # type: ignore[no-any-return]
        if is_lazy(events):
            return events.events()
    return getattr(span, "events", None) or ()


def span_events_unread(span: Any) -> Sequence[Any]:
    """A span's events as :func:`span_events` gives them, except that a deferred list is
    given as it is, its round records unbuilt: read it with :func:`events_fields`, which
    builds no ``Event`` for them (iterating it builds them, as any read does)."""
    if FIELDS_OK and _sdk_span_storage(type(span)):
        events = span._events
        if is_lazy(events):
            return events
    return span_events(span)


def events_at(events: Sequence[Any], indices: list[int]) -> list[Any]:
    """The events at ``indices`` of a list :func:`span_events_unread` gave, as events; of
    a deferred list only those are built."""
    if is_lazy(events):
        return events.events_at(indices)
    return [events[i] for i in indices]


def event_count(span: Any) -> int:
    """How many events ``span`` holds, without reading them: the public property copies
    them, which for a deferred list builds every record's event (on the prover thread,
    where the processors size each span as it ends)."""
    if FIELDS_OK and _sdk_span_storage(type(span)):
        events = span._events
        # Exact types first (is_lazy): a span unpacked without events holds a tuple,
        # and isinstance() then the public property's copy cost ~0.7 µs, several times
        # a span in the export process.
        kind = type(events)
        if kind is BoundedList or kind is tuple or is_lazy(events):
            return len(events)
    return len(getattr(span, "events", None) or ())


def _event_column(events: Any, private: str, index: int) -> list[Any]:
    """One field of every event of a span, as :func:`events_fields` reads it (``private``
    the SDK ``Event``'s own attribute, ``index`` the field's place in EventFields)."""
    if FIELDS_OK:
        get, event_type = operator.attrgetter(private), Event
        return [get(e) if type(e) is event_type else event_fields(e)[index] for e in events]
    return [_public_event(e)[index] for e in events]


def event_names(events: Any) -> list[Any]:
    """The name of every event of a span (a deferred list's records unbuilt where it
    knows their name)."""
    if is_lazy(events):
        return events.names()
    return _event_column(events, "_name", 0)


def event_timestamps(events: Any) -> list[Any]:
    """The timestamp of every event of a span (a deferred list's records unbuilt)."""
    if is_lazy(events):
        return events.timestamps()
    return _event_column(events, "_timestamp", 1)


def event_fields(event: Any) -> EventFields:
    """``(name, timestamp, attributes, dropped_attributes)`` of a span event."""
    if FIELDS_OK and type(event) is Event:
        return _private_event(event)
    return _public_event(event)


def events_fields(events: Any) -> list[EventFields]:
    """:func:`event_fields` of every event of a span, in one call (a prover span carries
    many events, and a call per event adds up). A deferred event list (``span_fields(...,
    deferred=True)``) gives its records' fields without building their events."""
    if is_lazy(events):
        return events.fields()
    if FIELDS_OK:
        # The common case (an SDK Event with BoundedAttributes) is read inline: a
        # function call per event would cost as much as the reads themselves.
        bounded, event_type, other = BoundedAttributes, Event, event_fields
        return [(e._name, e._timestamp, (a := e._attributes)._dict, a.dropped)
                if type(e) is event_type and type(e._attributes) is bounded else other(e)
                for e in events]
    return [_public_event(e) for e in events]


def plain_attributes(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The plain dict behind the SDK's ``BoundedAttributes`` (its ``Mapping.get`` is ~6x
    slower); any other mapping as it is, ``None`` as an empty dict."""
    if attrs is None:
        return {}
    if FIELDS_OK and type(attrs) is BoundedAttributes:
        return attrs._dict  # type: ignore[no-any-return]
    return attrs


def bounded_attributes(values: Mapping[str, Any], dropped: int) -> BoundedAttributes:
    """A mutable ``BoundedAttributes`` holding ``values`` and counting ``dropped``.

    ``values`` must already be valid attribute values (the OTLP decoder builds them so):
    they go straight into the private store, because the SDK's per-value re-validation
    would double the cost of a decoded span. Without that store, the public constructor.
    """
    attrs = BoundedAttributes(None, None, immutable=False, extended_attributes=True)
    store = getattr(attrs, "_dict", None)
    if isinstance(store, dict):
        store.update(values)
    else:  # pragma: no cover - a future SDK without the private store
        attrs = BoundedAttributes(None, values, immutable=False, extended_attributes=True)
    attrs.dropped = dropped
    return attrs


def _install(span: Any, build: Build, record_name: str | None) -> DeferredEvents | None:
    with span._lock:
        old = span._events
        if type(old) is not BoundedList or span._end_time is not None:
            return None
        events = DeferredEvents(old._dq.maxlen, span._limits, build,  # type: ignore[attr-defined]
                                record_name)
        events._dq.extend(old._dq)  # type: ignore[attr-defined]
        events.dropped = old.dropped
        span._events = events
    return events


#: The SDK ``Span`` methods that touch the event list; a subclass overriding any of them
#: keeps ``add_event`` for every event.
_EVENT_METHODS = ("add_event", "_add_event", "_new_events", "_readable_span", "end",
                  "is_recording", "__init__")
_DEFERRABLE_TYPES: dict[type, bool] = {}


def _deferrable_span_type(cls: type) -> bool:
    """The SDK's ``Span`` or a subclass that changes nothing about events (the tracer
    makes ``_Span``, an empty subclass)."""
    ok = _DEFERRABLE_TYPES.get(cls)
    if ok is None:
        ok = (issubclass(cls, Span) and _sdk_span_storage(cls)
              and all(getattr(cls, m, None) is getattr(Span, m) for m in _EVENT_METHODS))
        _DEFERRABLE_TYPES[cls] = ok
    return ok


def deferred_events(span: Any, build: Build,
                    record_name: str | None = None) -> DeferredEvents | None:
    """Give a live SDK span an event list that takes records (see
    :mod:`~otel_proofscope.otlp.deferred_events`), or ``None`` where it cannot: a
    span class that changes how events are added or read, an ended span, an event list
    already replaced, or an SDK that failed the probe. ``None`` means: call ``span.add_event``.
    ``record_name``: the name ``build`` gives every record, when it is always the same."""
    if not DEFERRED_OK or not _deferrable_span_type(type(span)):
        return None
    try:
        return _install(span, build, record_name)
    except Exception:  # pragma: no cover - probed at import
        return None


def _probe_deferred() -> bool:
    """Whether a span given :func:`deferred_events` reads back, through the public API,
    exactly as one given the same events through ``add_event``: order, timestamps,
    attributes, the event limit's drops. (Attribute limits that bite go through the
    SDK's public ``BoundedAttributes`` constructor, as ``add_event`` does, and would log
    warnings here.)"""
    try:
        tracer = TracerProvider(span_limits=SpanLimits(max_events=3)).get_tracer(
            "proofscope.probe")

        def build(record: tuple[Any, ...]) -> tuple[str, Mapping[str, Any]]:
            return "r", {"a": record[1], "b": ("xyz",), "c": "long"}

        def events(span: Any) -> tuple[Any, ...]:
            return (span.dropped_events, [(e.name, e.timestamp, dict(e.attributes),
                                           e.dropped_attributes) for e in span.events])

        with tracer.start_as_current_span("deferred") as deferred:
            sink = deferred_events(deferred, build)
            if sink is None:
                return False
            for i in range(3):
                deferred.add_event("user", {"i": i}, timestamp=100 + i)
                if not sink.add((200 + i, i), deferred):
                    return False
        with tracer.start_as_current_span("plain") as plain:
            for i in range(3):
                plain.add_event("user", {"i": i}, timestamp=100 + i)
                plain.add_event("r", {"a": i, "b": ["xyz"], "c": "long"}, timestamp=200 + i)
        late = not sink.add((300, 0), deferred)
        readable = deferred._readable_span()  # type: ignore[attr-defined]
        return bool(late and events(deferred) == events(plain)
                    and events(readable) == events(plain)
                    and type(deferred._events) is DeferredEvents)  # type: ignore[attr-defined]
    except Exception:
        return False


#: Whether the private readers are in use (the probe passed on the installed SDK).
FIELDS_OK: bool = False
FIELDS_OK = _probe()
#: Whether :func:`deferred_events` installs its list (its own probe passed too).
DEFERRED_OK: bool = FIELDS_OK  # the probe below goes through deferred_events itself
DEFERRED_OK = FIELDS_OK and _probe_deferred()
