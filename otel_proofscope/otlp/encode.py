"""The OTLP span encoder: ``ExportTraceServiceRequest`` bytes written directly.

Why: the official encoder (``encode_spans`` building protobuf message objects, then
``SerializeToString``) costs ~25 µs per prover span. It runs on the export thread, but
that thread holds the GIL while it encodes, so the prover thread (pure Python) pays for
it: the pipeline measured 1.6–2.1x the discarding baseline with it. Writing the wire
format straight into ``bytes`` with caches for the repeated parts (attribute keys,
``(key, value)`` pairs, names, resource, scope) costs a fraction of that.

:func:`encode_export_request` produces the same ``ExportTraceServiceRequest`` as
``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`` (the tests parse
ours and compare it with theirs on random SDK spans), field for field and in the same
field order, so the bytes are normally identical too. Pure: no I/O, no SDK state; the
span fields come from :mod:`otel_proofscope.otlp.sdk_fields`.
"""

from __future__ import annotations

import itertools
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.sdk_fields import (
    event_fields,
    events_fields,
    plain_attributes,
    span_fields,
)
from otel_proofscope.otlp.times import InvalidSpan, check_times

_log = logging.getLogger(__name__)
T = TypeVar("T")

# ── wire-format primitives ───────────────────────────────────────────────────────────

_U64 = (1 << 64) - 1
_VARINT_TABLE_SIZE = 1 << 14


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Lengths and small ints are looked up, not computed: most fit in two bytes.
_VT: list[bytes] = [_varint_slow(i) for i in range(_VARINT_TABLE_SIZE)]


def _varint(n: int) -> bytes:
    return _VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)


def _ld(data: bytes) -> bytes:
    """Length-delimited payload (length prefix + data), without the field tag."""
    n = len(data)
    return (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)) + data


_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<BQ").pack  # (tag, value): a one-byte tag and a fixed64
_pack_fixed32_flags = struct.Struct("<I").pack
_pack_times = struct.Struct("<BQBQ").pack  # span start (field 7) and end (field 8)

# Span.flags (field 16, fixed32): SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE, | IS_REMOTE if remote.
_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32_flags(0x100)
_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32_flags(0x300)
_LINK_FLAGS_LOCAL = b"\x35" + _pack_fixed32_flags(0x100)  # Link.flags is field 6
_LINK_FLAGS_REMOTE = b"\x35" + _pack_fixed32_flags(0x300)

# ── AnyValue / KeyValue (exactly the official _encode_value's type order) ─────────────


