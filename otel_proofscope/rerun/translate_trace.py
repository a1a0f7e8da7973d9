"""Every finished span → a trace view in Rerun (no I/O).

The proof walk (:mod:`otel_proofscope.rerun.translate`) draws only spans that speak the
``proof.*`` contract. A prover that emits its own span names (SP1's ``prove_shard``, a
``tracing-opentelemetry`` layer, EZKL under ``opentelemetry-instrument``) would
otherwise see nothing. This view draws *every* span, contract or not::

    trace/flame/{service}/{trace}       Boxes2D, one box per span at its start time (its
                                        whole label on hover), and Points2D of radius 0
                                        carrying the labels that fit inside their box.
                                        x = time since the lane's earliest start, the lane
                                        FLAME_WIDTH wide; y = the lane's row + depth
    trace/logs/{service}                TextLog: one row per span end (duration, status,
                                        attributes, its events summarized: count, first,
                                        last); a log line or exception event is a row
                                        of its own at its time; the traces of a service
                                        share its entity (rows of one log view)
    trace/durations/{service}/{name}    Scalars: the duration (ms) of every span of that
                                        name, so a phase repeated N times is a plot

``{service}`` is the resource's ``service.name`` and ``{name}`` the span name, both
escaped as entity-path parts (services beyond :data:`MAX_LOG_SERVICES` log to
``trace/logs/_other``); ``{trace}`` is the first 8 hex digits of the trace id
(16 when two traces share 8). Spans of several services in one trace keep their own
entities (and colours) while sharing the trace's lane. A lane drawn again goes to
``{trace}.{n}`` and its earlier entities are shadowed (:mod:`otel_proofscope.rerun.flame`
has the layout: lanes, rows, x, labels, and why a redraw takes a new entity).

One lane per trace, and the traces linked under one of its spans in the same lane
(sp1-cluster's per-task traces hang under their task span). Rerun's 2D view keeps one
scale for x and y, and traces last from microseconds to hours, so each lane is scaled to
its own extent (the box labels carry the real durations, the ``proof_time`` timeline the
real times); lanes are stacked downward, each as deep as its tree.

Arrival order: a span's depth is known only once its parent is placed, and exporters
send children before their parents (a child ends first). A span whose parent has not
arrived waits (bounded: :data:`MAX_PENDING` spans, :data:`DEFAULT_WAIT_S`, or
:data:`REMOTE_WAIT_S` for a parent in another process) and is placed with its parent.
Since a root ends last, a trace is usually drawn whole when its root arrives, as in
Jaeger; its log rows and duration points are not held back, they are emitted on arrival
(the live part of the view). A span that waited longer (a proof that never finished, a
parent exported elsewhere), or is still waiting at shutdown, is drawn without its
parent: as an *orphan*, grey, labelled so, in the orphan rows below its lane's tree,
or, when the parent is in another process, one row under where that parent would be.
When the pending buffer is full, what waits under the oldest waiting span is drawn at
once (:attr:`TraceIssues.pending_overflow`: drawn early, not lost, so not a drop): its
topmost waiting ancestor, whose own parent has not come, one row under the lane's top
(where a child of the root goes: a proof's root ends last), with the subtree that waited
under it. A parent that arrives after all is not too late: the spans drawn before it are
under it already (a root's children) or the lane is drawn again with them under it
(:attr:`TraceIssues.late`), and the summary says "drawn late", not "parent never
received". Whatever the order, the final picture is the one the spans would give sent
parents first (tested with hypothesis), except in a lane too large to redraw (over
``MAX_GROUP_SPANS``) whose late parent is not the root: there the spans stay where they
were drawn and the summary says so (:attr:`TraceIssues.stranded`).

A span that the rules of :mod:`otel_proofscope.mapping` renamed carries its original
name in ``proofscope.mapping.source_name``; its box reads ``source → contract``.
"""

from __future__ import annotations

import math
import os
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import rerun as rr
from opentelemetry.sdk.resources import SERVICE_NAME

from otel_proofscope.otlp.sdk_fields import span_attributes, span_events_unread
from otel_proofscope.rerun.columns import PROOF_TIME, Frame
from otel_proofscope.rerun.flame import (
    BOX_HALF_HEIGHT,
    EARLY,
    MAX_GROUP_SPANS,
    MIN_LABEL_PX,
    ORPHAN,
    PX_PER_UNIT,
    REMOTE,
    ROOT,
    Group,
    Lanes,
    Placed,
    fit_label,
)
from otel_proofscope.rerun.round_outline import full, outline
from otel_proofscope.semconv import Attr, EventName

FLAME = "trace/flame"
LOGS = "trace/logs"
DURATIONS = "trace/durations"

ENV_WAIT = "PROOFSCOPE_TRACE_WAIT_S"
#: Seconds a span waits for its parent before it is drawn as an orphan: long enough for
#: a real proof (its spans wait for the root, which ends last).
DEFAULT_WAIT_S = 600.0
#: A span whose parent is in another process waits at most this long: that parent
#: often goes elsewhere (``proofscope run``'s own span, a caller's backend).
REMOTE_WAIT_S = 10.0
#: Spans waiting for a parent, all traces together (beyond, the topmost waiting
#: ancestor of the oldest is drawn early, one row under its lane's top).
MAX_PENDING = 32768
#: Parents followed up from a waiting span to the top of what waits with it.
MAX_TOP_WALK = 256
#: Placed span ids remembered (for the depth of later children), all traces together.
MAX_PLACED = 1 << 18
#: Distinct duration series (service, span name); further ones share
#: ``trace/durations/_other/_other`` (counted as ``trace_duration_series``, a display
#: cap: the points are drawn, in the shared series).
MAX_SERIES = 1024
#: Services with a span log entity of their own; further ones share
#: ``trace/logs/_other`` (counted as ``trace_log_services``, a display cap).
MAX_LOG_SERVICES = 1024
#: Attributes shown per span, characters per text row.
MAX_ATTRS = 24
MAX_TEXT = 500
#: Length of the first and the last event in a span row's event summary.
MAX_EVENT_TEXT = 160
#: Outline width of the boxes, in UI points (a negative radius in Rerun).
OUTLINE = -1.5
#: Cross-trace links remembered (root → the span it hangs under); cleared when full.
MAX_LINKS = 65536
#: Links read per span (sp1-cluster sets one each way).
MAX_SPAN_LINKS = 8
#: Keys of evicted lanes remembered (so a late span of one starts a fresh entity).
MAX_EVICTED_KEYS = 65536
#: Box rows built before they are turned into columns (a redraw of a 65,536-span lane
#: held ~400 B of Python tuples and strings a row until its one send: a ~30 MiB peak
#: that the allocator kept as arenas; as columns a row is ~60 B).
SEND_ROWS = 8192

