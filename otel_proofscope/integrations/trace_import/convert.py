"""Parsed Chrome trace events → SDK ReadableSpans and MetricsData (pure, no I/O).

One trace per process (``pid``): a Chrome trace has no trace ids, and a prover's phases
run on many threads (rayon workers) whose spans would otherwise land in separate
traces. Within a thread, a span's parent is the span that encloses it in time. ``pid``
becomes the resource attribute ``process.pid`` (with ``chrome.process_name``), ``tid``
the span attribute ``thread.id`` (with ``thread.name``). An event's ``args`` become span
attributes under their own keys, so mapping rules can read them (``index_from =
"shard"``). Counters become gauge points stamped with their own timestamps.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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

from otel_proofscope.integrations.trace_import.chrome import Id, ParseResult
from otel_proofscope.semconv import ImportAttr
from otel_proofscope.version import __version__

SCOPE = InstrumentationScope("otel_proofscope.import", __version__)
#: Longest string attribute kept from an event's args (a larger value is cut, marked).
MAX_ARG_TEXT = 4096


@dataclass(frozen=True)
class Converted:
    spans: list[ReadableSpan]
    metrics: MetricsData
    points: int
    traces: int


def convert(parsed: ParseResult, base: Resource, *, offset_ns: int = 0,
            source: str | None = None, seed: int | None = None) -> Converted:
    """Spans (in end order, as a live SDK sends them) and counter points of ``parsed``.

    ``offset_ns`` is added to every timestamp (0 keeps the file's own, exactly);
    ``seed`` makes trace and span ids reproducible.
    """
    rng = random.Random(seed)
    resources: dict[Id, Resource] = {}
    traces: dict[Id, int] = {}

    def resource(pid: Id) -> Resource:
        res = resources.get(pid)
        if res is None:
            attrs: dict[str, Any] = {ImportAttr.PROCESS_PID: pid}
            name = parsed.process_names.get(pid)
            if name:
                attrs[ImportAttr.PROCESS_NAME] = name
            if source:
                attrs[ImportAttr.SOURCE_FILE] = source
            res = resources[pid] = base.merge(Resource(attrs))
        return res

    def trace_id(pid: Id) -> int:
        tid = traces.get(pid)
        if tid is None:
            tid = traces[pid] = rng.getrandbits(128) or 1
        return tid

    span_ids = [rng.getrandbits(64) or 1 for _ in parsed.spans]
    out: list[ReadableSpan] = []
    for i in _end_order(parsed):
        s = parsed.spans[i]
        trace = trace_id(s.pid)
        ctx = SpanContext(trace, span_ids[i], is_remote=False,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
        parent = None
        if s.parent is not None:
            parent = SpanContext(trace, span_ids[s.parent], is_remote=False,
                                 trace_flags=TraceFlags(TraceFlags.SAMPLED))
        attrs = attributes(s.args)
        attrs[ImportAttr.THREAD_ID] = s.tid
        thread_name = parsed.thread_names.get((s.pid, s.tid))
        if thread_name:
            attrs[ImportAttr.THREAD_NAME] = thread_name
        if s.category:
            attrs[ImportAttr.CATEGORY] = s.category
        attrs[ImportAttr.PHASE] = s.phase
        if s.unterminated:
            attrs[ImportAttr.UNTERMINATED] = True
        events = [Event(ev.name, attributes(ev.args), ev.ts_ns + offset_ns, limit=None)
                  for ev in s.events]
        out.append(ReadableSpan(
            name=s.name, context=ctx, parent=parent, resource=resource(s.pid),
            attributes=attrs, events=events, kind=SpanKind.INTERNAL,
            start_time=s.start_ns + offset_ns, end_time=s.end_ns + offset_ns,
            instrumentation_scope=SCOPE))
    metrics, points = _metrics(parsed, resource, offset_ns)
    return Converted(out, metrics, points, len(traces))


def _end_order(parsed: ParseResult) -> list[int]:
    """Span indices in the order a live SDK exports them: by end time, a child before
    the parent it ends with. An import then looks to every sink like the prover itself
    sending (mapping rules that hold a child for its parent rely on it)."""
    return sorted(range(len(parsed.spans)),
                  key=lambda i: (parsed.spans[i].end_ns, -parsed.spans[i].start_ns, i))


def _metrics(parsed: ParseResult, resource: Any, offset_ns: int) -> tuple[MetricsData, int]:
    by_pid: dict[Id, dict[str, list[NumberDataPoint]]] = {}
    for c in parsed.counters:
        by_pid.setdefault(c.pid, {}).setdefault(c.name, []).append(NumberDataPoint(
            attributes={ImportAttr.COUNTER_SERIES: c.series}, start_time_unix_nano=0,
            time_unix_nano=c.ts_ns + offset_ns, value=c.value))
    resource_metrics = [
        ResourceMetrics(resource(pid), [ScopeMetrics(SCOPE, [
            Metric(name, None, None, Gauge(points)) for name, points in series.items()],
            "")], "")
        for pid, series in by_pid.items()]
    return MetricsData(resource_metrics), len(parsed.counters)


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

