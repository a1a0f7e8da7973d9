"""Compact span frames for the out-of-process Rerun translation.

The child (:mod:`otel_proofscope.rerun.worker`) needs only what the translation reads:
name, ids, times, status, kind, attributes and events. OTLP protobuf carried that at
~185 µs per span of Python in the child (protobuf field access per ``AnyValue``) and
~15 µs in the parent; :mod:`marshal` of plain tuples costs a few µs on both sides, in C.
:mod:`marshal` (not :mod:`pickle`) because it builds only plain data on load: a frame
can never construct objects or run code, whatever bytes arrive.

A frame is ``marshal.dumps((VERSION, records))``; a record is the tuple
``(name, trace_id, span_id, parent_span_id, kind, start, end, status_code,
status_description, attributes, events, service, parent_remote)`` with
``parent_span_id`` 0 for a root, ``events`` a tuple of ``(name, timestamp, attributes)``
(or, for a sumcheck round nobody has built yet, the round entry described below),
``service`` the resource's ``service.name`` ("" when it has none; the trace view keeps
services apart by it) and ``parent_remote`` whether the parent is in another process
(the trace view waits less for such a parent).

Version 2 (:func:`pack_spans_full`, for the export process that also sends OTLP) carries
everything the OTLP encoder reads, so the child's OTLP bytes equal the official
encoder's on the original spans (tested). The frame is
``marshal.dumps((2, records, resources, scopes))``: ``resources`` a list of
``(attributes, schema_url)`` and ``scopes`` a list of ``(name, version, schema_url,
attributes)``, each distinct one once per frame; a record is the 13 fields above
followed by ``(resource_index, scope_index, trace_flags, trace_state, links,
dropped_attributes, dropped_events, dropped_links)`` with ``scope_index`` -1 for none,
``trace_state`` a tuple of ``(key, value)`` pairs, ``links`` a tuple of ``(trace_id,
span_id, is_remote, trace_flags, trace_state, attributes, dropped_attributes)``, and
every event a 4-tuple ``(name, timestamp, attributes, dropped_attributes)``, or, for a
sumcheck round that no reader has built into an event yet, a 3-tuple ``(record,
max_event_attributes, max_attribute_length)``: the instrumentation's compact record
and the sender's span limits, from which the receiver builds the very event the sender
would have (:func:`otel_proofscope.otlp.round_records.round_event`), so the prover's
process never builds it.
Version 1 frames (what the Rerun-only child is sent) are still read.
"""

from __future__ import annotations

import marshal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from otel_proofscope.otlp import round_records
from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.sdk_fields import (
    FIELDS_OK,
    bounded_attributes,
    events_fields,
    plain_attributes,
    span_fields,
    unbuilt_events,
)
from otel_proofscope.otlp.times import U64_MAX
from otel_proofscope.semconv import EventName

VERSION = 1
_ROUND_NAME = EventName.SUMCHECK_ROUND  # the name round_event gives every record
#: The full record: everything OTLP needs besides what the Rerun translation reads.
VERSION_FULL = 2
_RECORD_LEN = 13
_FULL_RECORD_LEN = 21
#: Records without the trailing service / parent_remote (written before they were
#: added) are read too.
_RECORD_LENS = (11, 12, 13)
_EMPTY_RESOURCE = Resource({})
#: Resources seen (by identity: a provider shares one) → service name; rebuilt resources.
_SERVICES: dict[int, tuple[Any, str]] = {}
_RESOURCES: dict[str, Resource] = {}
_MAX_CACHED = 256


def _service(resource: Any) -> str:
    hit = _SERVICES.get(id(resource))
    if hit is not None and hit[0] is resource:
        return hit[1]
    attrs = getattr(resource, "attributes", None) or {}
    name = attrs.get(SERVICE_NAME, "")
    name = name if isinstance(name, str) else str(name)
    if len(_SERVICES) >= _MAX_CACHED:
        _SERVICES.clear()
    _SERVICES[id(resource)] = (resource, name)
    return name


def _resource(service: Any) -> Resource:
    if not service or type(service) is not str:
        return _EMPTY_RESOURCE
    res = _RESOURCES.get(service)
    if res is None:
        if len(_RESOURCES) >= _MAX_CACHED:
            _RESOURCES.clear()
        res = _RESOURCES[service] = Resource({SERVICE_NAME: service})
    return res
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_OK = Status(StatusCode.OK)


