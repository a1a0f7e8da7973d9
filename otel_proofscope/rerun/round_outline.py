"""A span's events as the Rerun translations read them, its round records unformatted.

Why: the walk needs of each round only its time, index, claim and error, and the trace
view's span log only the first and the last event in full; building every round's OTLP
attributes (its polynomial's coefficients as canonical strings) for them is work the
view does not use. In the export process nobody builds them now: the frames are
unpacked with their records checked, not built (``span_wire.unpack_spans``), the OTLP
encoder writes each record's event straight from it, and these readers outline them.
Unpacking plus encoding, per round: 5.8 + 13.9 µs of CPU before, 1.8 + 10.5 after
(``benchmarks/bench_child_rounds.py``); the Rerun sink's own ~12 µs did not move.

:func:`outline` gives ``(name, timestamp, attributes, dropped)`` per event, as
``events_fields`` does, except that a round record's attributes hold only the round,
the claim (as the prover gave it: an ``int``, an int-limb tuple or list checked on the
prover thread, or a canonical string) and the error, and its fourth field is the
record itself, so that :func:`full` can build the exact event where one is shown whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.received_events import ReceivedEvents, Unread
from otel_proofscope.otlp.round_records import ATTRIBUTES as ROUND_EVENT_ATTRIBUTES
from otel_proofscope.otlp.round_records import round_event
from otel_proofscope.otlp.sdk_fields import event_fields, events_fields
from otel_proofscope.semconv import Attr, EventName

_NAME = EventName.SUMCHECK_ROUND
_ROUND, _CLAIM, _ERROR = Attr.SUMCHECK_ROUND, Attr.CLAIM, Attr.ERROR_TYPE
_OUTLINED = frozenset((_ROUND, _CLAIM, _ERROR))


def outline(events: Sequence[Any]) -> list[tuple[Any, Any, Any, Any]]:
    """The events' fields, round records outlined (see the module); fields already built
    as they are, and any other list (or a deferred one whose limits could change a round
    event) as ``events_fields`` reads it. A received span's rounds (``proofscope serve``)
    are outlined from the protobuf: their other attributes (the polynomial) are not read."""
    if type(events) is ReceivedEvents:
        return events.outline(_NAME, _OUTLINED)
    if type(events) is not DeferredEvents or events.builder is not round_event:
        return events_fields(events)
    built = events.fields_if_built()  # the OTLP encoder's, in the export process
    if built is not None:
        return built
    max_attrs, max_len = events.limits
    if max_len is not None or (max_attrs is not None and max_attrs < ROUND_EVENT_ATTRIBUTES):
        return events_fields(events)
    out: list[tuple[Any, Any, Any, Any]] = []
    append = out.append
    name, round_key, claim_key, error_key = _NAME, _ROUND, _CLAIM, _ERROR
    for x in events.items():
        if type(x) is not tuple:
            append(event_fields(x))
            continue
        # The record's layout (otlp.round_records):
        # (time, round, degree, poly, claim, challenge, error, deferred).
        # A deferred record's claim stays as the prover gave it (an int-limb tuple or
        # list, checked on the prover thread): the walk reads its first limb, and
        # formatting every round's claim was ~7 % of the sink's batch for nothing.
        claim, error = x[4], x[6]
        attrs: dict[str, Any] = {round_key: x[1]}
        if claim is not None:
            attrs[claim_key] = claim
        if error is not None:
            attrs[error_key] = error
        append((name, x[0], attrs, x))
    return out


def full(item: tuple[Any, Any, Any, Any]) -> tuple[Any, Any, Any, Any]:
    """The exact fields of one :func:`outline` item (a round record built as the OTLP
    encoder builds it); any other item as it is."""
    record = item[3]
    if type(record) is Unread:
        return record.fields()
    if type(record) is not tuple:
        return item
    name, attrs = round_event(record)
    return name, record[0], attrs, 0