def _any_value(value: Any) -> bytes:
    """Body of an ``AnyValue`` message; raises where the official encoder raises."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return b"\x0a" + _ld(value.encode("utf-8"))
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"Value out of range: {value}")
        return b"\x18" + _varint(int(value) & _U64)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return b"\x3a" + _ld(bytes(value))
    if isinstance(value, Sequence):
        body = b"".join([b"\x0a" + _ld(_any_value(v)) for v in value])
        return b"\x2a" + _ld(body)
    if isinstance(value, Mapping):
        body = b"".join([b"\x0a" + _ld(_key_value(str(k), v)) for k, v in value.items()])
        return b"\x32" + _ld(body)
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: Any) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"attribute key {key!r} is not a str")
    kb = key.encode("utf-8")
    head = b"\x0a" + _ld(kb) if kb else b""
    return head + b"\x12" + _ld(_any_value(value))


# Bounded caches of encoded attributes, keyed by (key, value, type(value)) so that
# True, 1 and 1.0 (equal and equally hashed) never share an entry. Floats are never
# cached (0.0 == -0.0, NaN != NaN); tuples only when every element is exactly a str
# (equality with an all-str tuple then implies the same encoding) or exactly an int
# (a hit is re-checked, since (1, True) == (1, 1)). Full caches are emptied, not
# grown: losing an entry only costs a re-encode.
_KV_CACHE_MAX = 8192
_CACHEABLE_STR_LEN = 512
_KV_CACHE: dict[tuple[Any, Any, type], bytes] = {}
_INT_TUPLE_CACHE: dict[tuple[Any, Any], bytes] = {}
_NAME_CACHE_MAX = 4096
_SPAN_NAME_CACHE: dict[str, bytes] = {}
_EVENT_NAME_CACHE: dict[str, bytes] = {}
_NAME_CACHES = {b"\x2a": _SPAN_NAME_CACHE, b"\x12": _EVENT_NAME_CACHE}


_KEY_CACHE: dict[str, bytes] = {}


def _key_prefix(key: Any) -> bytes:
    """The ``KeyValue.key`` field (tag, length, UTF-8), cached per key."""
    encoded = _KEY_CACHE.get(key)
    if encoded is None:
        if not isinstance(key, str):
            raise TypeError(f"attribute key {key!r} is not a str")
        kb = key.encode("utf-8")
        encoded = b"\x0a" + _ld(kb) if kb else b""
        if len(kb) <= _CACHEABLE_STR_LEN:
            if len(_KEY_CACHE) >= _NAME_CACHE_MAX:
                _KEY_CACHE.clear()
            _KEY_CACHE[key] = encoded
    return encoded


def _kv_miss(key: Any, value: Any) -> bytes | None:
    """Encode one attribute (length-prefixed KeyValue); None if the official encoder
    would skip it (it logs and drops attributes it cannot encode)."""
    vt = type(value)
    try:
        if vt is str:
            vb = value.encode("utf-8")
            n = len(vb)
            any_value = b"\x0a" + (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)) + vb
        elif vt is tuple and all_str(value):  # a round's polynomial, a list of names
            any_value = b"\x2a" + _ld(_str_array_body(value))
        else:
            any_value = _any_value(value)
        n = len(any_value)
        body = (_key_prefix(key) + b"\x12"
                + (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)) + any_value)
    except Exception as error:
        _log.exception("Failed to encode key %s: %s", key, error)
        return None
    n = len(body)
    encoded: bytes = (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)) + body
    if vt is tuple:
        if len(value) > 64 or len(encoded) > 4 * _CACHEABLE_STR_LEN:
            return encoded
        if all_str(value):
            cache: dict[Any, bytes] = _KV_CACHE
            ckey: Any = (key, value, tuple)
        elif all(type(v) is int for v in value):
            cache, ckey = _INT_TUPLE_CACHE, (key, value)
        else:
            return encoded
    elif vt is float or (vt is str and len(value) > _CACHEABLE_STR_LEN):
        return encoded
    else:
        cache, ckey = _KV_CACHE, (key, value, vt)
    if len(cache) >= _KV_CACHE_MAX:
        _evict(cache)
    if key in _SAMPLED_KEYS and next(_sampled_misses) % _SAMPLE_EVERY:
        return encoded
    # Not contextlib.suppress: entering it cost more than the insertion (every miss).
    try:  # noqa: SIM105
        cache[ckey] = encoded
    except TypeError:  # unhashable (holds a mapping): not cached
        pass
    return encoded


# Keys whose values hardly repeat (a round's claim, challenge, polynomial): caching every
# value costs an insertion each and, every few thousand rounds, the whole cache. The key
# that filled most of a full cache is sampled from then on: one of its values in
# _SAMPLE_EVERY is cached, so a value that does repeat is still cached after a few
# sightings, and values that never repeat fill the cache that many times more slowly.
_SAMPLED_KEYS: set[str] = set()
_SAMPLED_KEYS_MAX = 256
_SAMPLE_EVERY = 16
_sampled_misses = itertools.count(1)


def _evict(cache: dict[Any, bytes]) -> None:
    """Empty a full cache, and sample the values of a key that held more than a
    quarter of it."""
    counts: dict[Any, int] = {}
    for ckey in cache:
        counts[ckey[0]] = counts.get(ckey[0], 0) + 1
    for key, held in counts.items():
        if held > len(cache) // 4 and len(_SAMPLED_KEYS) < _SAMPLED_KEYS_MAX:
            _SAMPLED_KEYS.add(key)
    cache.clear()


def all_str(values: tuple[Any, ...]) -> bool:
    """Whether every item is a ``str`` (exactly)."""
    # A loop, not all() over a generator: a third of the cost on a round's 3-tuple.
    for v in values:  # noqa: SIM110
        if type(v) is not str:
            return False
    return True


def _str_array_body(values: tuple[str, ...]) -> bytes:
    """``ArrayValue`` body of strings: each an ``AnyValue`` holding ``string_value``,
    what ``_any_value`` writes for them, without its type dispatch per element."""
    parts: list[bytes] = []
    append = parts.append
    for v in values:
        vb = v.encode("utf-8")
        n = len(vb)
        if n < 126:  # both lengths are one byte
            append(b"\x0a" + _VT[n + 2] + b"\x0a" + _VT[n] + vb)
        else:
            append(b"\x0a" + _ld(b"\x0a" + _ld(vb)))
    return b"".join(parts)


def _kvs_slow(attributes: Mapping[str, Any]) -> list[bytes]:
    out = []
    for key, value in attributes.items():
        encoded = _kv_miss(key, value)
        if encoded is not None:
            out.append(encoded)
    return out


def _kvs(attributes: Mapping[str, Any] | None) -> list[bytes]:
    """Length-prefixed KeyValues of an attribute mapping, in its order."""
    if not attributes:
        return []
    plain: Any = plain_attributes(attributes)
    out: list[bytes] = []
    append = out.append
    get = _KV_CACHE.get
    get_int_tuple = _INT_TUPLE_CACHE.get
    try:
        for key, value in plain.items():
            vt = type(value)
            encoded = get((key, value, vt))
            if encoded is None:
                if vt is tuple:
                    encoded = get_int_tuple((key, value))
                    if encoded is not None and not all(type(v) is int for v in value):
                        encoded = None
                if encoded is None:
                    encoded = _kv_miss(key, value)
                    if encoded is None:
                        continue
            append(encoded)
    except TypeError:  # an unhashable value: no cache lookups for this mapping
        return _kvs_slow(plain)
    return out


def _name_field(tag: bytes, name: str) -> bytes:
    """A cached string field (span and event names repeat endlessly)."""
    if not name:
        return b""
    cache = _NAME_CACHES[tag]
    encoded = cache.get(name)
    if encoded is None:
        encoded = tag + _ld(name.encode("utf-8"))
        if len(name) <= _CACHEABLE_STR_LEN:
            if len(cache) >= _NAME_CACHE_MAX:
                cache.clear()
            cache[name] = encoded
    return encoded


def _str_field(tag: bytes, value: str | None) -> bytes:
    if not value:
        return b""
    return tag + _ld(value.encode("utf-8"))


def _uint_field(tag: bytes, value: int | None) -> bytes:
    if not value:
        return b""
    return tag + _varint(value)


def _attributes_field(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    parts = _kvs(attributes)
    return tag + tag.join(parts) if parts else b""


# ── resource, scope, span ─────────────────────────────────────────────────────────────


def _resource_body(resource: Any) -> bytes:
    return _attributes_field(b"\x0a", resource.attributes)


def _scope_body(scope: Any) -> bytes:
    if scope is None:
        return b""
    return (_str_field(b"\x0a", scope.name) + _str_field(b"\x12", scope.version)
            + _attributes_field(b"\x1a", scope.attributes))


def _status_field(status: Any) -> bytes:
    if status is None:
        return b""
    code = status.status_code.value
    body = _str_field(b"\x12", status.description) + (b"\x18" + _varint(code) if code else b"")
    return b"\x7a" + _ld(body)


def _trace_state_field(tag: bytes, trace_state: Any) -> bytes:
    if trace_state is None:
        return b""
    return _str_field(tag, ",".join([f"{k}={v}" for k, v in trace_state.items()]))


def _link_field(link: Any) -> bytes:
    ctx = link.context
    body = (b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big") + b"\x12\x08"
            + ctx.span_id.to_bytes(8, "big") + _attributes_field(b"\x22", link.attributes)
            + _uint_field(b"\x28", link.dropped_attributes)
            + (_LINK_FLAGS_REMOTE if ctx.is_remote else _LINK_FLAGS_LOCAL))
    return b"\x6a" + _ld(body)


def _encode_span(span: ReadableSpan) -> bytes:
    """One ``Span`` message body (without tag and length)."""
    (ctx, parent, name, kind, start, end, status, attrs, dropped_attrs, events,
     dropped_events, links, dropped_links) = span_fields(span, deferred=True)

    parts = [b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big") + b"\x12\x08"
             + ctx.span_id.to_bytes(8, "big")]
    trace_state = ctx.trace_state
    if trace_state:
        parts.append(_trace_state_field(b"\x1a", trace_state))
    if parent:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    encoded = _SPAN_NAME_CACHE.get(name)
    parts.append(encoded if encoded is not None else _name_field(b"\x2a", name))
    parts.append(_KIND[kind])
    if start and end:
        parts.append(_pack_times(0x39, start, 0x41, end))
    else:
        if start:
            parts.append(_pack_fixed64(0x39, start))
        if end:
            parts.append(_pack_fixed64(0x41, end))
    if attrs:
        kvs = _kvs(attrs)
        if kvs:
            parts.append(b"\x4a" + b"\x4a".join(kvs))
    if dropped_attrs:
        parts.append(b"\x50" + _varint(dropped_attrs))

    # Events inline, with the attribute cache lookups of _kvs repeated here rather
    # than called: a prover span carries many events, and a call per event measured
    # ~25% of the encoder's time per span. Records a registered encoder wrote are
    # bodies already (bytes).
    kv_get = _KV_CACHE.get
    int_tuple_get = _INT_TUPLE_CACHE.get
    event_name_get = _EVENT_NAME_CACHE.get
    for item in _encoded_records(events) or events_fields(events):
        if type(item) is bytes:
            n = len(item)
            parts.append(b"\x5a" + (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n))
                         + item)
            continue
        ev_name, ts, ev_attrs, ev_dropped = item
        ev_parts = []
        if ts:
            ev_parts.append(_pack_fixed64(0x09, ts))
        if ev_name:
            encoded = event_name_get(ev_name)
            if encoded is None:
                encoded = _name_field(b"\x12", ev_name)
            ev_parts.append(encoded)
        if ev_attrs:
            kvs = []
            try:
                for key, value in ev_attrs.items():
                    vt = type(value)
                    encoded = kv_get((key, value, vt))
                    if encoded is None:
                        if vt is tuple:
                            encoded = int_tuple_get((key, value))
                            if encoded is not None and not all(type(v) is int for v in value):
                                encoded = None
                        if encoded is None:
                            encoded = _kv_miss(key, value)
                            if encoded is None:
                                continue
                    kvs.append(encoded)
            except TypeError:  # an unhashable value
                kvs = _kvs_slow(ev_attrs)
            if kvs:
                ev_parts.append(b"\x1a" + b"\x1a".join(kvs))
        if ev_dropped:
            ev_parts.append(b"\x20" + _varint(ev_dropped))
        body = b"".join(ev_parts)
        n = len(body)
        parts.append(b"\x5a" + (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)) + body)

    if dropped_events:
        parts.append(b"\x60" + _varint(dropped_events))
    for link in links:
        parts.append(_link_field(link))
    if dropped_links:
        parts.append(b"\x70" + _varint(dropped_links))
    if status is not None:
        encoded = _STATUS.get((status.status_code, status.description))
        if encoded is None:
            encoded = _status_field(status)
        parts.append(encoded)
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


# ── deferred event records ───────────────────────────────────────────────────────────

#: ``record -> Event message body`` (what the event its builder builds encodes to).
RecordEncoder = Callable[[tuple[Any, ...]], bytes]
#: Encoders of a deferred list's records, by the builder that builds them, each with the
#: most attributes such an event has.
_RECORD_ENCODERS: dict[Any, tuple[RecordEncoder, int]] = {}


def register_record_encoder(build: Any, encode: RecordEncoder, max_attributes: int) -> None:
    """Encode the records ``build`` builds with ``encode``, straight from the record.

    Why: a sumcheck round's event is built (its coefficients as canonical strings in a
    new dict) only to be encoded once, and its values never repeat, so the attribute
    caches only cost there. ``encode`` must give exactly the bytes the built event
    encodes to (a test compares them); it may raise, and the span is then encoded from
    the built events, as without it. Used only where the SDK's limits cannot change such
    an event: no length limit, and ``max_attributes`` or more allowed."""
    _RECORD_ENCODERS[build] = (encode, max_attributes)


def _encoded_records(events: Any) -> list[Any] | None:
    """The events as ``_encode_span`` reads them, each record a body written by its
    encoder; None where that does not apply (not a deferred list, no encoder for its
    builder, limits that could change an event, or fields built already: read those)."""
    if type(events) is not DeferredEvents:
        return None
    entry = _RECORD_ENCODERS.get(events.builder)
    if entry is None or events.fields_if_built() is not None:
        return None
    encode, max_attributes = entry
    max_attrs, max_len = events.limits
    if max_len is not None or (max_attrs is not None and max_attrs < max_attributes):
        return None
    try:
        return [encode(x) if type(x) is tuple else event_fields(x) for x in events.items()]
    except Exception:  # a record it cannot write: the built events decide
        return None


# The wire primitives a record encoder writes with (``otlp.round_records``).
VARINTS = _VT
varint = _varint
length_delimited = _ld
key_field = _key_prefix


def int_value(value: int) -> bytes:
    """``AnyValue`` body of an ``int``; raises where the official encoder skips it."""
    if type(value) is not int or not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"not an int64: {value!r}")
    return b"\x18" + _varint(value & _U64)


def str_value(value: str) -> bytes:
    """``AnyValue`` body of a ``str``."""
    if type(value) is not str:
        raise TypeError(f"not a str: {value!r}")
    return b"\x0a" + _ld(value.encode("utf-8"))


def event_name_field(name: str) -> bytes:
    """An event body's name field, as ``_encode_span`` writes it."""
    return _name_field(b"\x12", name)