#: Whether _record_fast reads the SDK's private fields (else it reads the public ones).
_FAST = FIELDS_OK


def _plain(attrs: Any) -> dict[str, Any]:
    # marshal takes exact dicts only; the SDK's BoundedAttributes keeps one inside.
    # (Its __len__, hence `not attrs`, is Python code: tested last.)
    if type(attrs) is dict:
        return attrs
    inner = plain_attributes(attrs)
    if type(inner) is dict:
        return inner
    return dict(attrs) if attrs else {}


def _record(s: ReadableSpan) -> tuple[Any, ...]:
    """The record from the public properties (what _record_fast must equal)."""
    ctx = s.context
    parent = s.parent
    status = s.status
    return (s.name, ctx.trace_id if ctx is not None else 0,
            ctx.span_id if ctx is not None else 0,
            parent.span_id if parent is not None else 0,
            s.kind.value, s.start_time or 0, s.end_time or 0,
            status.status_code.value, status.description,
            _plain(s.attributes),
            tuple((e.name, e.timestamp, _plain(e.attributes)) for e in s.events),
            _service(s.resource), parent is not None and parent.is_remote)


def _record_fast(s: ReadableSpan) -> tuple[Any, ...]:
    # The fields come from sdk_fields: the public properties copy the attributes (a
    # MappingProxy) and the events (a tuple) of every span, which doubles the cost on
    # the exporter thread, where it competes with the prover for the GIL. Round records
    # nobody has built travel as records, as in version 2.
    (ctx, parent, name, kind, start, end, status, attrs, _, events, _, _, _) = span_fields(
        s, deferred=True)
    return (name, ctx.trace_id if ctx is not None else 0,
            ctx.span_id if ctx is not None else 0,
            parent.span_id if parent is not None else 0,
            kind.value, start or 0, end or 0,
            status.status_code.value, status.description,
            attrs if type(attrs) is dict else _plain(attrs), _entries(s, events, full=False),
            _service(s.resource), parent is not None and parent.is_remote)


def _our_rounds(s: ReadableSpan) -> DeferredEvents | None:
    """The span's unbuilt round records when the receiver can build them (the
    instrumentation's own builder), else None: send built events."""
    deferred = unbuilt_events(s)
    if deferred is not None and deferred.builder is not round_records.round_event:
        return None
    return deferred


def _times_fit(rec: tuple[Any, ...], _max: int = U64_MAX, _int: Any = int) -> bool:
    """Whether a record's start, end and event times are integer nanoseconds in
    ``[0, 2**64)`` (0: unset), what OTLP and the view can carry (otlp/times.py).

    0.65 µs for a span of 8 events against 10.4 µs to pack it (benchmarks/README,
    issue 28; ~6 %): one comparison chain per event, the round check only off the good path
    (an unbuilt round's second item is its attribute limit, a small int that passes)."""
    start, end = rec[5], rec[6]
    if (type(start) is not _int or type(end) is not _int or not 0 <= start <= _max
            or not 0 <= end <= _max):
        return False
    for ev in rec[10]:
        t = ev[1]
        # None or 0 is "unset"; an unbuilt round's time is the prover's clock.
        if (type(t) is not _int or not 0 <= t <= _max) and t and type(ev[0]) is not tuple:
            return False
    return True


def _split_bad_times(spans: Sequence[ReadableSpan], records: list[tuple[Any, ...]],
                     ) -> tuple[Sequence[ReadableSpan], list[tuple[Any, ...]],
                                list[ReadableSpan]]:
    """The spans and records whose times fit, and the spans refused for a time that
    does not: one such span used to fail its whole batch in the child's OTLP encoder."""
    if all(map(_times_fit, records)):  # one C-level pass on the good path
        return spans, records, []
    kept_spans, kept, refused = [], [], []
    for span, rec in zip(spans, records, strict=True):
        if _times_fit(rec):
            kept_spans.append(span)
            kept.append(rec)
        else:
            refused.append(span)
    return kept_spans, kept, refused