#: Set by the mapping rules (semconv.Attr.MAPPING_SOURCE_NAME once that lands).
SOURCE_NAME: str = getattr(Attr, "MAPPING_SOURCE_NAME", "proofscope.mapping.source_name")

_LEVELS = {"TRACE": "TRACE", "DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARN",
           "WARNING": "WARN", "ERROR": "ERROR", "CRITICAL": "CRITICAL"}

ERROR_RGBA = 0xE53935FF
ORPHAN_RGBA = 0x9E9E9EFF
#: Service colours (no red: red marks ERROR spans).
PALETTE = (0x429BF5FF, 0x4CC671FF, 0xF5A542FF, 0xA855D4FF, 0x38B2ACFF, 0xF5D042FF,
           0xEC6EADFF, 0x8080FFFF, 0xFF8C00FF, 0x7CB342FF)


def service_colour(service: str) -> int:
    return PALETTE[zlib.crc32(service.encode("utf-8", "replace")) % len(PALETTE)]


#: Escaped entity-path parts (services and span names repeat on every span). Bounded.
_PARTS: dict[str, str] = {}
_MAX_PARTS = 4096


def part(text: str) -> str:
    """One entity-path part from telemetry text (escaped; never empty)."""
    escaped = _PARTS.get(text)
    if escaped is None:
        escaped = rr.escape_entity_path_part(text) if text else "_"
        if type(text) is str:
            if len(_PARTS) >= _MAX_PARTS:
                _PARTS.clear()
            _PARTS[text] = escaped
    return escaped


#: Span and service names, one object per distinct text: a placed or waiting span keeps
#: its names for a later redraw, and spans decoded from the wire each bring a copy of
#: the same few names (~60 B a span). Bounded: cleared when full (not ``sys.intern``:
#: a sender chooses the names, and Python 3.12 keeps interned strings for good).
_NAMES: dict[str, str] = {}
_MAX_NAMES = 4096


def _name(text: str) -> str:
    got = _NAMES.get(text)
    if got is not None:
        return got
    if type(text) is str:
        if len(_NAMES) >= _MAX_NAMES:
            _NAMES.clear()
        _NAMES[text] = text
    return text


def _capped(path: str, seen: set[str], limit: int, other: str, issues: TraceIssues,
            reason: str) -> str:
    """``path``, or once ``seen`` holds ``limit`` paths a new one's shared ``other``
    (counted under ``reason``, a display cap: nothing is lost, the row goes to ``other``):
    every entity path costs the Rerun SDK memory for good."""
    if path in seen:
        return path
    if len(seen) >= limit:
        issues.cap(reason, 1)
        return other
    seen.add(path)
    return path


def wait_s_from_env() -> float:
    try:
        value = float(os.environ.get(ENV_WAIT, "") or DEFAULT_WAIT_S)
    except ValueError:
        return DEFAULT_WAIT_S
    return value if math.isfinite(value) and value >= 0 else DEFAULT_WAIT_S


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def _event_text(fields: Any) -> str:
    """``name (k=v …)`` of one event's fields, its attributes capped like a row's."""
    name, attrs = fields[0], fields[2]
    if type(name) is not str:
        name = str(name or "")
    if type(attrs) is not dict:
        attrs = _mapping(attrs)
    text = format_attrs(attrs)
    text = f"{name} ({text})" if text else name
    return text if len(text) <= MAX_EVENT_TEXT else text[:MAX_EVENT_TEXT - 2] + "…)"


def _value(v: object) -> str:
    t = type(v)
    if t is str:  # the common cases first: no isinstance chain, no copy
        return v if len(v) <= 80 else v[:77] + "…"  # type: ignore[index, arg-type, return-value]
    if t is int:
        s = str(v)
    elif t is tuple or t is list or isinstance(v, tuple | list):
        first = v[:8]  # type: ignore[index]
        try:  # a round polynomial: a tuple of coefficient strings, joined as they are
            items = ",".join(first)
        except TypeError:
            items = ",".join(map(str, first))
        return f"[{items},…]" if len(v) > 8 else f"[{items}]"  # type: ignore[arg-type]
    else:
        s = str(v)
    return s if len(s) <= 80 else s[:77] + "…"


#: Attribute key sets seen (in arrival order) → the row formatter of that key set: spans
#: and events of one kind share their key set, so the sorting, capping and per-value
#: checks are compiled once per set (see :func:`_compile`). Bounded: cleared when full.
_FORMATTERS: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], str]] = {}
_MAX_FORMATTERS = 4096
#: Key sets not compiled yet → [shown keys, ``str.format`` template, rows formatted].
_PLANS: dict[tuple[Any, ...], list[Any]] = {}
#: Rows of one key set formatted by the template before it is compiled. Compiling costs
#: ~350 µs and saves ~1.5 µs a row: a stream whose key sets never repeat (dynamic
#: attribute names) must not pay a compilation per span, while a prover's round events
#: (thousands with one key set) reach it at once. Worst case: +1.4 µs a row.
COMPILE_AFTER = 256


def _template(keys: list[str], more: int) -> str:
    def esc(text: str) -> str:
        return text.replace("{", "{{").replace("}", "}}")

    return " ".join(f"{esc(k)}={{}}" for k in keys) + (f" (+{more} more)" if more > 0 else "")


