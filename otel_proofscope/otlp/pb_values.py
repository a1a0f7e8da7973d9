"""OTLP ``AnyValue`` and key-value lists read into attribute values, for the decoder and
for :mod:`~otel_proofscope.otlp.received_events` (which reads a received span's event
attributes only when asked).

Arrays become tuples and key-value lists dicts (the SDK's extended attribute types);
bytes stay bytes; an empty value (and an empty key, invalid in OTel) is left out.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as an SDK attribute value (``None`` for an empty value)."""
    kind = value.WhichOneof("value")
    scalar = SCALAR.get(kind)  # type: ignore[arg-type]
    if scalar is not None:
        return scalar(value)
    if kind == "bytes_value":
        return bytes(value.bytes_value)
    if kind == "array_value":
        return array(value.array_value.values)
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return None


# The four scalar kinds, read with one C-level getter each: a received span carries
# dozens of values (a prover's round events), and a chain of ``if kind == ...`` tests
# plus a function call per value was most of the decoder's time.
SCALAR: dict[str, Any] = {k: operator.attrgetter(k) for k in (
    "string_value", "int_value", "double_value", "bool_value")}


def array(values: Iterable[AnyValue]) -> tuple[Any, ...]:
    get = SCALAR.get
    out = []
    for v in values:
        scalar = get(v.WhichOneof("value"))  # type: ignore[arg-type]
        out.append(scalar(v) if scalar is not None else any_value(v))
    return tuple(out)


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as an attribute dict; the last of repeated keys wins."""
    return attributes_counted(kvs)[0]


def attributes_counted(kvs: Iterable[KeyValue]) -> tuple[dict[str, Any], int]:
    """:func:`attributes` and how many empty keys were left out, in one pass (each
    access to a received message costs; a second walk to count them cost ~10 %)."""
    out: dict[str, Any] = {}
    empty = 0
    get = SCALAR.get
    for kv in kvs:
        key = kv.key
        if not key:
            empty += 1
            continue
        value = kv.value
        kind = value.WhichOneof("value")
        scalar = get(kind)  # type: ignore[arg-type]
        if scalar is not None:  # inline: the common case, one call fewer per value
            out[key] = scalar(value)
        elif kind == "array_value":
            out[key] = array(value.array_value.values)
        else:
            v = any_value(value)
            if v is not None:
                out[key] = v
    return out, empty