def pack_spans(spans: Sequence[ReadableSpan]) -> tuple[bytes, list[ReadableSpan]]:
    """One frame for ``spans``, and the spans left out of it because a value could not
    be packed, or a time is outside ``[0, 2**64)`` ns (the caller counts them)."""
    spans, records, bad_times = _split_bad_times(spans, [_record_fast(s) for s in spans])
    try:
        return marshal.dumps((VERSION, records)), bad_times
    except ValueError:  # find the culprits only when there are any
        kept, refused = [], []
        for span, rec in zip(spans, records, strict=True):
            try:
                marshal.dumps(rec)
                kept.append(rec)
            except ValueError:
                refused.append(span)
        return marshal.dumps((VERSION, kept)), bad_times + refused


# ── version 2: the full record (OTLP from the child) ─────────────────────────────────

#: Resource / scope (by identity: a provider shares one) → its frame-table entry.
_RES_ENTRIES: dict[int, tuple[Any, tuple[Any, ...]]] = {}
_SCOPE_ENTRIES: dict[int, tuple[Any, tuple[Any, ...]]] = {}
#: Frame-table entries (marshalled) → the rebuilt Resource / scope, in the child.
_RES_BUILT: dict[bytes, Resource] = {}
_SCOPES_BUILT: dict[bytes, InstrumentationScope] = {}
_NO_STATE = TraceState()


def _cached_entry(cache: dict[int, tuple[Any, tuple[Any, ...]]], obj: Any,
                  make: Any) -> tuple[Any, ...]:
    hit = cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    entry: tuple[Any, ...] = make(obj)
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[id(obj)] = (obj, entry)  # the object is kept: its id cannot be reused
    return entry


def _resource_entry(resource: Any) -> tuple[Any, ...]:
    if resource is None:
        return ({}, "")
    return (_plain(resource.attributes), resource.schema_url or "")


def _scope_entry(scope: Any) -> tuple[Any, ...]:
    return (scope.name, scope.version, scope.schema_url, _plain(scope.attributes))


def _state(trace_state: Any) -> tuple[tuple[str, str], ...]:
    return tuple(trace_state.items()) if trace_state else ()


def _link_record(link: Any) -> tuple[Any, ...]:
    ctx = link.context
    return (ctx.trace_id, ctx.span_id, ctx.is_remote, int(ctx.trace_flags),
            _state(ctx.trace_state), _plain(link.attributes), link.dropped_attributes)


#: Enum values by member: a dict lookup, where ``.value`` is a Python-level descriptor.
_KIND_VALUE: dict[Any, int] = {k: k.value for k in SpanKind}
_CODE_VALUE: dict[Any, int] = {c: c.value for c in StatusCode}


def _event_entries(events: Any, full: bool) -> list[tuple[Any, ...]]:
    """``(name, timestamp, attributes)`` of every event, with ``dropped_attributes`` too
    when ``full`` (version 2)."""
    if full:
        return [(n, t, a if type(a) is dict else _plain(a), d)
                for n, t, a, d in events_fields(events)]
    return [(n, t, a if type(a) is dict else _plain(a)) for n, t, a, _ in events_fields(events)]


def _entries(s: ReadableSpan, events: Any, full: bool) -> tuple[Any, ...]:
    """A record's events. Round records nobody has built yet travel as records, each with
    the limits to build it with (a 3-tuple ``(record, max attributes, max length)``), among
    the span's other events, in order: the child builds them (~9 µs a round here, against
    ~1 µs to pack the record)."""
    deferred = _our_rounds(s)
    if deferred is None:
        return tuple(_event_entries(events, full))
    max_attrs, max_len = deferred.limits
    return tuple([(x, max_attrs, max_len) if type(x) is tuple
                  else _event_entries((x,), full)[0] for x in deferred.items()])


def _record_full(s: ReadableSpan, res_i: int, scope_i: int, service: str) -> tuple[Any, ...]:
    (ctx, parent, name, kind, start, end, status, attrs, dropped_attrs, events,
     dropped_events, links, dropped_links) = span_fields(s, deferred=True)
    state = ctx.trace_state if ctx is not None else None
    return (name, ctx.trace_id if ctx is not None else 0,
            ctx.span_id if ctx is not None else 0,
            parent.span_id if parent is not None else 0,
            _KIND_VALUE[kind], start or 0, end or 0,
            _CODE_VALUE[status.status_code], status.description,
            attrs if type(attrs) is dict else _plain(attrs),
            _entries(s, events, full=True),
            service, parent is not None and parent.is_remote,
            res_i, scope_i, int(ctx.trace_flags) if ctx is not None else 1,
            _state(state) if state else (),
            tuple([_link_record(link) for link in links]) if links else (),
            dropped_attrs, dropped_events, dropped_links)