def _compile(keys: list[str], more: int) -> Callable[[Mapping[str, Any]], str]:
    """The ``k=v`` row of ``keys`` (sorted, capped) as one generated function.

    Why generated: this row is built for every span and every span event the trace view
    draws (16+ per layer span), and a generic loop (a key list, a value list, a call per
    value, ``str.format``) cost ~3 µs per row against ~1 µs for straight-line code.
    Only generated identifiers appear in the source; the keys and the text between the
    values are bound as constants, so no telemetry text is ever compiled.
    """
    consts: dict[str, Any] = {"_value": _value, "_str": str, "_int": int}
    body = ["def row(a):"]
    parts: list[str] = []
    for i, key in enumerate(keys):
        consts[f"k{i}"] = key
        consts[f"c{i}"] = (" " if i else "") + key + "="
        # As _value() writes it: str and int clipped at 80, sequences by their items.
        body += [f"    x{i} = a[k{i}]",
                 f"    t = type(x{i})",
                 "    if t is _int:",
                 f"        x{i} = str(x{i})",
                 "    elif t is not _str:",
                 f"        x{i} = _value(x{i})",
                 "        t = None",
                 f"    if t is not None and len(x{i}) > 80:",
                 f"        x{i} = x{i}[:77] + '…'",
                 ]
        parts.append(f"{{c{i}}}{{x{i}}}")
    if more > 0:
        consts["tail"] = f" (+{more} more)"
        parts.append("{tail}")
    body.append("    return f'" + "".join(parts) + "'")
    namespace = dict(consts)
    exec("\n".join(body), namespace)  # generated identifiers only (see above)
    return namespace["row"]  # type: ignore[no-any-return]


def format_attrs(attrs: Mapping[str, Any]) -> str:
    """``k=v`` pairs, sorted, capped (what a reader needs to tell spans apart)."""
    if not attrs:
        return ""
    names = tuple(attrs)
    row = _FORMATTERS.get(names)
    if row is not None:
        return row(attrs)
    plan = _PLANS.get(names)
    if plan is None:
        keys = sorted(str(k) for k in names)
        shown, more = keys[:MAX_ATTRS], len(keys) - MAX_ATTRS
        if not all(type(k) is str for k in names):  # (1,) == (True,): only str keys
            return _template(shown, more).format(*[_value(attrs[k]) for k in shown])
        if len(_PLANS) >= _MAX_FORMATTERS:
            _PLANS.clear()
        plan = _PLANS[names] = [shown, _template(shown, more), 0]
    plan[2] += 1
    if plan[2] >= COMPILE_AFTER:
        if len(_FORMATTERS) >= _MAX_FORMATTERS:
            _FORMATTERS.clear()
        _FORMATTERS[names] = _compile(plan[0], len(names) - MAX_ATTRS)
        _PLANS.pop(names, None)
    shown_keys: list[str] = plan[0]
    template: str = plan[1]
    # Short strings, the most common value, inline (a call per value adds up).
    return template.format(*[v if type(v) is str and len(v) <= 80 else _value(v)
                             for v in [attrs[k] for k in shown_keys]])


def format_ms(ns: int) -> str:
    ms = ns / 1e6
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


@dataclass(slots=True)
class Rec:
    """What the trace view needs of one span, read once and defensively."""

    trace_id: int
    span_id: int
    parent_id: int  # 0: a root
    name: str
    service: str
    start: int
    end: int
    error: bool
    status_message: str
    attrs: Mapping[str, Any]
    events: Sequence[Any]
    parent_remote: bool = False  # the parent lives in another process (trace context)
    call: int = 0  # the translate() call it arrived in
    links: tuple[tuple[int, int], ...] = ()  # (trace, span) of each linked span

    @property
    def duration(self) -> int:
        return self.end - self.start


def _mapping(a: object) -> Mapping[str, Any]:
    if a is None:
        return {}
    inner = getattr(a, "_dict", None)
    return inner if isinstance(inner, dict) else a if isinstance(a, Mapping) else {}


def _attrs(obj: object) -> Mapping[str, Any]:
    return _mapping(getattr(obj, "attributes", None))


def read_span(span: Any) -> Rec | None:
    """A :class:`Rec` from a ``ReadableSpan`` (None: no trace or span id, not drawable)."""
    ctx = getattr(span, "context", None)
    trace_id = getattr(ctx, "trace_id", 0)
    span_id = getattr(ctx, "span_id", 0)
    if type(trace_id) is not int or type(span_id) is not int or not trace_id or not span_id:
        return None
    parent = getattr(span, "parent", None)
    parent_id = getattr(parent, "span_id", 0) if parent is not None else 0
    if type(parent_id) is not int or parent_id == span_id:
        parent_id = 0
    remote = parent_id != 0 and getattr(parent, "is_remote", False) is True
    start = getattr(span, "start_time", None)
    end = getattr(span, "end_time", None)
    start = start if type(start) is int and start > 0 else (end if type(end) is int else 0)
    end = end if type(end) is int and end >= start else start
    status = getattr(span, "status", None)
    code = getattr(getattr(status, "status_code", None), "name", "UNSET")
    message = getattr(status, "description", None) or ""
    resource = getattr(span, "resource", None)
    service = _attrs(resource).get(SERVICE_NAME) if resource is not None else None
    attrs = span_attributes(span)
    if type(attrs) is not dict:
        attrs = _mapping(attrs)
    name = str(getattr(span, "name", "") or "")
    events = span_events_unread(span)  # read by events_fields: round records stay unbuilt
    return Rec(trace_id, span_id, parent_id, name,
               service if isinstance(service, str) and service else "unknown_service",
               start, end, code == "ERROR", str(message), attrs, events, remote,
               links=_links(span))


def _links(span: Any) -> tuple[tuple[int, int], ...]:
    """(trace, span) of the span's links (the first :data:`MAX_SPAN_LINKS` valid)."""
    # The SDK's own list first: its ``links`` property copies it into a tuple per read.
    links = getattr(span, "_links", None)
    if links is None:
        links = getattr(span, "links", None)
    if not links:
        return ()
    out: list[tuple[int, int]] = []
    try:
        for link in links:
            ctx = getattr(link, "context", None)
            t, s = getattr(ctx, "trace_id", 0), getattr(ctx, "span_id", 0)
            if type(t) is int and type(s) is int and t and s:
                out.append((t, s))
                if len(out) >= MAX_SPAN_LINKS:
                    break
    except Exception:  # a hostile links object: the span is still drawn, unlinked
        pass
    return tuple(out)


def _waiting(rec: Rec) -> Rec:
    """``rec`` as it waits for its parent: only what its box needs. Its log rows and
    duration point are already emitted, and holding the span's own attribute dict and
    event list kept every waiting span's payload alive (a 16-round layer span: ~17 KB,
    so the 32,768 that may wait held ~550 MB; slim, a few hundred bytes each)."""
    source = rec.attrs.get(SOURCE_NAME)
    return Rec(rec.trace_id, rec.span_id, rec.parent_id, _name(rec.name),
               _name(rec.service), rec.start, rec.end, rec.error, "",
               {SOURCE_NAME: source} if isinstance(source, str) and source else _NO_ATTRS,
               (), rec.parent_remote, rec.call, rec.links)