def pack_timestamp(timestamp: int) -> bytes:
    """An event body's timestamp field (raises ``struct.error`` outside ``[0, 2**64)``:
    the span is then refused, as ``_span_field`` refuses it)."""
    return _pack_fixed64(0x09, timestamp)


def _build_kind_table() -> dict[Any, bytes]:
    from opentelemetry.trace import SpanKind, StatusCode

    kinds = {kind: b"\x30" + _varint(kind.value + 1) for kind in SpanKind}
    # Statuses without a description are shared constants.
    for code in StatusCode:
        _STATUS[(code, None)] = b"\x7a" + _ld(b"\x18" + _varint(code.value) if code.value else b"")
    return kinds


_STATUS: dict[tuple[Any, str | None], bytes] = {}
_KIND = _build_kind_table()


def grouped(spans: Sequence[ReadableSpan], encode: Callable[[ReadableSpan], T],
            refused: list[ReadableSpan] | None = None) -> dict[Any, dict[Any, list[T]]]:
    """``encode(span)`` of every span, grouped by resource, then instrumentation scope
    (``None`` for none), in first-seen order, as the official encoders group them.

    A span ``encode`` refuses (:class:`InvalidSpan`: a time OTLP cannot carry) is left
    out and appended to ``refused`` for the caller to count; the rest of the batch is
    encoded as if it had not been there."""
    # The same (equality-based) keys as the official encoders; identity checks first so
    # the costly Resource hash runs once per distinct object.
    groups: dict[Any, dict[Any, list[T]]] = {}
    last_resource: Any = object()
    last_scope: Any = object()
    current: list[T] = []
    for span in spans:
        try:
            encoded = encode(span)
        except InvalidSpan as error:
            if refused is not None:
                refused.append(span)
            _log.debug("span refused: %s", error)
            continue
        resource = span.resource
        scope = span.instrumentation_scope
        if resource is not last_resource or scope is not last_scope:
            current = groups.setdefault(resource, {}).setdefault(scope or None, [])
            last_resource, last_scope = resource, scope
        current.append(encoded)
    return groups