def pack_spans_full(spans: Sequence[ReadableSpan]) -> tuple[bytes, list[ReadableSpan]]:
    """A version 2 frame (everything OTLP needs) for ``spans``, and the spans left out
    because a value could not be packed, or a time is outside ``[0, 2**64)`` ns (the
    caller counts them)."""
    resources: list[tuple[Any, ...]] = []
    scopes: list[tuple[Any, ...]] = []
    res_index: dict[int, int] = {}
    scope_index: dict[int, int] = {}
    records = []
    last_res: Any = object()
    last_scope: Any = object()
    res_i = scope_i = -1
    service = ""
    for s in spans:
        res = s.resource
        scope = s.instrumentation_scope
        if res is not last_res:
            last_res = res
            service = _service(res)
            found = res_index.get(id(res))
            if found is None:
                found = res_index[id(res)] = len(resources)
                resources.append(_cached_entry(_RES_ENTRIES, res, _resource_entry))
            res_i = found
        if scope is not last_scope:
            last_scope = scope
            if scope is None:
                scope_i = -1
            else:
                found = scope_index.get(id(scope))
                if found is None:
                    found = scope_index[id(scope)] = len(scopes)
                    scopes.append(_cached_entry(_SCOPE_ENTRIES, scope, _scope_entry))
                scope_i = found
        records.append(_record_full(s, res_i, scope_i, service))
    spans, records, bad_times = _split_bad_times(spans, records)
    try:
        return marshal.dumps((VERSION_FULL, records, resources, scopes)), bad_times
    except ValueError:  # find the culprits only when there are any
        kept, refused = [], []
        for span, rec in zip(spans, records, strict=True):
            try:
                marshal.dumps((rec, resources[rec[13]],
                               scopes[rec[14]] if rec[14] >= 0 else None))
                kept.append(rec)
            except ValueError:
                refused.append(span)
        # A table entry only a refused span used may itself be unpackable: replaced.
        safe_res = [e if _marshals(e) else ({}, "") for e in resources]
        safe_scopes = [e if _marshals(e) else ("", None, None, {}) for e in scopes]
        return marshal.dumps((VERSION_FULL, kept, safe_res, safe_scopes)), bad_times + refused


def _marshals(value: Any) -> bool:
    try:
        marshal.dumps(value)
    except ValueError:
        return False
    return True


@dataclass
class Unpacked:
    """The spans rebuilt from a frame and the events of the records that were refused."""

    spans: list[ReadableSpan] = field(default_factory=list)
    rejected_spans: int = 0
    rejected_events: int = 0
    first_error: str = ""


class FrameError(ValueError):
    """The frame as a whole cannot be read (its records are all lost)."""


def unpack_spans(data: bytes, *, check_records: bool = True) -> Unpacked:
    """The spans of a frame. A malformed record is refused and counted, not fatal.

    Round records are not built into events here: the OTLP encoder writes them straight
    from the record and the Rerun translations outline them (``round_outline``), so
    only a reader that needs a whole event builds one. Each is checked instead
    (:func:`~otel_proofscope.otlp.round_records.check`, ~1 µs against ~4 to build), so
    a bad one refuses its span here, not a batch later. ``check_records=False``: a frame
    whose records all passed once already (the export process's Rerun backlog reads its
    held frames again)."""
    try:
        version, records, *rest = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as exc:
        raise FrameError(f"span frame of {len(data)} bytes is unreadable: {exc}") from None
    if version not in (VERSION, VERSION_FULL) or not isinstance(records, list) \
            or (version == VERSION and rest):
        raise FrameError(f"span frame: version {version!r} (expected {VERSION} or "
                         f"{VERSION_FULL}) or records not a list")
    if version == VERSION_FULL:
        resources, scopes = _tables(rest)

        def make(r: Any) -> ReadableSpan:
            return _span_full(r, resources, scopes, check_records)
    else:
        make = _span
    out = Unpacked()
    for i, record in enumerate(records):
        try:
            out.spans.append(make(record))
        except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
            out.rejected_spans += 1
            if isinstance(record, tuple) and len(record) > 10 \
                    and isinstance(record[10], tuple):
                out.rejected_events += len(record[10])
            if not out.first_error:
                out.first_error = f"span record {i}: {exc}"
    return out