_NO_ATTRS: Mapping[str, Any] = {}
#: Static and empty: shadow the temporal rows of a layout drawn again elsewhere.
_EMPTY_BOXES = rr.Boxes2D(half_sizes=np.zeros((0, 2), dtype=np.float32))
_EMPTY_POINTS = rr.Points2D(positions=np.zeros((0, 2), dtype=np.float32))
_LOG_EVENT = EventName.LOG


@dataclass
class TraceIssues:
    """What one call drew and could not (the sink counts these)."""

    received: int = 0
    drawn: int = 0  # boxes placed (spans fully drawn)
    orphans: int = 0  # of which drawn without their parent (negative: parents came)
    #: Spans drawn before their parent arrived, moved under it when it did (this call).
    late: int = 0
    #: Spans drawn before their parent arrived that stay where they were when it did:
    #: their lane is too large to redraw (over ``MAX_GROUP_SPANS``).
    stranded: int = 0
    #: translate() call the drawn spans arrived in → how many (a span drawn in a later
    #: call than its own was settled with its batch then: the sink needs to know).
    drawn_calls: dict[int, int] = field(default_factory=dict)
    pending: int = 0  # waiting for a parent after this call
    invalid: int = 0  # no trace / span id: not drawable
    pending_overflow: int = 0  # drawn early (as orphans) because the wait was full
    redrawn: int = 0  # spans drawn again (a late parent, an earlier start, a link)
    #: Links that could not be drawn (display only: every span is still drawn): links
    #: forgotten when the table was full, traces kept in their own lane as too big.
    links_forgotten: int = 0
    unlinked: int = 0
    capped: dict[str, int] = field(default_factory=dict)

    def cap(self, what: str, n: int) -> None:
        if n > 0:
            self.capped[what] = self.capped.get(what, 0) + n

    def drawn_outside(self, calls: set[int]) -> int:
        """Spans drawn here that arrived in none of ``calls``."""
        return sum(n for call, n in self.drawn_calls.items() if call not in calls)


@dataclass(eq=False, slots=True)
class _Trace:
    key: str
    #: The trace id, one object for every span of the trace kept (each span decoded
    #: from the wire brings its own 128-bit int, 44 B).
    tid: int
    group: Group | None = None  # the lane it is drawn in (None: nothing placed yet)


@dataclass(eq=False, slots=True)
class _Pending:
    rec: Rec
    since: float  # monotonic arrival time
    seq: int  # arrival number: the same span sent twice waits (and is drawn) twice
    queued: bool = True  # still waiting (False: placed or forgotten, left for _Queue)


class _Queue:
    """Waiting spans, oldest first: a deque whose entries are left in place when their
    span stops waiting and dropped when they reach the head (or when they outnumber the
    live ones). An ``OrderedDict`` keyed by arrival did the same with a 144-byte node
    per waiting span, over a third of what a waiting span cost (tracemalloc, 32,768
    waiting spans of one trace)."""

    __slots__ = ("_items", "live")

    def __init__(self) -> None:
        self._items: deque[_Pending] = deque()
        self.live = 0

    def push(self, p: _Pending) -> None:
        self._items.append(p)
        self.live += 1

    def remove(self, p: _Pending) -> None:
        if p.queued:
            p.queued = False
            self.live -= 1
            if len(self._items) > 2 * self.live + 1024:  # amortized: bounded dead entries
                self._items = deque(q for q in self._items if q.queued)

    def head(self) -> _Pending | None:
        items = self._items
        while items and not items[0].queued:
            items.popleft()
        return items[0] if items else None

    def __len__(self) -> int:
        return self.live

    def __iter__(self) -> Iterator[_Pending]:
        return (p for p in list(self._items) if p.queued)


class _Boxes:
    """Flame-chart rows of one entity in one batch (one box per row)."""

    __slots__ = ("anchors", "centers", "colours", "half", "labels", "shown", "times")

    def __init__(self) -> None:
        self.times: list[int] = []
        self.centers: list[tuple[float, float]] = []
        self.half: list[tuple[float, float]] = []
        self.colours: list[int] = []
        self.labels: list[str] = []  # the whole label (on hover)
        self.shown: list[str | None] = []  # the label drawn in the box (None: none fits)
        self.anchors: list[tuple[float, float]] = []  # where that label hangs from


