"""The one rule every span route applies to times: OTLP carries a time as integer
nanoseconds in ``[0, 2**64)`` (``fixed64``); 0 or None means "not set".

A span whose start, end or event time falls outside that range is refused on its own
and counted (reason ``invalid``), never clamped: clamping -5 to 0 or 2**70 to
``2**64 - 1`` would write 1970 or the year 2554 into a trace as if it were measured.
Before this check, one such span made the protobuf encoder raise and its whole batch
was lost (50 good spans with it), and the JSON file route wrote ``"-5"``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

#: The largest time OTLP's ``fixed64`` fields hold.
U64_MAX = (1 << 64) - 1


class InvalidSpan(ValueError):
    """A span that no OTLP route can carry; refused alone, its batch goes on."""


def time_ok(value: Any) -> bool:
    """Whether ``value`` is unset (None, 0) or integer nanoseconds in ``[0, 2**64)``."""
    if not value:
        return bool(value is None or value == 0)
    if type(value) is int:
        return 0 <= value <= U64_MAX
    try:
        checked = operator.index(value)  # numpy integers; never a float
    except TypeError:
        return False
    return 0 <= checked <= U64_MAX


def check_times(name: Any, start: Any, end: Any, event_times: Iterable[Any] = ()) -> None:
    """Raise :class:`InvalidSpan` naming the span, the field and the value when any
    of its times cannot be carried."""
    for field, value in (("start time", start), ("end time", end)):
        if not time_ok(value):
            raise InvalidSpan(f"span {name!r}: {field} {value!r} is not integer "
                              "nanoseconds in [0, 2**64)")
    for i, value in enumerate(event_times):
        if not time_ok(value):
            raise InvalidSpan(f"span {name!r}: event {i} time {value!r} is not integer "
                              "nanoseconds in [0, 2**64)")


def ns(value: Any) -> int:
    """A checked time as a plain int (numpy integers become ints)."""
    return value if type(value) is int else operator.index(value)
