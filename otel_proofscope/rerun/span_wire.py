"""Compact span frames for the out-of-process Rerun translation.

The child (:mod:`otel_proofscope.rerun.worker`) needs only what the translation reads:
name, ids, times, status, kind, attributes and events. OTLP protobuf carried that at
~185 µs per span of Python in the child (protobuf field access per ``AnyValue``) and
~15 µs in the parent; :mod:`marshal` of plain tuples costs a few µs on both sides, in C.
:mod:`marshal` (not :mod:`pickle`) because it builds only plain data on load: a frame
can never construct objects or run code, whatever bytes arrive.

A frame is ``marshal.dumps((VERSION, records))``; a record is the tuple
``(name, trace_id, span_id, parent_span_id, kind, start, end, status_code,
status_description, attributes, events)`` with ``parent_span_id`` 0 for a root and
``events`` a tuple of ``(name, timestamp, attributes)``.
"""

from __future__ import annotations

import marshal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otel_proofscope.otlp.sdk_fields import (
    FIELDS_OK,
    events_fields,
    plain_attributes,
    span_fields,
)

VERSION = 1
_RECORD_LEN = 11
_EMPTY_RESOURCE = Resource({})
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
            tuple((e.name, e.timestamp, _plain(e.attributes)) for e in s.events))


def _record_fast(s: ReadableSpan) -> tuple[Any, ...]:
    # The fields come from sdk_fields: the public properties copy the attributes (a
    # MappingProxy) and the events (a tuple) of every span, which doubles the cost on
    # the exporter thread, where it competes with the prover for the GIL.
    (ctx, parent, name, kind, start, end, status, attrs, _, events, _, _, _) = span_fields(s)
    return (name, ctx.trace_id if ctx is not None else 0,
            ctx.span_id if ctx is not None else 0,
            parent.span_id if parent is not None else 0,
            kind.value, start or 0, end or 0,
            status.status_code.value, status.description,
            attrs if type(attrs) is dict else _plain(attrs),
            tuple([(n, t, a if type(a) is dict else _plain(a))
                   for n, t, a, _ in events_fields(events)]))


def pack_spans(spans: Sequence[ReadableSpan]) -> tuple[bytes, list[ReadableSpan]]:
    """One frame for ``spans``, and the spans left out of it because a value could not
    be packed (never one the SDK's own validation lets through; the caller counts them)."""
    records = [_record_fast(s) for s in spans]
    try:
        return marshal.dumps((VERSION, records)), []
    except ValueError:  # find the culprits only when there are any
        kept, refused = [], []
        for span, rec in zip(spans, records, strict=True):
            try:
                marshal.dumps(rec)
                kept.append(rec)
            except ValueError:
                refused.append(span)
        return marshal.dumps((VERSION, kept)), refused


@dataclass
class Unpacked:
    """The spans rebuilt from a frame and the events of the records that were refused."""

    spans: list[ReadableSpan] = field(default_factory=list)
    rejected_spans: int = 0
    rejected_events: int = 0
    first_error: str = ""


class FrameError(ValueError):
    """The frame as a whole cannot be read (its records are all lost)."""


def unpack_spans(data: bytes) -> Unpacked:
    """The spans of a frame. A malformed record is refused and counted, not fatal."""
    try:
        version, records = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as exc:
        raise FrameError(f"span frame of {len(data)} bytes is unreadable: {exc}") from None
    if version != VERSION or not isinstance(records, list):
        raise FrameError(f"span frame: version {version!r} (expected {VERSION}) or "
                         f"records not a list")
    out = Unpacked()
    for i, record in enumerate(records):
        try:
            out.spans.append(_span(record))
        except (TypeError, ValueError, IndexError) as exc:
            out.rejected_spans += 1
            if isinstance(record, tuple) and len(record) == _RECORD_LEN \
                    and isinstance(record[10], tuple):
                out.rejected_events += len(record[10])
            if not out.first_error:
                out.first_error = f"span record {i}: {exc}"
    return out


def _span(r: Any) -> ReadableSpan:
    if type(r) is not tuple or len(r) != _RECORD_LEN:
        raise ValueError(f"expected a {_RECORD_LEN}-tuple, got {type(r).__name__}")
    (name, trace_id, span_id, parent_id, kind, start, end, code, description, attributes,
     events) = r
    if type(name) is not str or type(attributes) is not dict or type(events) is not tuple:
        raise TypeError("name, attributes or events has the wrong type")
    parent = SpanContext(trace_id, parent_id, True, _SAMPLED) if parent_id else None
    if code == 0:
        status = _UNSET
    elif code == 1:
        status = _OK
    else:
        status = Status(StatusCode(code), description)
    return ReadableSpan(
        name, SpanContext(trace_id, span_id, False, _SAMPLED), parent, _EMPTY_RESOURCE,
        attributes, tuple(_event(e) for e in events), (), SpanKind(kind), None, status,
        start, end)


def _event(e: Any) -> Event:
    if type(e) is not tuple or len(e) != 3 or type(e[0]) is not str \
            or type(e[2]) is not dict:
        raise ValueError("an event is not a (name, timestamp, attributes) tuple")
    return Event(e[0], e[2], e[1])