class TraceTranslator:
    """Turns batches of finished spans into trace-view rows; remembers layouts and waits.

    Deterministic and free of I/O: time (``now``, monotonic seconds) is passed in.
    """

    def __init__(self, *, wait_s: float | None = None, max_pending: int = MAX_PENDING,
                 max_placed: int = MAX_PLACED, remote_wait_s: float = REMOTE_WAIT_S) -> None:
        self.wait_s = wait_s_from_env() if wait_s is None else wait_s
        self.max_pending = max(1, max_pending)
        self.max_placed = max(1, max_placed)
        self._traces: dict[int, _Trace] = {}
        self._groups: OrderedDict[int, Group] = OrderedDict()  # id() → group, LRU first
        self._lanes = Lanes()
        self._keys: dict[str, int] = {}
        self._placed = 0
        #: Traces given a lane so far (one evicted and seen again counts again): with
        #: ``len(_traces)`` it says how many the view has forgotten.
        self.traces_seen = 0
        # trace id → parent span id → spans waiting for it (arrival order)
        self._pending: dict[int, dict[int, list[_Pending]]] = {}
        # Waiting spans by arrival (oldest first): a parent in this process's trace, and a
        # parent in another process (``parent_remote``), which waits less.
        self._queue = _Queue()
        self._remote = _Queue()
        # span id → its entry while it waits: a full wait draws the topmost waiting
        # ancestor of its oldest span, so that subtree keeps its shape.
        self._waiting_ids: dict[int, _Pending] = {}
        self.remote_wait_s = min(self.wait_s, remote_wait_s)
        # Links between traces: a root (trace, span) → the span it hangs under, and back.
        self._under: dict[tuple[int, int], tuple[int, int]] = {}
        self._hanging: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._shadow: list[str] = []  # entities of earlier layouts, to hide
        # Keys of evicted lanes → the next free generation (bounded, oldest first out).
        self._evicted: OrderedDict[str, int] = OrderedDict()
        self._seq = 0
        self._call = 0
        self._series: set[str] = set()
        self._log_paths: set[str] = set()
        self._styled: set[str] = set()

    # ── public ───────────────────────────────────────────────────────────────────────

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._remote)

    def _queues(self) -> tuple[tuple[_Queue, float], ...]:
        return (self._queue, self.wait_s), (self._remote, self.remote_wait_s)

    def _unqueue(self, p: _Pending) -> None:
        (self._remote if p.rec.parent_remote else self._queue).remove(p)
        if self._waiting_ids.get(p.rec.span_id) is p:
            del self._waiting_ids[p.rec.span_id]

    def _waiting_top(self, p: _Pending) -> _Pending:
        """The topmost span of ``p``'s trace that waits with ``p`` under it: its parent is
        missing (not merely waiting too), so drawing it early draws ``p`` where it
        belongs under it. Bounded: a hostile cycle of parents stops the walk."""
        for _ in range(MAX_TOP_WALK):
            up = self._waiting_ids.get(p.rec.parent_id)
            if up is None or up.rec.trace_id != p.rec.trace_id:
                break
            p = up
        return p

    def translate(self, spans: Sequence[Any], frame: Frame, *, now: float) -> TraceIssues:
        issues = TraceIssues(received=len(spans))
        self._call += 1
        recs: list[Rec] = []
        for span in spans:
            try:
                rec = read_span(span)
            except Exception:  # a hostile object must never stop the batch
                rec = None
            if rec is None:
                issues.invalid += 1
                continue
            rec.call = self._call
            recs.append(rec)
        # Parents first within a batch (earlier start), so most spans place at once.
        recs.sort(key=lambda r: (r.start, -r.end, r.span_id))
        for rec in recs:
            self._log_and_series(rec, frame, issues)
            if rec.links:
                self._note_links(rec, issues)
            if rec.parent_id == 0:
                self._place(rec, None, ROOT, issues)
                continue
            parent = self._find(rec.trace_id, rec.parent_id)
            if parent is not None:
                self._place(rec, parent, ROOT, issues)
            else:
                self._wait(rec, now, issues)
        self._expire(now, issues)
        self._emit(frame, issues)
        issues.pending = self.pending
        return issues

    def expire(self, now: float, frame: Frame) -> TraceIssues:
        """Draw as orphans the spans that waited their wait or longer."""
        issues = TraceIssues()
        self._call += 1  # a call of its own: what it draws arrived earlier
        self._expire(now, issues)
        self._emit(frame, issues)
        issues.pending = self.pending
        return issues

    def _expire(self, now: float, issues: TraceIssues) -> None:
        for queue, wait in self._queues():
            while (first := queue.head()) is not None:
                if now - first.since < wait:
                    break
                self._orphan(first, issues)

    @property
    def last_call(self) -> int:
        return self._call

    def discard_last_call(self) -> int:
        """Forget the spans of the last call that still wait (its frame was not sent and
        its batch is counted lost as a whole); returns how many."""
        return self.discard_calls({self._call})

    def discard_calls(self, calls: set[int]) -> int:
        """Forget the spans that arrived in ``calls`` (batches counted lost): those still
        waiting, and those drawn (a later redraw must not bring them back)."""
        gone = [p for queue, _ in self._queues() for p in queue if p.rec.call in calls]
        for p in gone:
            self._unqueue(p)
            by_parent = self._pending.get(p.rec.trace_id, {})
            siblings = by_parent.get(p.rec.parent_id, [])
            if p in siblings:
                siblings.remove(p)
                if not siblings:
                    by_parent.pop(p.rec.parent_id, None)
            if not by_parent:
                self._pending.pop(p.rec.trace_id, None)
        for g in self._groups.values():
            drop = [k for k, s in g.spans.items() if s.call in calls]
            for k in drop:
                del g.spans[k]
            self._placed -= len(drop)
        return len(gone)

    def drain(self, frame: Frame) -> TraceIssues:
        """Shutdown: draw every waiting span as an orphan, and draw tight the lanes that
        kept room to grow."""
        issues = TraceIssues()
        self._call += 1
        self._expire(math.inf, issues)
        for g in self._groups.values():
            if g.emitted and not g.frozen and g.slack() > 0:
                g.dirty = True
                g.tight = True
        self._emit(frame, issues)
        issues.pending = self.pending
        return issues

    def next_expiry(self, now: float) -> float | None:
        """Seconds until the oldest waiting span expires (None: nothing waits)."""
        due = [head.since + wait - now for queue, wait in self._queues()
               if (head := queue.head()) is not None]
        return max(0.0, min(due)) if due else None

    # ── placement ────────────────────────────────────────────────────────────────────

    def _trace(self, trace_id: int) -> _Trace:
        trace = self._traces.get(trace_id)
        if trace is not None:
            return trace
        key = f"{trace_id:032x}"[:8]
        if self._keys.get(key, trace_id) != trace_id:
            key = f"{trace_id:032x}"[:16]  # two traces sharing 8 hex digits stay apart
        self._keys[key] = trace_id
        trace = self._traces[trace_id] = _Trace(key, trace_id)
        self.traces_seen += 1
        return trace

    def _group(self, trace_id: int) -> Group:
        trace = self._trace(trace_id)
        g = trace.group
        if g is None:
            g = trace.group = Group(trace.key, {trace_id})
            # A trace whose lane was evicted: its next lane must not write into (nor,
            # redrawn, shadow) the entities of the one still shown.
            g.gen = self._evicted.pop(trace.key, 0)
            self._groups[id(g)] = g
        else:
            self._groups.move_to_end(id(g))
        return g

    def _find(self, trace_id: int, span_id: int) -> Placed | None:
        trace = self._traces.get(trace_id)
        if trace is None or trace.group is None:
            return None
        return trace.group.find((trace_id, span_id))

    def _place(self, rec: Rec, parent: Placed | None, how: int, issues: TraceIssues) -> None:
        """Draw ``rec`` (under ``parent``, else anchored ``how``), then every span that
        waited for it (iteratively)."""
        stack: list[tuple[Rec, Placed | None, int]] = [(rec, parent, how)]
        while stack:
            r, par, anchor = stack.pop()
            g = self._group(r.trace_id)
            # Shared objects where the value is one already kept: the trace's id, the
            # parent's own span id, the names (what a placed span costs is what a
            # long trace keeps, decision 6 of issue 29).
            p = Placed(self._traces[r.trace_id].tid, r.span_id,
                       par.span_id if par is not None else r.parent_id, r.start, r.end,
                       _name(r.service), _name(self._label(r)), r.error, r.parent_remote,
                       r.call)
            if par is not None:
                p.tree, p.row = par.tree, par.row + 1
            elif anchor == REMOTE:
                p.row, p.orphan = 1, True
            elif anchor == ORPHAN:
                p.tree, p.orphan = False, True
            elif anchor == EARLY:  # where a child of the lane's root goes: most likely
                p.row, p.orphan, p.early = 1, True, True
            if p.orphan:
                missing = (r.trace_id, r.parent_id)
                if g.frozen:  # kept slim, never redrawn: how many is all that is needed
                    strays = g.stray_early if p.early else g.stray
                    strays[missing] = strays.get(missing, 0) + 1
                else:
                    g.orphans.setdefault(missing, []).append(p)
            key = (r.trace_id, r.span_id)
            if key in g:
                self._placed -= 1  # the same span sent twice: drawn twice, kept once
            g.add(p, key)
            self._placed += 1
            issues.drawn += 1
            issues.orphans += p.orphan
            issues.drawn_calls[r.call] = issues.drawn_calls.get(r.call, 0) + 1
            # Drawn before it came: its orphans move under it when the lane is redrawn
            # (counted late or stranded then, by _emit).
            late = g.orphans.pop(key, None)
            # Drawn early one row under the top, under a root: already where they belong.
            in_place = p.tree and p.row == 0
            if late:
                for o in late:
                    if o.orphan:
                        g.adopted.append((o, in_place and o.early))
                        o.orphan = o.early = False
                        issues.orphans -= 1
                g.dirty = True
            if g.stray or g.stray_early:  # a frozen lane's, drawn where they stay
                stray, early = g.stray.pop(key, 0), g.stray_early.pop(key, 0)
                issues.orphans -= stray + early
                issues.late += early if in_place else 0
                issues.stranded += stray + (0 if in_place else early)
            if r.parent_id == 0 or key in self._hanging:
                self._link(p, g, issues)
            waiting = self._pending.get(r.trace_id, {}).pop(r.span_id, None)
            if waiting:
                for w in waiting:
                    self._unqueue(w)
                    stack.append((w.rec, p, ROOT))
            if r.trace_id in self._pending and not self._pending[r.trace_id]:
                del self._pending[r.trace_id]

    def _note_links(self, rec: Rec, issues: TraceIssues) -> None:
        """Remember which root hangs under which span of another trace: a root's own
        link, or a span's link to the root of another trace (sp1-cluster sets both)."""
        me = (rec.trace_id, rec.span_id)
        for other in rec.links:
            if other[0] == rec.trace_id:
                continue
            child, under = (me, other) if rec.parent_id == 0 else (other, me)
            if child in self._under:
                continue
            if len(self._under) >= MAX_LINKS:
                issues.links_forgotten += len(self._under)
                self._under.clear()
                self._hanging.clear()
            self._under[child] = under
            self._hanging.setdefault(under, []).append(child)

    def _link(self, p: Placed, g: Group, issues: TraceIssues) -> None:
        """``p`` is drawn: hang it under its linked span, or the roots linked to it
        under it, when both are drawn (their lanes become one)."""
        if p.parent_id == 0:
            under = self._under.get(p.key)
            if under is not None:
                p.link = under
                target = self._find(*under)
                if target is not None:
                    self._merge(self._group(under[0]), g, issues)
        for child in self._hanging.get(p.key, ()):
            c = self._find(*child)
            if c is not None and c.parent_id == 0:
                c.link = p.key
                # p's lane as it is now (the merge above may have moved it)
                self._merge(self._group(p.trace_id), self._group(child[0]), issues)

    def _merge(self, into: Group, other: Group, issues: TraceIssues) -> None:
        into.dirty = True
        if into is other:
            return
        if into.frozen or other.frozen or len(into.spans) + len(other.spans) > MAX_GROUP_SPANS:
            issues.unlinked += 1  # too big to redraw as one: kept apart
            return
        into.spans.update(other.spans)
        for k, orphans in other.orphans.items():
            into.orphans.setdefault(k, []).extend(orphans)
        into.adopted += other.adopted
        into.traces |= other.traces
        for tid in other.traces:
            self._traces[tid].group = into
        into.lo, into.hi = min(into.lo, other.lo), max(into.hi, other.hi)
        if other.emitted:
            self._shadow += other.paths
        self._lanes.release(other)
        self._groups.pop(id(other), None)

    def _evict(self) -> None:
        """Keep at most ``max_placed`` spans: whole lanes, least recently drawn first
        (never the lane being drawn: one trace over the cap keeps its rows, slim, as its
        children need them)."""
        while self._placed > self.max_placed and len(self._groups) > 1:
            _, old = self._groups.popitem(last=False)
            self._placed -= old.size
            for tid in old.traces:
                trace = self._traces.pop(tid, None)
                if trace is not None and self._keys.get(trace.key) == tid:
                    del self._keys[trace.key]
            # Its boxes stay drawn (its room in the chart too); a later lane of the
            # same trace key starts at the next generation.
            self._evicted[old.key] = old.gen + 1
            if len(self._evicted) > MAX_EVICTED_KEYS:
                self._evicted.popitem(last=False)

    def _wait(self, rec: Rec, now: float, issues: TraceIssues) -> None:
        while self.pending >= self.max_pending:
            issues.pending_overflow += 1
            heads = [h for q, _ in self._queues() if (h := q.head()) is not None]
            oldest = min(heads, key=lambda h: h.seq)
            self._orphan(self._waiting_top(oldest), issues, early=True)
        self._seq += 1
        p = _Pending(_waiting(rec), now, self._seq)
        (self._remote if rec.parent_remote else self._queue).push(p)
        self._waiting_ids[rec.span_id] = p
        self._pending.setdefault(rec.trace_id, {}).setdefault(rec.parent_id, []).append(p)

    def _orphan(self, p: _Pending, issues: TraceIssues, *, early: bool = False) -> None:
        rec = p.rec
        self._unqueue(p)
        by_parent = self._pending.get(rec.trace_id, {})
        siblings = by_parent.get(rec.parent_id, [])
        if p in siblings:
            siblings.remove(p)
            if not siblings:
                by_parent.pop(rec.parent_id, None)
        if rec.trace_id in self._pending and not self._pending[rec.trace_id]:
            del self._pending[rec.trace_id]
        # Its parent may have been placed meanwhile only through another route: check.
        parent = self._find(rec.trace_id, rec.parent_id)
        if parent is not None:
            self._place(rec, parent, ROOT, issues)
        elif rec.parent_remote:
            # The entry point of this process into a trace begun elsewhere (``proofscope
            # run``'s TRACEPARENT, a caller that exports to another backend): under
            # wherever its parent would be, one level down from the top.
            self._place(rec, None, REMOTE, issues)
        else:
            # Its depth is unknown: the orphan rows, apart from the placed tree; or, drawn
            # early while its parent may still come, one row under the top.
            self._place(rec, None, EARLY if early else ORPHAN, issues)

    # ── rows ─────────────────────────────────────────────────────────────────────────

    def _label(self, rec: Rec) -> str:
        source = rec.attrs.get(SOURCE_NAME)
        name = f"{source} → {rec.name}" if isinstance(source, str) and source else rec.name
        return _clip(name)

    def _texts(self, p: Placed, g: Group, room: bool) -> tuple[str, list[str], int]:
        """The whole label (hover), the labels that may be drawn (longest first; none
        unless ``room``), and the box colour."""
        dur = format_ms(p.end - p.start)
        if not room and not p.error and not p.orphan and p.link is None and not (
                p.parent_id == 0 and p.row == 0):
            return f"{p.name} {dur}", [], service_colour(p.service)  # the common case
        full = f"{p.name} {dur}"
        shown = [full, p.name]
        short = p.name.split(" (", 1)[0]  # viztracer's "fold (work.py:10)": "fold"
        if short and short != p.name:
            shown.append(short)
        if p.parent_id == 0 and (p.row == 0 or p.link is not None):
            own = self._traces.get(p.trace_id)
            full += f" · trace {own.key if own else f'{p.trace_id:032x}'[:8]}"
            if p.link is not None and p.row > 0:
                full += " (linked)"  # hangs under the span it is linked to
            shown.insert(0, full)
        if p.error:
            # Plain text: the viewer's font (Inter) has no dingbats; a missing glyph
            # aborts the headless viewer.
            full += " ERROR"
            shown = [*(f"{s} ERROR" for s in shown), shown[-1]]  # red says it too
            colour = ERROR_RGBA
        elif p.orphan and not p.remote and not p.early:
            colour = ORPHAN_RGBA
        else:
            colour = service_colour(p.service)
        if p.orphan and p.remote:
            full += f" (parent {p.parent_id:016x} in another process, not received)"
        elif p.early:  # true whatever comes later (a frozen lane keeps this box)
            full += f" (drawn before its parent {p.parent_id:016x}: the wait was full)"
        elif p.orphan:
            full += f" (orphan: parent {p.parent_id:016x} not received)"
            shown.insert(0, f"{shown[-1]} (orphan)")
        return full, shown, colour

    def _box(self, p: Placed, g: Group, boxes: dict[str, _Boxes], frame: Frame) -> None:
        scale = g.scale
        x0 = max(0.0, (p.start - g.t0) * scale)  # clipped only in a frozen lane
        width = max(0.0, (p.end - g.t0) * scale - x0)
        y = g.y(p)
        room = width * PX_PER_UNIT >= MIN_LABEL_PX
        full, shown, colour = self._texts(p, g, room)
        path = f"{FLAME}/{part(p.service)}/{g.key}" + (f".{g.gen}" if g.gen else "")
        b = boxes.get(path)
        if b is None:
            b = boxes[path] = _Boxes()
            g.paths.add(path)
        b.times.append(p.start)
        b.centers.append((x0 + width / 2, y))
        b.half.append((width / 2, BOX_HALF_HEIGHT))
        b.colours.append(colour)
        b.labels.append(full)
        b.shown.append(fit_label(width, shown) if room else None)
        b.anchors.append((x0 + width / 2, y - BOX_HALF_HEIGHT))
        if len(b.times) >= SEND_ROWS:
            self._send(path, b, frame)
            del boxes[path]

    def _log_and_series(self, rec: Rec, frame: Frame, issues: TraceIssues) -> None:
        svc = part(rec.service)
        self._trace(rec.trace_id)  # its key, from its first span on (8 or 16 digits)
        # One entity per service, not per trace: the Rerun SDK keeps native memory for
        # every entity path it has seen (~1.4 KB more a row than a path reused,
        # bench_rerun_entities.py), for the life of the recording (issue 28 item 11).
        # The span log shows rows, not paths (its entity column is hidden).
        logs = _capped(f"{LOGS}/{svc}", self._log_paths, MAX_LOG_SERVICES,
                       f"{LOGS}/_other", issues, "trace_log_services")
        attrs = format_attrs(rec.attrs)
        text = f"{self._label(rec)} {format_ms(rec.duration)}"
        if rec.error:
            text += f" ERROR: {rec.status_message or 'error'}"
        elif rec.status_message:
            text += f" ({rec.status_message})"
        if attrs:
            text += " · " + attrs
        try:  # the SDK's own events (every received or recorded one): one read each
            fields = outline(rec.events) if rec.events else []
        except Exception:  # a hostile object: read it defensively, field by field
            fields = [(getattr(ev, "name", ""), getattr(ev, "timestamp", None), _attrs(ev), 0)
                      for ev in rec.events]
        text = _clip(text)
        if fields:  # its own cap: a long span row never cuts the events' summary off
            text += self._events_rows(rec, fields, logs, frame)
        frame.text(logs, rec.end, text, "ERROR" if rec.error else "INFO")
        # One shared series beyond the cap (per service would be unbounded).
        series = _capped(f"{DURATIONS}/{svc}/{part(rec.name)}", self._series, MAX_SERIES,
                         f"{DURATIONS}/_other/_other", issues, "trace_duration_series")
        if series not in self._styled:
            self._styled.add(series)
            title = f"{rec.name} ms ({rec.service})" if not series.endswith("/_other") \
                else f"other span names, beyond {MAX_SERIES} series (ms)"
            frame.static(series, rr.SeriesLines(names=[_clip(title)]))
        frame.scalar(series, rec.end, rec.duration / 1e6)

    def _events_rows(self, rec: Rec, fields: Sequence[Any], logs: str,
                     frame: Frame) -> str:
        """The span's events in its log: a log line or an exception is a row of its own
        (its own time and level); the rest, a prover's rounds, checkpoints and the like,
        are summarized on the span's row (how many, the first and the last). The rounds
        are already drawn whole in the walk and its series; a row per round made the log
        the trace view's main cost (decision 3 of issue 29). Returns the summary."""
        times: list[int] = []
        bodies: list[str] = []
        levels: list[str] = []
        head = f"{rec.name} › "
        end = rec.end
        log_name = _LOG_EVENT
        first: Any = None
        last: Any = None
        summarized = 0
        for item in fields:
            name = item[0]
            if name != log_name and name != "exception":  # the hot path: a round
                if first is None:
                    first = item
                last = item
                summarized += 1
                continue
            t, ea = item[1], item[2]
            if type(ea) is not dict:
                ea = _mapping(ea)
            level = "ERROR" if name == "exception" else "INFO"
            body = head + name
            message = ea.get(Attr.LOG_MESSAGE) if name == log_name else None
            if isinstance(message, str):
                # A bridged log line (EZKL's Rust logs, proof-stream Log): its own level.
                level = _LEVELS.get(str(ea.get(Attr.LOG_LEVEL, "")).upper(), "INFO")
                ea = {k: v for k, v in ea.items() if k not in (Attr.LOG_MESSAGE,
                                                               Attr.LOG_LEVEL)}
                body = head + message
            if ea:
                body += " · " + format_attrs(ea)
            times.append(t if type(t) is int and t > 0 else end)
            bodies.append(body if len(body) <= MAX_TEXT else body[:MAX_TEXT] + "…")
            levels.append(level)
        if times:
            frame.texts(logs, times, bodies, levels)
        if not summarized:
            return ""
        if summarized == 1:
            return f" · 1 event: {_event_text(full(first))}"
        return (f" · {summarized} events, first: {_event_text(full(first))}; "
                f"last: {_event_text(full(last))}")

    def _emit(self, frame: Frame, issues: TraceIssues) -> None:
        boxes: dict[str, _Boxes] = {}
        for g in list(self._groups.values()):
            if not g.new and not g.dirty:
                continue
            if g.adopted:
                self._settle_adopted(g, issues)
            if g.frozen and g.emitted:
                g.fits(g.new)
                if self._lanes.last is g:  # a frozen lane grows in place, never moves
                    self._lanes.place(g, g.rows_used())
                for p in g.new:
                    self._box(p, g, boxes, frame)
            elif g.emitted and not g.dirty and g.fits(g.new) and (
                    g.rows_used() <= g.allotted or self._lanes.last is g):
                self._lanes.place(g, g.rows_used())
                for p in g.new:
                    self._box(p, g, boxes, frame)
            else:
                self._redraw(g, issues, boxes, frame)
            g.new = []
            g.dirty = False
            g.tight = False
        for path in self._shadow:
            frame.static(path, _EMPTY_BOXES)
            frame.static(path, _EMPTY_POINTS)
        self._shadow = []
        for path, b in boxes.items():
            self._send(path, b, frame)
        self._evict()  # after drawing: a lane is never forgotten before it is drawn

    @staticmethod
    def _settle_adopted(g: Group, issues: TraceIssues) -> None:
        """Orphans whose parent came: *late* if the redraw about to happen moves them
        under it, or if they were drawn early one row under the top and it is the root;
        *stranded* if they stay where they were drawn (a frozen lane already drawn is
        never redrawn, and one frozen in its first call re-lays only the spans it keeps
        whole)."""
        redrawn = not (g.frozen and g.emitted)
        for o, in_place in g.adopted:
            if in_place or (redrawn and g.spans.get(o.key) is o):
                issues.late += 1
            else:
                issues.stranded += 1
        g.adopted = []

    def _redraw(self, g: Group, issues: TraceIssues, boxes: dict[str, _Boxes],
                frame: Frame) -> None:
        """Lay ``g`` out again from every span it keeps and draw it on a new entity."""
        if g.emitted:
            issues.redrawn += len(g.spans)
            self._shadow += g.paths
            g.paths = set()
            g.gen += 1
        if g.emitted or g.dirty:
            g.rows()
        else:
            g.count_rows()
        g.extent(tight=g.tight or not g.emitted)
        self._lanes.place(g, g.rows_used())
        g.emitted = True
        for p in g.spans.values():
            self._box(p, g, boxes, frame)
        for p in g.new:
            if p.key not in g.spans:  # placed once frozen (in its first call)
                self._box(p, g, boxes, frame)

    def _send(self, path: str, b: _Boxes, frame: Frame) -> None:
        n = len(b.times)
        order = np.argsort(np.asarray(b.times, dtype=np.int64), kind="stable")
        times = np.asarray(b.times, dtype=np.int64)[order]
        cols = rr.Boxes2D.columns(
            centers=np.asarray(b.centers, dtype=np.float32)[order],
            half_sizes=np.asarray(b.half, dtype=np.float32)[order],
            colors=np.asarray(b.colours, dtype=np.uint32)[order],
            labels=[b.labels[i] for i in order],
            show_labels=[False] * n,  # on hover; drawn by the points below
            radii=np.full(n, OUTLINE, dtype=np.float32),
        )
        # The labels that fit, hung from the top edge of their box: Rerun draws a label
        # below its anchor, so it lands inside the box, on the box's own row. In the
        # same rows as the boxes (0 or 1 point each): one row per span, as before.
        keep = [i for i in order if b.shown[i] is not None]
        columns = list(cols)
        if keep:
            lengths = np.asarray([b.shown[i] is not None for i in order], dtype=np.int32)
            columns += list(rr.Points2D.columns(
                positions=np.asarray(b.anchors, dtype=np.float32)[keep],
                radii=np.zeros(len(keep), dtype=np.float32),
                colors=np.asarray(b.colours, dtype=np.uint32)[keep],
                labels=[b.shown[i] for i in keep],
                show_labels=[True] * len(keep),
            ).partition(lengths))
        frame.columns(path, [rr.TimeColumn(PROOF_TIME, timestamp=times.astype(
            "datetime64[ns]"))], columns, n)
