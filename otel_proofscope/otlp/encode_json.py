"""The OTLP/JSON span encoder of the JSON-lines files, written from the span fields.

Why: the upstream file exporter (``opentelemetry-exporter-otlp-json-file``) builds a
tree of generated message objects per batch, then a dict from them, then the JSON text:
~60 µs per span event on the 2-CPU CI VM, on an export thread that holds the GIL while
the prover waits for it. It also reads ``span.events``, which builds an SDK ``Event`` for
every sumcheck round still held as a record. Here the JSON text is written directly
from :mod:`otel_proofscope.otlp.sdk_fields` (round records read as fields).

:func:`encode_json_line` returns exactly the line the upstream exporter writes for the
same spans (``json.dumps(encode_spans(spans).to_dict(), separators=(",", ":"))``: the
same keys in the same order, the same values; the tests compare the text on random SDK
spans). Pure: no I/O.
"""

from __future__ import annotations

import base64
import logging
import math
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.otlp.encode import all_str, grouped
from otel_proofscope.otlp.sdk_fields import events_fields, plain_attributes, span_fields
from otel_proofscope.otlp.times import U64_MAX, InvalidSpan, check_times, ns

_log = logging.getLogger(__name__)

# JSON text is written directly, not built as dicts for json.dumps: a batch of 200
# layers of 32 rounds is ~80,000 dicts, and allocating that many tracked containers
# set off garbage collections that walked the prover's whole heap (measured: the dicts
# cost 21 µs a round, the text ~4). Strings are escaped by the json module's own C
# function, so the text is what json.dumps(..., separators=(",", ":")) writes.
_esc = encode_basestring_ascii

# Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE, | IS_REMOTE for a remote parent or link.
_FLAGS_LOCAL = '"flags":256'
_FLAGS_REMOTE = '"flags":768'
_KEY_CACHE_MAX = 4096
_KEYS: dict[str, str] = {}


def _any_value(value: Any) -> str:
    """An ``AnyValue`` as the upstream ``_encode_value`` + ``to_dict`` write it (its type
    order; raises where it raises)."""
    if value is None:
        return "{}"
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, str):
        return '{"stringValue":' + _esc(value) + "}"
    if isinstance(value, int):
        return '{"intValue":"' + int.__repr__(value) + '"}'
    if isinstance(value, float):
        if math.isnan(value):
            return '{"doubleValue":"NaN"}'
        if math.isinf(value):
            return '{"doubleValue":"Infinity"}' if value > 0 else '{"doubleValue":"-Infinity"}'
        return '{"doubleValue":' + float.__repr__(value) + "}"
    if isinstance(value, bytes):
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    if isinstance(value, Sequence):
        if not value:
            return '{"arrayValue":{}}'
        return '{"arrayValue":{"values":[' + ",".join([_any_value(v) for v in value]) + "]}}"
    if isinstance(value, Mapping):
        if not value:
            return '{"kvlistValue":{}}'
        return ('{"kvlistValue":{"values":['
                + ",".join([_key_value(str(k), v) for k, v in value.items()]) + "]}}")
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_head(key: str) -> str:
    """``{"key":"…","value":`` for a key (cached: the same few keys repeat)."""
    head = _KEYS.get(key)
    if head is None:
        head = '{"key":' + _esc(key) + ',"value":' if key else '{"value":'
        if len(_KEYS) >= _KEY_CACHE_MAX:
            _KEYS.clear()
        _KEYS[key] = head
    return head


def _key_value(key: str, value: Any) -> str:
    return _key_head(key) + _any_value(value) + "}"


def _attributes(attributes: Mapping[str, Any] | None) -> str:
    """The ``KeyValue`` list of an attribute mapping (empty: ""); an attribute the
    upstream encoder cannot encode is logged and skipped, as it does."""
    if not attributes:
        return ""
    out: list[str] = []
    append = out.append
    for key, value in plain_attributes(attributes).items():
        vt = type(value)
        try:
            head = _KEYS.get(key) or _key_head(key)
            # The common cases inline (a round's strings, ints and string tuples).
            if vt is str:
                append(head + '{"stringValue":' + _esc(value) + "}}")
            elif vt is int:
                append(head + '{"intValue":"' + int.__repr__(value) + '"}}')
            elif vt is tuple and value and all_str(value):
                append(head + '{"arrayValue":{"values":[{"stringValue":'
                       + '},{"stringValue":'.join(map(_esc, value)) + "}]}}}")
            else:
                append(head + _any_value(value) + "}")
        except Exception as error:
            _log.exception("Failed to encode key %s: %s", key, error)
    return "[" + ",".join(out) + "]" if out else ""


def _add_attributes(parts: list[str], attrs: Mapping[str, Any] | None, dropped: int) -> None:
    """The ``attributes`` and ``droppedAttributesCount`` fields, each when not empty."""
    encoded = _attributes(attrs)
    if encoded:
        parts.append('"attributes":' + encoded)
    if dropped:
        parts.append('"droppedAttributesCount":' + int.__repr__(dropped))


