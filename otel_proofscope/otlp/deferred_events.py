"""A span's event list that takes compact records on the hot path and builds the SDK's
``Event`` objects only when someone reads the events.

Why: ``Span.add_event`` validates every attribute into a ``BoundedAttributes`` and
builds an ``Event`` under the span's lock, about 7 µs a call on a slow CPU, and a
sumcheck round happens thousands of times a layer on the prover thread. Here the prover
thread appends one tuple (its timestamp first, taken when the SDK would have taken it)
and the thread that reads ``span.events`` (an export thread, normally after the span
ended) turns each record into the very ``Event`` that ``add_event`` would have built.

The list keeps records and ordinary events in one deque, in call order, so a user's own
``span.add_event`` calls (which reach :meth:`DeferredEvents.append` through the SDK)
interleave exactly as before, and the SDK's ``max_events`` limit drops the oldest items
and counts them in ``dropped`` exactly as ``BoundedList`` does.

Installed by :func:`otel_proofscope.otlp.sdk_fields.deferred_events`, which probes the
installed SDK first; like that module, this one reads the SDK's private fields.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, SpanLimits
from opentelemetry.sdk.util import BoundedList

#: ``record -> (event name, attributes)``. The record is a tuple whose first item is the
#: event's timestamp (ns). The attribute values must already be what the SDK's cleaning
#: keeps unchanged (``str``, ``int``, ``bool``, ``float`` or a tuple of one of those):
#: under permissive limits they go into the event as they are.
Build = Callable[[tuple[Any, ...]], tuple[str, Mapping[str, Any]]]
#: ``(name, timestamp, attributes, dropped attributes)`` of one event.
EventFields = tuple[str, Any, Mapping[str, Any], int]


def private_event_fields(event: Event) -> EventFields:
    """:data:`EventFields` of an SDK ``Event`` from its private fields (the SDK's
    properties wrap the attributes in a proxy); :mod:`~otel_proofscope.otlp.sdk_fields`
    probes that they hold what the properties return."""
    attrs: Any = event._attributes
    if type(attrs) is BoundedAttributes:
        return event._name, event._timestamp, attrs._dict, attrs.dropped
    return event._name, event._timestamp, attrs, 0


def public_event_fields(event: Any) -> EventFields:
    """:data:`EventFields` of any event, through its public properties."""
    return event.name, event.timestamp, event.attributes, event.dropped_attributes


@functools.cache
def _limits() -> SpanLimits:
    # Built once: the constructor reads the environment (~7 µs); rebuilt() replaces the
    # two values a list reads from it.
    return SpanLimits()


class DeferredEvents(BoundedList):  # type: ignore[type-arg]
    """A ``BoundedList`` of span events some of which are still records (tuples)."""

    # The base's own fields (the SDK leaves them untyped), for the type checker.
    _dq: deque[Any]
    _lock: threading.Lock

    def __init__(self, maxlen: int | None, limits: SpanLimits, build: Build,
                 record_name: str | None = None) -> None:
        super().__init__(maxlen)  # its deque and lock (typed on the class, above)
        self._maxlen = maxlen
        self._build = build
        # The name ``build`` gives every record, when the caller knows it: names are then
        # read (the witness filter reads every span's) without building anything.
        self._record_name = record_name
        self._max_attrs: int | None = limits.max_event_attributes
        self._max_len: int | None = limits.max_attribute_length
        self._pending = 0   # records not yet turned into events
        # fields() as last read, with the (length, drops) it was read at: the OTLP
        # encoder and both Rerun translations read the same fields of one span.
        self._fields: tuple[tuple[int, int], list[EventFields]] | None = None

    # ── writers ──────────────────────────────────────────────────────────────────────

    def add(self, record: tuple[Any, ...], span: Any) -> bool:
        """Append ``record`` unless ``span`` has ended (then False: the caller goes
        through ``add_event``, which warns and drops, as the SDK does)."""
        with self._lock:
            # Read under this lock: a reader that snapshots the list after end() waits
            # for this append, and one before end() cannot have started exporting.
            if span._end_time is not None:
                return False
            dq = self._dq
            if len(dq) == self._maxlen:
                self.dropped += 1
            dq.append(record)
            self._pending += 1
        return True

    def append(self, item: Any) -> None:
        with self._lock:
            if len(self._dq) == self._maxlen:
                self.dropped += 1
            self._dq.append(item)

    def extend(self, seq: Any) -> None:
        seq = tuple(seq)
        with self._lock:
            if self._maxlen is not None:
                self.dropped += max(0, len(seq) + len(self._dq) - self._maxlen)
            self._dq.extend(seq)
            self._pending += sum(1 for x in seq if type(x) is tuple)

    @classmethod
    def rebuilt(cls, items: list[Any], build: Build, max_attrs: int | None,
                max_len: int | None, record_name: str | None = None, *,
                records: int | None = None) -> DeferredEvents:
        """A list holding ``items`` (records and events, as :meth:`items` gave them) that
        builds its records exactly as the original list would have: the same builder and
        the same limits. How another process receives a span's rounds unbuilt.
        ``records``: how many of ``items`` are records, when the caller counted them."""
        out = cls(None, _limits(), build, record_name)
        out._max_attrs, out._max_len = max_attrs, max_len  # the sender's, not this one's
        out._dq.extend(items)
        out._pending = sum(1 for x in items if type(x) is tuple) if records is None \
            else records
        return out

    # ── readers ──────────────────────────────────────────────────────────────────────

    @property
    def builder(self) -> Build:
        return self._build

    @property
    def limits(self) -> tuple[int | None, int | None]:
        """(max attributes per event, max attribute length) the records are built with."""
        return self._max_attrs, self._max_len

    def items(self) -> list[Any]:
        """Every item as it is now, records unbuilt."""
        with self._lock:
            return list(self._dq)

    def events(self) -> list[Any]:
        """Every item as an ``Event``, oldest first (records built on the first read)."""
        with self._lock:
            items = list(self._dq)
            if not self._pending:
                return items
            # Every append grows the list or, once it is full, the drop count.
            seen = (len(self._dq), self.dropped)
        # Built outside the lock, so that the prover's appends never wait for it (and a
        # fork cannot catch the lock held for long); two readers racing build the same
        # events twice, harmlessly.
        make = self._event
        built = [make(x) if type(x) is tuple else x for x in items]
        with self._lock:
            if (len(self._dq), self.dropped) == seen:  # nothing came in: keep the events
                self._dq = deque(built, maxlen=self._maxlen)
                self._pending = 0
        return built

    def fields(self) -> list[EventFields]:
        """``(name, timestamp, attributes, dropped attributes)`` of every item, oldest
        first, without building an ``Event`` for a record: the OTLP encoder and the Rerun
        translations need only these, and half of a record's cost is the ``Event``. The
        fields are exactly those of the event :meth:`events` would build; read once while
        nothing is added (the caller must not change them)."""
        cached = self.fields_if_built()
        if cached is not None:
            return cached
        with self._lock:
            items = list(self._dq)
            seen = (len(self._dq), self.dropped)
        build = self._build
        max_attrs = self._max_attrs
        as_built = self._max_len is None  # else every record is truncated as the SDK does
        out: list[EventFields] = []
        append = out.append
        for x in items:
            if type(x) is tuple:
                if as_built:
                    name, values = build(x)
                    if max_attrs is None or len(values) <= max_attrs:
                        append((name, x[0], values, 0))
                        continue
                x = self._event(x)  # a limit bites: the SDK's own constructor
            append(private_event_fields(x) if type(x) is Event else public_event_fields(x))
        with self._lock:
            if (len(self._dq), self.dropped) == seen:  # nothing came in: keep them
                self._fields = (seen, out)
        return out

    def fields_if_built(self) -> list[EventFields] | None:
        """What :meth:`fields` would give, if it was read since the last change; else
        None (and nothing is built)."""
        with self._lock:
            seen = (len(self._dq), self.dropped)
            cached = self._fields
        return cached[1] if cached is not None and cached[0] == seen else None

    def names(self) -> list[str]:
        """The name of every item, oldest first, records unbuilt when they all share a
        name known in advance (``record_name``)."""
        with self._lock:
            items = list(self._dq)
            pending = self._pending
        record_name = self._record_name
        if not pending:
            return [x.name for x in items]
        if record_name is None:
            return [x.name for x in self.events()]
        return [record_name if type(x) is tuple else x.name for x in items]

    def events_at(self, indices: list[int]) -> list[Any]:
        """The items at ``indices`` as events, building (and keeping) none of the others:
        a reader that set a few events aside while it read the fields."""
        items = self.items()
        return [self._event(x) if type(x) is tuple else x for x in (items[i] for i in indices)]

    def without(self, names: Collection[str]) -> DeferredEvents | None:
        """A copy without the events named in ``names``: its records still records, the
        same drop count, and the fields this list has built, if any (shared); None
        when the records' name is not known in advance, or is itself in ``names``."""
        record_name = self._record_name
        if record_name is None or record_name in names:
            return None
        with self._lock:
            items = list(self._dq)
            cached = self._fields
            seen = (len(items), self.dropped)
        keep = [type(x) is tuple or x.name not in names for x in items]
        out = DeferredEvents.rebuilt([x for x, k in zip(items, keep, strict=True) if k],
                                     self._build, self._max_attrs, self._max_len, record_name)
        out.dropped = seen[1]
        # Fields built already are shared; none are built here (the OTLP encoder writes
        # round records straight from them).
        if cached is not None and cached[0] == seen:  # the fields are of these very items
            out._fields = ((len(out._dq), out.dropped),
                           [f for f, k in zip(cached[1], keep, strict=True) if k])
        return out

    def timestamps(self) -> list[Any]:
        """The timestamp of every item, oldest first, records unbuilt."""
        return [x[0] if type(x) is tuple else x.timestamp for x in self.items()]

    def _event(self, record: tuple[Any, ...]) -> Event:
        name, values = self._build(record)
        max_attrs, max_len = self._max_attrs, self._max_len
        if max_len is None and (max_attrs is None or len(values) <= max_attrs):
            # What the SDK's cleaning would keep, without its per-value re-validation.
            attrs = BoundedAttributes(max_attrs, None, immutable=False)
            attrs._dict.update(values)
            attrs._immutable = True
        else:  # a limit bites: the SDK's own constructor truncates and drops
            attrs = BoundedAttributes(max_attrs, values, max_value_len=max_len,
                                      immutable=True)
        return Event(name, attrs, timestamp=record[0])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.events())

    def __getitem__(self, index: Any) -> Any:
        with self._lock:
            if not self._pending:  # all events already: no copy per index
                return self._dq[index]
        return self.events()[index]

    def __len__(self) -> int:
        return len(self._dq)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.events()}, maxlen={self._maxlen})"

    def __deepcopy__(self, memo: dict[int, Any]) -> BoundedList:  # type: ignore[type-arg]
        # A plain BoundedList of real events: a copy must not share the records' builder.
        copy_: BoundedList = BoundedList(self._maxlen)  # type: ignore[type-arg]
        memo[id(self)] = copy_
        events = self.events()
        copy_.dropped = self.dropped
        copy_._dq = copy.deepcopy(deque(events, maxlen=self._maxlen), memo)  # type: ignore[attr-defined]
        return copy_
