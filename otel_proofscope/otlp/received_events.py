"""A received span's events, read from its protobuf ``Span.events`` only as far as a
reader asks: names and timestamps without touching an attribute, some attributes
without the others, every field without an SDK ``Event``, and ``Event`` objects only
for a reader that wants them (``span.events``, a mapping rule).

Why (issue 29, decision 5): ``proofscope serve`` spent about half of its CPU building,
for every received round event, an ``Event`` and a ``BoundedAttributes`` and reading
every attribute through the Python protobuf accessors (the polynomial's array alone
~2.7 µs), although the Rerun walk reads only each round's index, claim and error and
the trace view shows only the first and the last event of a layer in full.

The list is what :func:`otel_proofscope.otlp.decode.span` made eagerly before, field
for field: the same names, timestamps, attribute values (empty keys and empty values
left out, the sender's ``dropped_attributes_count`` plus the empty keys as the dropped
count), the sender's ``dropped_events_count`` as ``dropped``, no limit applied. Readers
reach it through :mod:`~otel_proofscope.otlp.sdk_fields`, like the prover's
:class:`~otel_proofscope.otlp.deferred_events.DeferredEvents`.

Received events cannot be invalid (every value the decoder reads is a valid attribute
value), so reading later never fails where the decoder would have rejected the span.
The events are a copy of the span's own message (``CopyFrom``), not a view into the
request: a view would keep the whole parsed request alive for as long as any one of its
spans is queued.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.util import BoundedList

from otel_proofscope.otlp.pb_values import SCALAR, any_value, attributes_counted

#: Held while a list turns into a plain one (rare: a received span is not appended to).
_PLAIN_LOCK = threading.Lock()
#: ``(name, timestamp, attributes, dropped attributes)`` of one event.
EventFields = tuple[str, Any, Any, int]


class Unread:
    """Where one outlined event's full fields are: :meth:`ReceivedEvents.outline` puts
    it in place of the dropped count (``rerun.round_outline.full`` reads it)."""

    __slots__ = ("events", "index")

    def __init__(self, events: ReceivedEvents, index: int) -> None:
        self.events = events
        self.index = index

    def fields(self) -> EventFields:
        return self.events.fields_at(self.index)


def _event(fields: EventFields) -> Event:
    # Here, not at the top: sdk_fields reads this module's ReceivedEvents. Only a reader
    # of span.events builds events.
    from otel_proofscope.otlp.sdk_fields import bounded_attributes

    name, t, values, dropped = fields
    # The decoder's values are valid attribute values by construction: straight into
    # the store, without the SDK's per-value re-validation.
    return Event(name, bounded_attributes(values, dropped), t, limit=None)


def _read(pb: Any) -> EventFields:
    values, empty = attributes_counted(pb.attributes)
    return pb.name, pb.time_unix_nano, values, int(pb.dropped_attributes_count) + empty


class ReceivedEvents(BoundedList):  # type: ignore[type-arg]
    """The events of one received span (a ``BoundedList`` to the SDK: ``dropped`` is
    the sender's ``dropped_events_count``)."""

    # The base's own fields (the SDK leaves them untyped), for the type checker.
    _dq: Any
    _lock: threading.Lock

    def __init__(self, pbs: Sequence[Any], dropped: int = 0) -> None:
        # The base's deque and lock are made only if something is appended (_to_plain):
        # they cost about as much as the rest of a received span's decode.
        self.dropped = int(dropped)
        self._pbs = pbs
        # Caches, each filled by its first reader. Written without a lock: two readers
        # racing compute the same values, and an assignment is atomic.
        self._fields: list[EventFields] | None = None
        self._events: list[Event] | None = None
        # The last outline, with its (name, keys): the walk and the trace view both read it.
        self._outline: tuple[str, frozenset[str], list[tuple[Any, Any, Any, Any]]] | None = None
        # Set once something was appended: the list is then an ordinary BoundedList of
        # built events (a ReadableSpan's events are never appended to; a copy may be).
        self._plain = False

    @classmethod
    def of_span(cls, pb: Any) -> ReceivedEvents:
        """The events of the protobuf ``Span`` ``pb`` (copied out of its request)."""
        own = type(pb)()
        own.CopyFrom(pb)
        return cls(own.events, pb.dropped_events_count)

    # ── readers ──────────────────────────────────────────────────────────────────────

    def names(self) -> list[str]:
        if self._plain:
            return [e.name for e in self._dq]
        fields = self._fields
        if fields is not None:
            return [f[0] for f in fields]
        return [e.name for e in self._pbs]

    def timestamps(self) -> list[Any]:
        if self._plain:
            return [e.timestamp for e in self._dq]
        fields = self._fields
        if fields is not None:
            return [f[1] for f in fields]
        return [e.time_unix_nano for e in self._pbs]

    def fields(self) -> list[EventFields]:
        """``(name, timestamp, attributes, dropped attributes)`` of every event, oldest
        first, built once; the caller must not change them."""
        if self._plain:
            return [(e.name, e.timestamp, e.attributes, e.dropped_attributes)
                    for e in self._dq]
        fields = self._fields
        if fields is None:
            fields = self._fields = [_read(e) for e in self._pbs]
        return fields

    def fields_at(self, index: int) -> EventFields:
        """The fields of one event, reading none of the others."""
        fields = self._fields
        if fields is not None or self._plain:
            return self.fields()[index]
        return _read(self._pbs[index])

    def outline(self, name: str, keys: frozenset[str]) -> list[tuple[Any, Any, Any, Any]]:
        """Every event's fields as :meth:`fields` gives them, except that an event named
        ``name`` gets only the attributes in ``keys`` (the others are not read) and, in
        place of its dropped count, an :class:`Unread` that gives its full fields. Read
        once per (name, keys); the caller must not change it."""
        fields = self._fields
        if fields is not None or self._plain:
            return self.fields()
        cached = self._outline
        if cached is not None and cached[0] == name and cached[1] == keys:
            return cached[2]
        out: list[tuple[Any, Any, Any, Any]] = []
        append = out.append
        get = SCALAR.get
        # Only the values of ``keys`` are read, as pb_values.attributes reads them (the
        # others' values are most of an attribute's cost); inline, not a function call
        # per event: this loop runs once per received round event (a 16-round span:
        # 40 -> 34 µs).
        for i, e in enumerate(self._pbs):
            ev_name = e.name
            if ev_name == name:
                attrs: dict[str, Any] = {}
                for kv in e.attributes:
                    key = kv.key
                    if key in keys:
                        value = kv.value
                        scalar = get(value.WhichOneof("value"))
                        v = scalar(value) if scalar is not None else any_value(value)
                        if v is not None:  # an empty value never replaces one
                            attrs[key] = v
                append((ev_name, e.time_unix_nano, attrs, Unread(self, i)))
            else:
                append(_read(e))
        self._outline = (name, keys, out)
        return out

    def events(self) -> list[Event]:
        """Every event as an SDK ``Event``, built once."""
        if self._plain:
            return list(self._dq)
        built = self._events
        if built is None:
            built = self._events = [_event(f) for f in self.fields()]
        return built

    def events_at(self, indices: list[int]) -> list[Event]:
        """The events at ``indices``, building none of the others."""
        if self._plain or self._events is not None:
            events = self.events()
            return [events[i] for i in indices]
        return [_event(self.fields_at(i)) for i in indices]

    # ── the BoundedList protocol ─────────────────────────────────────────────────────

    def __len__(self) -> int:
        return len(self._dq) if self._plain else len(self._pbs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.events())

    def __getitem__(self, index: Any) -> Any:
        return self.events()[index]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.events()}, maxlen=None)"

    def _to_plain(self) -> None:
        with _PLAIN_LOCK:
            if not self._plain:
                self._dq = deque(self.events())
                self._lock = threading.Lock()
                self._plain = True
                self._pbs, self._fields, self._events, self._outline = (), None, None, None

    def append(self, item: Any) -> None:
        self._to_plain()
        super().append(item)

    def extend(self, seq: Any) -> None:
        self._to_plain()
        super().extend(seq)

    def __deepcopy__(self, memo: dict[int, Any]) -> BoundedList:  # type: ignore[type-arg]
        # A plain BoundedList of built events (the protobuf stays with the original).
        copy_: BoundedList = BoundedList(None)  # type: ignore[type-arg]
        memo[id(self)] = copy_
        copy_.dropped = self.dropped
        copy_._dq.extend(copy.deepcopy(self.events(), memo))  # type: ignore[attr-defined]
        return copy_