def _span(r: Any) -> ReadableSpan:
    if type(r) is not tuple or len(r) not in _RECORD_LENS:
        raise ValueError(f"expected a {_RECORD_LEN}-tuple, got {type(r).__name__}")
    (name, trace_id, span_id, parent_id, kind, start, end, code, description, attributes,
     events) = r[:11]
    service = r[11] if len(r) > 11 else ""
    remote = len(r) > 12 and r[12] is True

    if type(name) is not str or type(attributes) is not dict or type(events) is not tuple:
        raise TypeError("name, attributes or events has the wrong type")
    parent = SpanContext(trace_id, parent_id, remote, _SAMPLED) if parent_id else None
    if code == 0:
        status = _UNSET
    elif code == 1:
        status = _OK
    else:
        status = Status(StatusCode(code), description)
    return ReadableSpan(
        name, SpanContext(trace_id, span_id, False, _SAMPLED), parent, _resource(service),
        attributes, _bounded(_events_with_rounds(events, _event), 0), (), SpanKind(kind),
        None, status, start, end)


def _event(e: Any) -> Event:
    if type(e) is not tuple or len(e) != 3 or type(e[0]) is not str \
            or type(e[2]) is not dict:
        raise ValueError("an event is not a (name, timestamp, attributes) tuple")
    return Event(e[0], e[2], e[1])


def _tables(rest: list[Any]) -> tuple[list[Resource | None], list[InstrumentationScope | None]]:
    """A version 2 frame's resources and scopes, rebuilt once per distinct entry; an
    entry that cannot be rebuilt is None (the records naming it are refused)."""
    if len(rest) != 2 or type(rest[0]) is not list or type(rest[1]) is not list:
        raise FrameError("span frame: version 2 without its resource and scope tables")
    return ([_built(_RES_BUILT, e, _make_resource) for e in rest[0]],
            [_built(_SCOPES_BUILT, e, _make_scope) for e in rest[1]])


def _built(cache: dict[bytes, Any], entry: Any, make: Any) -> Any:
    try:
        key = marshal.dumps(entry)  # exact: {"a": 1} and {"a": True} stay apart
        hit = cache.get(key)
        if hit is None:
            hit = make(entry)
            if len(cache) >= _MAX_CACHED:
                cache.clear()
            cache[key] = hit
        return hit
    except Exception:  # whatever bytes arrive: the records naming it are refused
        return None


def _make_resource(e: Any) -> Resource:
    attrs, schema_url = e
    if type(attrs) is not dict or type(schema_url) is not str:
        raise TypeError("resource entry")
    return Resource(attrs, schema_url)


def _make_scope(e: Any) -> InstrumentationScope:
    name, version, schema_url, attrs = e
    if type(name) is not str or type(attrs) is not dict:
        raise TypeError("scope entry")
    return InstrumentationScope(name, version, schema_url, attrs)


_FLAGS = {0: TraceFlags(0), 1: _SAMPLED}


def _flags(value: Any) -> TraceFlags:
    hit = _FLAGS.get(value) if type(value) is int else None
    return hit if hit is not None else TraceFlags(value)


def _trace_state(pairs: Any) -> TraceState:
    if not pairs:
        return _NO_STATE
    if type(pairs) is not tuple:
        raise TypeError("trace_state is not a tuple of pairs")
    return TraceState(list(pairs))


def _attrs(values: Any, dropped: Any) -> Any:
    if type(values) is not dict:
        raise TypeError("attributes are not a dict")
    return bounded_attributes(values, dropped) if dropped else values


def _bounded(items: list[Any] | DeferredEvents, dropped: Any) -> Any:
    if type(items) is DeferredEvents:  # its drop count set where it was made
        return items
    if not dropped:
        return tuple(items)
    out: BoundedList[Any] = BoundedList(None)
    out.extend(items)
    out.dropped = int(dropped)
    return out


