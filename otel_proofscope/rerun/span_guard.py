"""Screen spans before the Rerun translation: one poison span must not sink a batch.

Why: a timestamp is a uint64 on the OTLP wire, but Rerun's time columns are int64
nanoseconds. A span with ``end_time = 2**64 - 1`` (valid on the wire) raised
OverflowError deep in the column building, and the sender counted the whole coalesced
batch (up to 4096 spans, other provers' included) as failed. Such spans are now refused
one by one, counted as ``invalid`` and named in one warning; the rest are drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_proofscope.otlp.sdk_fields import event_count as _count_events
from otel_proofscope.otlp.sdk_fields import (
    event_timestamps,
    events_fields,
    span_events_unread,
)

#: Largest timestamp Rerun's int64 nanosecond timelines can hold.
MAX_TIME_NS = 2**63 - 1
_INT_ONLY = {int}


def _time_ok(t: Any) -> bool:
    return t is None or (isinstance(t, int) and 0 <= t <= MAX_TIME_NS)


def problem(span: Any) -> str | None:
    """Why ``span`` cannot be drawn, or None."""
    try:
        if not _time_ok(span.start_time) or not _time_ok(span.end_time):
            return (f"span {span.name!r}: timestamp out of range "
                    f"(start {span.start_time}, end {span.end_time})")
        # Every event's time at once (a prover span carries many events): the common
        # case, all ints in range, is settled by C-level passes; anything else is
        # looked at event by event, for the reason.
        events = span_events_unread(span)  # round records are read unbuilt
        times = event_timestamps(events)
        if times and not (set(map(type, times)) == _INT_ONLY
                          and min(times) >= 0 and max(times) <= MAX_TIME_NS):
            for name, t, _, _ in events_fields(events):
                if not _time_ok(t):
                    return f"span {span.name!r}: event {name!r} timestamp out of range"
    except Exception as exc:  # a hostile object: refuse it, never raise
        return f"unreadable span: {exc!r}"
    return None


def split(spans: Sequence[Any]) -> tuple[list[Any], list[Any], str | None]:
    """(drawable, refused, first reason)."""
    ok: list[Any] = []
    bad: list[Any] = []
    first: str | None = None
    for span in spans:
        why = problem(span)
        if why is None:
            ok.append(span)
        else:
            bad.append(span)
            first = first or why
    return ok, bad, first


def event_count(span: Any) -> int:
    try:
        return _count_events(span)
    except Exception:
        return 0
