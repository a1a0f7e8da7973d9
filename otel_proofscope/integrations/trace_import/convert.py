"""Parsed Chrome trace events → SDK ReadableSpans and MetricsData (pure, no I/O).

One trace per process (``pid``): a Chrome trace has no trace ids, and a prover's phases
run on many threads (rayon workers) whose spans would otherwise land in separate
traces. Within a thread, a span's parent is the span that encloses it in time. ``pid``
becomes the resource attribute ``process.pid`` (with ``chrome.process_name``), ``tid``
the span attribute ``thread.id`` (with ``thread.name``). An event's ``args`` become span
attributes under their own keys, so mapping rules can read them (``index_from =
"shard"``). Counters become gauge points stamped with their own timestamps.

Spans are built one at a time (:class:`Converter`), so an import holds the parsed file
(its columns) and a few thousand SDK spans, never all of them (a ``ReadableSpan`` costs
~2 KB: the viztracer trace of ``examples/toy_prover.py``, 655k spans, held 1.5 GB that
way). The orders and screens below are numpy over the columns: a Python list of a
million indices costs ~36 MB, held for the whole send. Span ids are a bijective 64-bit
mix of the span's index and one random key: unique within a file, reproducible with
``seed``, and nothing to store.

Times: ``offset_ns`` shifts every timestamp by one constant. A span, event or counter
point whose shifted time falls outside [0, 2**63) ns is refused and counted
(:class:`Refused`): OTLP holds unsigned 64-bit nanoseconds and Rerun signed ones, and
one such value would otherwise fail the whole batch it is encoded in. A refused span's
children hang from its nearest kept ancestor. When the times are shifted, each span
keeps the file's own start in :data:`SOURCE_START_NS` and the resource the shift in
:data:`TIME_OFFSET_NS`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from otel_proofscope.integrations.trace_import.chrome import (
    TIME_LIMIT_NS,
    CounterPoint,
    Id,
    ParseResult,
    Span,
)
from otel_proofscope.semconv import ImportAttr
from otel_proofscope.version import __version__

SCOPE = InstrumentationScope("otel_proofscope.import", __version__)
#: Longest string attribute kept from an event's args (a larger value is cut, marked).
MAX_ARG_TEXT = 4096
#: The file's own start of a span (integer ns, exact), set when the import shifted times.
SOURCE_START_NS = "proofscope.source.start_time_ns"
#: Resource attribute: the constant the import added to every timestamp (ns).
TIME_OFFSET_NS = "proofscope.import.time_offset_ns"
_MASK = (1 << 64) - 1


@dataclass
class Refused:
    """What the import refused because its time cannot be held once shifted."""

    spans: int = 0
    events: int = 0  # span events of refused spans
    points: int = 0  # counter points
    reasons: list[str] = field(default_factory=list)  # the first few, with names


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers (distinct in, distinct out)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) or 1


@dataclass(frozen=True)
class Converted:
    spans: list[ReadableSpan]
    metrics: MetricsData
    points: int
    traces: int
    refused: Refused = field(default_factory=lambda: Refused())


class Converter:
    """Builds the SDK span of one parsed span at a time (see the module docstring)."""

    def __init__(self, parsed: ParseResult, base: Resource, *, offset_ns: int = 0,
                 source: str | None = None, seed: int | None = None) -> None:
        self.parsed = parsed
        self.base = base
        self.offset_ns = offset_ns
        self.source = source
        rng = random.Random(seed)
        self._key = rng.getrandbits(64)
        self._rng = rng
        self._resources: dict[Id, Resource] = {}
        self._traces: dict[Id, int] = {}
        self.refused = Refused()
        self._refused: set[int] = set()
        self._screen()

    @property
    def traces(self) -> int:
        return len(self._traces)

    def _screen(self) -> None:
        """Refuse what the shift puts outside [0, 2**63) ns (counted, with reasons)."""
        off, r = self.offset_ns, self.refused
        spans = self.parsed.spans
        out = _outside(spans.column("start"), spans.column("end"), off)
        for i in out.tolist():
            s = spans[i]
            self._refused.add(i)
            r.spans += 1
            r.events += len(s.events)
            if len(r.reasons) < 5:
                r.reasons.append(f"span {s.name!r} at {s.start_ns} ns: " + (
                    "before 1970 (negative time; try --rebase now)" if s.start_ns + off < 0
                    else "ends past 2**63 ns"))
        points = [c for c in self.parsed.counters
                  if not 0 <= c.ts_ns + off < TIME_LIMIT_NS]
        r.points = len(points)
        for c in points[:max(0, 5 - len(r.reasons))]:
            r.reasons.append(f"counter point {c.name!r} at {c.ts_ns} ns: outside "
                             "[0, 2**63) ns")

    def resource(self, pid: Id) -> Resource:
        res = self._resources.get(pid)
        if res is None:
            attrs: dict[str, Any] = {ImportAttr.PROCESS_PID: pid}
            name = self.parsed.process_names.get(pid)
            if name:
                attrs[ImportAttr.PROCESS_NAME] = name
            if self.source:
                attrs[ImportAttr.SOURCE_FILE] = self.source
            if self.offset_ns:
                attrs[TIME_OFFSET_NS] = self.offset_ns
            res = self._resources[pid] = self.base.merge(Resource(attrs))
        return res

    def _trace_id(self, pid: Id) -> int:
        tid = self._traces.get(pid)
        if tid is None:
            tid = self._traces[pid] = self._rng.getrandbits(128) or 1
        return tid

    def span_id(self, i: int) -> int:
        return _mix(self._key + i)

    def kept_parent(self, s: Span) -> int | None:
        parent = -1 if s.parent is None else s.parent
        column = self.parsed.spans.parent
        while parent >= 0 and parent in self._refused:
            parent = column[parent]
        return None if parent < 0 else parent

    def span(self, i: int) -> ReadableSpan | None:
        """The SDK span of parsed span ``i`` (None: refused, counted in ``refused``)."""
        if i in self._refused:
            return None
        s = self.parsed.spans[i]
        off = self.offset_ns
        trace = self._trace_id(s.pid)
        flags = TraceFlags(TraceFlags.SAMPLED)
        ctx = SpanContext(trace, self.span_id(i), is_remote=False, trace_flags=flags)
        parent_index = self.kept_parent(s)
        parent = None if parent_index is None else SpanContext(
            trace, self.span_id(parent_index), is_remote=False, trace_flags=flags)
        attrs = attributes(s.args)
        attrs[ImportAttr.THREAD_ID] = s.tid
        thread_name = self.parsed.thread_names.get((s.pid, s.tid))
        if thread_name:
            attrs[ImportAttr.THREAD_NAME] = thread_name
        if s.category:
            attrs[ImportAttr.CATEGORY] = s.category
        attrs[ImportAttr.PHASE] = s.phase
        if s.unterminated:
            attrs[ImportAttr.UNTERMINATED] = True
        if off:
            attrs[SOURCE_START_NS] = s.start_ns
        events = [Event(ev.name, attributes(ev.args), ev.ts_ns + off, limit=None)
                  for ev in s.events]
        return ReadableSpan(
            name=s.name, context=ctx, parent=parent, resource=self.resource(s.pid),
            attributes=attrs, events=events, kind=SpanKind.INTERNAL,
            start_time=s.start_ns + off, end_time=s.end_ns + off,
            instrumentation_scope=SCOPE)

    def spans(self, order: Iterable[int]) -> Iterator[ReadableSpan]:
        for i in order:
            span = self.span(i)
            if span is not None:
                yield span

    def metrics(self) -> tuple[MetricsData, int]:
        return _metrics(self.parsed.counters, self.resource, self.offset_ns)

    def metric_chunks(self, size: int) -> Iterator[tuple[MetricsData, int]]:
        """The counter points in pieces of at most ``size`` (each a sink can queue)."""
        counters = self.parsed.counters
        for at in range(0, len(counters), max(1, size)):
            data, n = _metrics(counters[at:at + size], self.resource, self.offset_ns)
            if n:
                yield data, n


def convert(parsed: ParseResult, base: Resource, *, offset_ns: int = 0,
            source: str | None = None, seed: int | None = None) -> Converted:
    """Spans (in end order, as a live SDK sends them) and counter points of ``parsed``,
    all at once (small files, tests; ``proofscope import`` streams with
    :class:`Converter`).

    ``offset_ns`` is added to every timestamp (0 keeps the file's own, exactly);
    ``seed`` makes trace and span ids reproducible.
    """
    conv = Converter(parsed, base, offset_ns=offset_ns, source=source, seed=seed)
    out = list(conv.spans(_end_order(parsed)))
    metrics, points = conv.metrics()
    return Converted(out, metrics, points, conv.traces, conv.refused)


def _outside(starts: np.ndarray[Any, np.dtype[Any]], ends: np.ndarray[Any, np.dtype[Any]],
             offset_ns: int) -> np.ndarray[Any, np.dtype[Any]]:
    """Rows whose start + offset < 0 or end + offset >= 2**63 (the sums are never formed:
    they may not fit in int64; the bounds are compared as Python ints first)."""
    low, high = -offset_ns, TIME_LIMIT_NS - offset_ns  # ok: low <= start, end < high
    int64 = np.iinfo(np.int64)
    if low > int64.max or high <= int64.min:
        return np.arange(len(starts))
    bad = np.zeros(len(starts), bool)
    if low > int64.min:
        bad |= starts < low
    if high <= int64.max:
        bad |= ends >= high
    return np.flatnonzero(bad)


def _end_key(parsed: ParseResult, rows: np.ndarray[Any, np.dtype[Any]],
             ) -> np.ndarray[Any, np.dtype[Any]]:
    """``rows`` sorted by (end, start descending, depth descending, row): a live SDK's
    export order. ``~x`` (= -x - 1) sorts descending without overflow."""
    t = parsed.spans
    return rows[np.lexsort((rows, ~t.column("depth")[rows].astype(np.int64),
                            ~t.column("start")[rows], t.column("end")[rows]))]


def _end_order(parsed: ParseResult) -> list[int]:
    """Span indices in the order a live SDK exports them: by end time, a child before
    the parent it ends with. An import then looks to every sink like the prover itself
    sending (mapping rules that hold a child for its parent rely on it)."""
    return _end_key(parsed, np.arange(len(parsed.spans))).tolist()  # type: ignore[no-any-return]


def send_order(parsed: ParseResult, mapped: Callable[[Span], bool] | None = None,
               ) -> Iterator[int]:
    """Span indices in the order ``proofscope import`` sends them.

    Spans a mapping rule matches come first, in end order (a live SDK's: a round span
    before its layer, layers before their proof, layer indices in occurrence order, all
    as the rules expect). Every other span follows parent before children (start, then
    depth, then file order), so the trace view places each at once: in end order a whole
    trace waits for its root, which ends last, and a 655k-span trace overflowed the view's
    bounded waiting room (63,222 spans drawn as orphans, counted ``size_cap``). The only
    spans that wait are the mapped ones, for their unmapped ancestors.
    """
    spans = parsed.spans
    n = len(spans)
    if mapped is None:  # all of them: the columns sorted as they are, not copied first
        yield from _chunked(np.lexsort((spans.column("seq"), spans.column("depth"),
                                        spans.column("start"))))
        return
    flags = np.fromiter((mapped(spans[i]) for i in range(n)), bool, n)
    yield from _chunked(_end_key(parsed, np.flatnonzero(flags)))
    rest = np.flatnonzero(~flags)
    del flags
    if len(rest):
        order = np.lexsort((spans.column("seq")[rest], spans.column("depth")[rest],
                            spans.column("start")[rest]))
        yield from _chunked(rest[order])


def _chunked(rows: np.ndarray[Any, np.dtype[Any]]) -> Iterator[int]:
    """The rows as Python ints, 65,536 at a time (not a million at once: ~36 MB)."""
    for at in range(0, len(rows), 1 << 16):
        yield from rows[at:at + (1 << 16)].tolist()


def _metrics(counters: Sequence[CounterPoint], resource: Any,
             offset_ns: int) -> tuple[MetricsData, int]:
    by_pid: dict[Id, dict[str, list[NumberDataPoint]]] = {}
    for c in counters:
        if not 0 <= c.ts_ns + offset_ns < TIME_LIMIT_NS:
            continue  # refused (Converter counts it)
        by_pid.setdefault(c.pid, {}).setdefault(c.name, []).append(NumberDataPoint(
            attributes={ImportAttr.COUNTER_SERIES: c.series}, start_time_unix_nano=0,
            time_unix_nano=c.ts_ns + offset_ns, value=c.value))
    resource_metrics = [
        ResourceMetrics(resource(pid), [ScopeMetrics(SCOPE, [
            Metric(name, None, None, Gauge(points)) for name, points in series.items()],
            "")], "")
        for pid, series in by_pid.items()]
    return MetricsData(resource_metrics), sum(len(v) for series in by_pid.values()
                                              for v in series.values())


def attributes(args: Mapping[str, Any]) -> dict[str, Any]:
    """An event's args as OTel attribute values (nested values as JSON text)."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        v = _value(value)
        if v is not None:
            out[str(key)] = v
    return out


def _value(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) \
            and not -(2 ** 63) <= value < 2 ** 63:
        return str(value)  # beyond OTLP's int64
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            return str(value)
        return int(value) if value == value.to_integral_value() and abs(value) < 2 ** 63 \
            else float(value)
    if isinstance(value, str):
        return value if len(value) <= MAX_ARG_TEXT else value[:MAX_ARG_TEXT] + "…"
    if isinstance(value, list) and value:
        items = [_value(v) for v in value]
        kinds = {type(v) for v in items}
        if len(kinds) == 1 and kinds <= {bool, int, float, str}:
            return tuple(items)
    if value is None:
        return None
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= MAX_ARG_TEXT else text[:MAX_ARG_TEXT] + "…"