def _span_full(r: Any, resources: list[Resource | None],
               scopes: list[InstrumentationScope | None],
               check_records: bool = True) -> ReadableSpan:
    if type(r) is not tuple or len(r) != _FULL_RECORD_LEN:
        raise ValueError(f"expected a {_FULL_RECORD_LEN}-tuple, got {type(r).__name__}")
    (name, trace_id, span_id, parent_id, kind, start, end, code, description, attributes,
     events, _service_name, remote, res_i, scope_i, flags, state, links, dropped_attrs,
     dropped_events, dropped_links) = r
    if type(name) is not str or type(events) is not tuple or type(links) is not tuple:
        raise TypeError("name, events or links has the wrong type")
    if type(res_i) is not int or res_i < 0 or type(scope_i) is not int or scope_i < -1:
        raise ValueError("resource or scope index out of range")
    resource = resources[res_i]
    scope = scopes[scope_i] if scope_i >= 0 else None
    if resource is None or (scope_i >= 0 and scope is None):
        raise ValueError("the record's resource or scope entry is unreadable")
    trace_flags = _flags(flags)
    parent = SpanContext(trace_id, parent_id, remote is True, _SAMPLED) if parent_id else None
    if code == 0:
        status = _UNSET
    elif code == 1:
        status = _OK
    else:
        status = Status(StatusCode(code), description)
    evs = _events_with_rounds(events, _event_full, dropped_events, check_records)
    lks = [_link(lk) for lk in links]
    return ReadableSpan(
        name, SpanContext(trace_id, span_id, False, trace_flags, _trace_state(state)),
        parent, resource, _attrs(attributes, dropped_attrs), _bounded(evs, dropped_events),
        _bounded(lks, dropped_links), SpanKind(kind), None, status, start, end,
        instrumentation_scope=scope)


def _events_with_rounds(entries: tuple[Any, ...], read_event: Any,
                        dropped: Any = 0, check_records: bool = True) -> list[Any] | DeferredEvents:
    """A record's events (each read by ``read_event``). With round records, a deferred
    list like the sender's (its builder, its limits), whose records are checked here (a
    bad one refuses its span only) and read unbuilt by the OTLP encoder and the Rerun
    translations alike; an ``Event`` is built only for a reader that needs one."""
    items: list[Any] = []
    append = items.append
    limits: tuple[Any, Any] | None = None
    rounds = 0
    check = round_records.check if check_records else None
    # One pass, the round test inlined: a round-heavy frame holds thousands of entries.
    for e in entries:
        # A round record's entry: (record, max attributes, max length).
        if type(e) is tuple and len(e) == 3 and type(e[0]) is tuple:
            record = e[0]
            if limits is None:
                if not all(v is None or type(v) is int for v in e[1:]):
                    raise ValueError("a round record is not (record, max attributes, "
                                     "max length)")
                limits = (e[1], e[2])
            elif e[1] != limits[0] or e[2] != limits[1]:
                raise ValueError("round records of one span with different limits")
            if check is not None:
                check(record)
            elif not record or type(record[0]) is not int:
                raise ValueError("a round record is not (record, max attributes, "
                                 "max length)")
            append(record)
            rounds += 1
        else:
            append(read_event(e))
    if limits is None:
        return items
    deferred = DeferredEvents.rebuilt(items, round_records.round_event, *limits, _ROUND_NAME,
                                      records=rounds)
    deferred.dropped = int(dropped)
    return deferred


def _event_full(e: Any) -> Event:
    if type(e) is not tuple or len(e) != 4 or type(e[0]) is not str:
        raise ValueError("an event is not a (name, timestamp, attributes, dropped) tuple")
    return Event(e[0], _attrs(e[2], e[3]), e[1])


def _link(lk: Any) -> Link:
    if type(lk) is not tuple or len(lk) != 7:
        raise ValueError("a link is not a 7-tuple")
    trace_id, span_id, remote, flags, state, attrs, dropped = lk
    return Link(SpanContext(trace_id, span_id, remote is True, _flags(flags),
                            _trace_state(state)), _attrs(attrs, dropped))