def _span_field(span: ReadableSpan) -> bytes:
    try:
        body = _encode_span(span)
    except struct.error:
        # Only the fixed64 times are packed with struct: free on the good path, and the
        # check names the culprit when one did not fit.
        _refuse(span)
    n = len(body)
    return b"\x12" + (_VT[n] if n < _VARINT_TABLE_SIZE else _varint_slow(n)) + body


def _refuse(span: ReadableSpan) -> NoReturn:
    """Raise :class:`InvalidSpan` naming the time of ``span`` that OTLP cannot carry."""
    fields = span_fields(span, deferred=True)
    check_times(fields[2], fields[4], fields[5],
                [ts for _, ts, _, _ in events_fields(fields[9])])
    raise InvalidSpan(f"span {fields[2]!r} could not be encoded")


def encode_export_request(spans: Sequence[ReadableSpan],
                          refused: list[ReadableSpan] | None = None) -> bytes:
    """Serialized ``ExportTraceServiceRequest`` for ``spans``, grouped by resource, then
    instrumentation scope, in first-seen order (as the official encoder groups them).

    A span with a time OTLP cannot carry is left out (appended to ``refused``, for the
    caller to count); b"" when no span is left."""
    groups = grouped(spans, _span_field, refused)

    out: list[bytes] = []
    for resource, by_scope in groups.items():
        rs_parts = [b"\x0a" + _ld(_resource_body(resource))]
        for scope, encoded_spans in by_scope.items():
            ss = (b"\x0a" + _ld(_scope_body(scope)) + b"".join(encoded_spans)
                  + _str_field(b"\x1a", scope.schema_url if scope is not None else None))
            rs_parts.append(b"\x12" + _ld(ss))
        rs_parts.append(_str_field(b"\x1a", resource.schema_url))
        out.append(b"\x0a" + _ld(b"".join(rs_parts)))
    return b"".join(out)


def encode_metrics_request(metrics_data: Any) -> bytes:
    """Serialized ``ExportMetricsServiceRequest`` for SDK ``MetricsData``.

    The official encoder, through its public module: metrics are low volume (one batch
    per collection interval), so its cost does not matter.
    """
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    return encode_metrics(metrics_data).SerializeToString()  # type: ignore[no-any-return]