def _span(span: ReadableSpan) -> str:
    (ctx, parent, name, kind, start, end, status, attrs, dropped_attrs, events,
     dropped_events, links, dropped_links) = span_fields(span, deferred=True)
    parts = ['{"traceId":"' + (ctx.trace_id if ctx else 0).to_bytes(16, "big").hex()
             + '","spanId":"' + (ctx.span_id if ctx else 0).to_bytes(8, "big").hex() + '"']
    trace_state = ctx.trace_state if ctx else None
    if trace_state:
        parts.append('"traceState":'
                     + _esc(",".join([f"{k}={v}" for k, v in trace_state.items()])))
    if parent:
        parts.append('"parentSpanId":"' + parent.span_id.to_bytes(8, "big").hex() + '"')
    parts.append(_FLAGS_REMOTE if parent and parent.is_remote else _FLAGS_LOCAL)
    if name:
        parts.append('"name":' + _esc(name))
    parts.append(_KIND[kind])  # SpanKind.INTERNAL (0) is SPAN_KIND_INTERNAL (1)
    # JSON would write any integer (or a float): the range OTLP allows is checked here,
    # the span refused alone when a time falls outside it (see otlp/times.py).
    if start:
        if type(start) is not int or not 0 <= start <= U64_MAX:
            start = _checked(span, start)
        parts.append('"startTimeUnixNano":"' + int.__repr__(start) + '"')
    if end:
        if type(end) is not int or not 0 <= end <= U64_MAX:
            end = _checked(span, end)
        parts.append('"endTimeUnixNano":"' + int.__repr__(end) + '"')
    _add_attributes(parts, attrs, dropped_attrs)
    json_events = []
    for ev_name, ts, ev_attrs, ev_dropped in events_fields(events):
        ev = []
        if ts:
            if type(ts) is not int or not 0 <= ts <= U64_MAX:
                ts = _checked(span, ts)
            ev.append('"timeUnixNano":"' + int.__repr__(ts) + '"')
        if ev_name:
            ev.append('"name":' + _esc(ev_name))
        _add_attributes(ev, ev_attrs, ev_dropped)
        json_events.append("{" + ",".join(ev) + "}")
    if json_events:
        parts.append('"events":[' + ",".join(json_events) + "]")
    if dropped_events:
        parts.append('"droppedEventsCount":' + int.__repr__(dropped_events))
    if links:
        json_links = [_link(link) for link in links]
        if json_links:
            parts.append('"links":[' + ",".join(json_links) + "]")
    if dropped_links:
        parts.append('"droppedLinksCount":' + int.__repr__(dropped_links))
    if status is not None:
        st = []
        if status.description:
            st.append('"message":' + _esc(status.description))
        if status.status_code.value:
            st.append('"code":' + int.__repr__(status.status_code.value))
        parts.append('"status":{' + ",".join(st) + "}")
    return ",".join(parts) + "}"


def _checked(span: ReadableSpan, value: Any) -> int:
    """``value`` as an int when it is a time OTLP can carry (a numpy integer), else
    :class:`InvalidSpan` naming the span's bad time."""
    try:
        checked = ns(value)
    except TypeError:
        checked = -1
    if 0 <= checked <= U64_MAX:
        return checked
    fields = span_fields(span, deferred=True)
    check_times(fields[2], fields[4], fields[5],
                [ts for _, ts, _, _ in events_fields(fields[9])])
    raise InvalidSpan(f"span {fields[2]!r}: time {value!r} cannot be written")


def _link(link: Any) -> str:
    ctx = link.context
    parts = ['{"traceId":"' + ctx.trace_id.to_bytes(16, "big").hex()
             + '","spanId":"' + ctx.span_id.to_bytes(8, "big").hex() + '"']
    _add_attributes(parts, link.attributes, link.dropped_attributes)
    parts.append(_FLAGS_REMOTE if ctx.is_remote else _FLAGS_LOCAL)
    return ",".join(parts) + "}"


def _scope(scope: Any) -> str:
    if scope is None:
        return "{}"
    parts = []
    if scope.name:
        parts.append('"name":' + _esc(scope.name))
    if scope.version:
        parts.append('"version":' + _esc(scope.version))
    encoded = _attributes(scope.attributes)
    if encoded:
        parts.append('"attributes":' + encoded)
    return "{" + ",".join(parts) + "}"


def _build_kinds() -> dict[Any, str]:
    from opentelemetry.trace import SpanKind

    return {kind: '"kind":' + int.__repr__(kind.value + 1) for kind in SpanKind}


_KIND = _build_kinds()


def encode_json_line(spans: Sequence[ReadableSpan],
                     refused: list[ReadableSpan] | None = None) -> str | None:
    """One JSON line (with its newline) for ``spans``, as the upstream file exporter
    writes it: grouped by resource, then scope, in first-seen order; None when there is
    nothing to write. A span with a time OTLP cannot carry is left out (appended to
    ``refused``, for the caller to count)."""
    groups = grouped(spans, _span, refused)
    if not groups:
        return None
    resource_spans = []
    for resource, by_scope in groups.items():
        scope_spans = []
        for scope, json_spans in by_scope.items():
            entry = '{"scope":' + _scope(scope) + ',"spans":[' + ",".join(json_spans) + "]"
            if scope is not None and scope.schema_url:
                entry += ',"schemaUrl":' + _esc(scope.schema_url)
            scope_spans.append(entry + "}")
        encoded = _attributes(resource.attributes)
        rs = ('{"resource":' + ('{"attributes":' + encoded + "}" if encoded else "{}")
              + ',"scopeSpans":[' + ",".join(scope_spans) + "]")
        if resource.schema_url:
            rs += ',"schemaUrl":' + _esc(resource.schema_url)
        resource_spans.append(rs + "}")
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}\n"
