"""Chrome trace-event JSON → spans, span events and counter points (pure, no I/O).

The format written by Rust's tracing-chrome, Perfetto's legacy JSON exporter, viztracer
and Chrome's own tracing: either a JSON array of events or an object whose
``traceEvents`` member is that array. What is read:

* ``ph: X`` complete events, and ``B``/``E`` pairs matched per (pid, tid) as a stack,
  become spans; async ``b``/``e`` pairs (matched per pid, category and id) too;
* ``i``/``I`` (and async ``n``) instant events become span events of the innermost span
  that encloses them on their thread, or a zero-length span of their own if none does;
* ``C`` counters become data points, one per numeric series of their ``args``;
* ``M`` metadata: ``process_name`` and ``thread_name`` name processes and threads.

Timestamps are microseconds; they are read as decimals, never as binary floats, and
become integer nanoseconds exactly (``1234.567`` µs → ``1234567`` ns; a digit beyond the
nanosecond is rounded half to even). A time outside ±2**63 ns (±292 years), or an end
that a ``dur`` pushes past it, is refused with its event (OTLP's unsigned 64-bit and
Rerun's signed 64-bit nanoseconds both hold [0, 2**63) once rebased; the importer checks
that range after the shift). A ``B`` that the file never closes (a crashed prover's
trace) ends at the last timestamp of the file and is marked.

Nesting on a thread is by time containment; spans with the very same interval nest in
the file's order (the first opened is the parent: ``B outer@0, B inner@0, E inner@10, E
outer@10`` gives outer ⊃ inner, as py-spy writes its stacks), and ``X`` events of the
same interval likewise by their position in the file.

The file is read as a stream (``ijson`` on its C backend, yajl2): memory grows with the
spans kept, not with the file's text. The spans are kept as columns (:class:`SpanTable`:
integer arrays, names and threads as indices into one table each, each span's args as
one ``marshal`` record in a shared buffer), ~100 bytes a span with two small args; a
:class:`Span` is a view built when asked for. As one Python object each they cost ~500
bytes, and a 1M-event file (107 MiB) held 530 MB of them before a span was sent.

A file that is not strictly valid JSON (cut short, a malformed stretch, NaN literals,
invalid UTF-8) is read on from the first bad entry by a tolerant reader, which holds the
file's text; byte offsets of bad entries are found by a second read only when there are
any.

Nothing is dropped silently: each array entry is either used, ignored (harmless
metadata such as ``process_sort_index``) or skipped with a reason, so
``entries == used + ignored + skipped`` always holds; the first errors name the entry
index and its byte offset. A file cut short (no closing ``]``, as tracing-chrome leaves
it when the process dies) still imports everything before the cut, and a malformed
stretch is skipped up to the next event.
"""

from __future__ import annotations

import io
import json
import marshal
import math
import operator
import re
import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import IO, Any

import ijson  # type: ignore[import-untyped]
import numpy as np

#: How many error messages a result keeps (all of them are counted).
MAX_ERRORS = 20
#: Names and arg keys repeat (a profiler's functions): one string object per distinct one.
_intern = sys.intern
#: Thread or process id as the file gives it (tracing-chrome and viztracer: ints).
Id = int | str
#: Times are kept within ±2**63 ns: what a signed 64-bit nanosecond clock (Rerun, numpy)
#: holds, and after the importer's shift what OTLP's unsigned fixed64 holds too.
TIME_LIMIT_NS = 2 ** 63
#: Bytes looked at to tell the array form from the object form.
_HEAD = 1 << 16

_THOUSAND = Decimal(1000)
# Where a new event can start after a malformed stretch: an object after a comma or at
# the start of a line (tracing-chrome and viztracer write one event per line).
_RESYNC = re.compile(r",\s*\{|\n\s*\{")
_SPAN_PHASES = frozenset("XBEbe")
_INSTANT_PHASES = frozenset("iIn")


class ChromeFormatError(ValueError):
    """The input is not a Chrome trace-event file at all (nothing could be read)."""


_NO_ARGS: dict[str, Any] = {}  # shared by every event without args: never mutated
_NO_EVENTS: list[Instant] = []  # shared by every span without events: never mutated
#: ``close`` of a span that no E closed (an X, b or unterminated B): after every entry.
_NEVER = 1 << 62


@dataclass(slots=True)
class Instant:
    name: str
    pid: Id
    tid: Id
    ts_ns: int
    args: dict[str, Any]
    scope: str = "t"


@dataclass(slots=True)
class Span:
    """One parsed span: a copy of its row in :class:`SpanTable` (setting a field changes
    nothing there; ``events`` is the table's own list)."""

    name: str
    pid: Id
    tid: Id
    start_ns: int
    end_ns: int
    args: dict[str, Any]
    phase: str  # "X", "B" (a B/E pair), "b" (an async pair) or "i" (a lone instant)
    category: str | None = None
    unterminated: bool = False
    parent: int | None = None  # index into ParseResult.spans
    events: list[Instant] = field(default_factory=lambda: _NO_EVENTS)
    #: position in the file of the event that opened it (B, b, X): the tie-break
    #: between spans of the same interval (the one opened first is the parent)
    seq: int = 0
    #: position in the file of the E that closed a B (unclosed: after every entry):
    #: two B/E spans nest exactly as the file opened and closed them
    close: int = _NEVER
    depth: int = 0  # nesting depth on its thread (0: a root)
    index: int = 0  # its row in ParseResult.spans


class SpanTable(Sequence[Span]):
    """The parsed spans as columns; ``table[i]`` builds the :class:`Span` of row ``i``.

    Rows are appended as spans close (an X at once, a B at its E), so the row order is
    the order the old list had. Integer columns are ``array`` (8 bytes a value, grown in
    place) with numpy views for sorting; ``parent`` and ``depth`` are written by the
    nesting. Args: one ``marshal`` record per span in one ``bytearray`` (26 bytes for
    ``{"shard": 1234, "round": 4}``; marshal keeps ints of any size, floats, strings,
    lists and dicts exactly, and its interned keys load as one object each). Decimals
    (non-integer numbers, read exactly) are marshalled as 1-tuples of their text, which
    JSON never produces, inside a tuple that marks the record."""

    def __init__(self) -> None:
        self.start = array("q")
        self.end = array("q")
        self.seq = array("q")
        self.close = array("q")
        #: a B/E span: the ``seq`` of the B/E span open on its thread when it was
        #: opened (the file's own tree), else -1
        self.opener = array("q")
        self.parent = array("q")  # -1: a root
        self.depth = array("i")
        self.name = array("i")  # index into strings
        self.category = array("i")  # index into strings, -1: none
        self.thread = array("i")  # index into threads
        self.phase = array("B")  # ord() of the phase letter
        self.unterminated = array("B")
        self.args_at = array("q", [0])  # record i is blob[args_at[i]:args_at[i + 1]]
        self.blob = bytearray()
        self.strings: list[str] = []
        self.threads: list[tuple[Id, Id]] = []
        self._string_index: dict[str, int] = {}
        self._thread_index: dict[tuple[Id, Id], int] = {}
        #: span events by row (most spans have none)
        self.events: dict[int, list[Instant]] = {}

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> Span:  # type: ignore[override]
        n = len(self.start)
        i = operator.index(i)  # a numpy integer too; no slices (a copy of rows: ask for it)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("span index out of range")
        pid, tid = self.threads[self.thread[i]]
        cat = self.category[i]
        parent = self.parent[i]
        return Span(self.strings[self.name[i]], pid, tid, self.start[i], self.end[i],
                    self.args(i), chr(self.phase[i]),
                    None if cat < 0 else self.strings[cat], bool(self.unterminated[i]),
                    None if parent < 0 else parent, self.events.get(i, _NO_EVENTS),
                    self.seq[i], self.close[i], self.depth[i], i)

    def string(self, text: str) -> int:
        k = self._string_index.get(text)
        if k is None:
            k = self._string_index[text] = len(self.strings)
            self.strings.append(_intern(text))
        return k

    def thread_of(self, pid: Id, tid: Id) -> int:
        key = (pid, tid)
        k = self._thread_index.get(key)
        if k is None:
            k = self._thread_index[key] = len(self.threads)
            self.threads.append(key)
        return k

    def append(self, name: str, pid: Id, tid: Id, start: int, end: int,
               args: dict[str, Any], phase: str, category: str | None, seq: int, *,
               close: int = _NEVER, opener: int = -1, unterminated: bool = False) -> int:
        """Adds a span; its row."""
        row = len(self.start)
        self.start.append(start)
        self.end.append(end)
        self.seq.append(seq)
        self.close.append(close)
        self.opener.append(opener)
        self.parent.append(-1)
        self.depth.append(0)
        self.name.append(self.string(name))
        self.category.append(-1 if category is None else self.string(category))
        self.thread.append(self.thread_of(pid, tid))
        self.phase.append(ord(phase))
        self.unterminated.append(unterminated)
        if args:
            self.blob += _pack(args)
        self.args_at.append(len(self.blob))
        return row

    def args(self, i: int) -> dict[str, Any]:
        at, to = self.args_at[i], self.args_at[i + 1]
        if at == to:
            return _NO_ARGS
        value = marshal.loads(self.blob[at:to])
        return _thaw(value[0]) if isinstance(value, tuple) else value  # type: ignore[no-any-return]

    def add_event(self, i: int, instant: Instant) -> None:
        self.events.setdefault(i, []).append(instant)

    def column(self, name: str) -> np.ndarray[Any, np.dtype[Any]]:
        """A numpy view of an integer column (no copy; valid until the next append)."""
        col = getattr(self, name)
        return np.frombuffer(col, dtype=np.dtype(col.typecode)) if len(col) \
            else np.zeros(0, np.dtype(col.typecode))

    def first_start(self) -> int | None:
        return int(self.column("start").min()) if len(self) else None


def _pack(args: dict[str, Any]) -> bytes:
    try:
        return marshal.dumps(args)
    except ValueError:  # a Decimal somewhere: marshal has no type for it
        return marshal.dumps((_freeze(args),))


def _freeze(value: Any) -> Any:
    if isinstance(value, Decimal):
        return (str(value),)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_freeze(v) for v in value]
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return Decimal(value[0])
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class CounterPoint:
    name: str
    series: str
    pid: Id
    ts_ns: int
    value: int | float


@dataclass
class ParseResult:
    spans: SpanTable = field(default_factory=SpanTable)
    counters: list[CounterPoint] = field(default_factory=list)
    process_names: dict[Id, str] = field(default_factory=dict)
    thread_names: dict[tuple[Id, Id], str] = field(default_factory=dict)
    #: array entries read (each is used, ignored or skipped; a malformed stretch of
    #: JSON counts as one skipped entry)
    entries: int = 0
    used: Counter[str] = field(default_factory=Counter)  # by ph
    ignored: Counter[str] = field(default_factory=Counter)  # by what
    skipped: Counter[str] = field(default_factory=Counter)  # by reason
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS, with positions
    notes: list[str] = field(default_factory=list)
    unterminated: int = 0  # B / b never closed (imported, ending at the last timestamp)
    instants_as_spans: int = 0  # instants no span encloses (imported as 0-length spans)
    #: the first MAX_ERRORS skips as (index, byte offset or None: found after the read,
    #: reason, detail); ``errors`` is written from these when the read ends
    sites: list[tuple[int, int | None, str, str]] = field(default_factory=list)

    def skip(self, reason: str, index: int, offset: int | None, detail: str = "") -> None:
        self.skipped[reason] += 1
        if len(self.sites) < MAX_ERRORS:
            self.sites.append((index, offset, reason, detail))

    @property
    def instants(self) -> int:
        return sum(len(events) for events in self.spans.events.values())


def looks_like_chrome(head: bytes) -> bool:
    """Whether the start of a file looks like Chrome trace-event JSON (for ``auto``)."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"["):
        rest = text[1:].lstrip()
        return rest.startswith((b"{", b"]")) or not rest
    return text.startswith(b"{") and b"traceEvents" in head


def parse(data: bytes | str) -> ParseResult:
    """Everything usable in ``data``; raises :class:`ChromeFormatError` only when the
    input has no trace-event array at all."""
    raw = data.encode("utf-8", errors="surrogatepass") if isinstance(data, str) else data
    return parse_file(io.BytesIO(raw))


def parse_file(f: IO[bytes]) -> ParseResult:
    """Everything usable in the seekable binary file ``f``, read as a stream; raises
    :class:`ChromeFormatError` only when it has no trace-event array at all."""
    result = ParseResult()
    state = _State(result)
    source = _Source(f, result)
    for index, (entry, pos, error) in enumerate(source.entries()):
        result.entries += 1
        if error is not None:
            result.skip("malformed JSON", index, source.byte_offset(pos), error)
            continue
        try:
            state.event(entry, index)
        except _Skip as exc:
            result.skip(exc.reason, index, source.byte_offset(pos), exc.detail)
    state.finish()
    source.write_errors()
    return result


# ── reading the array ────────────────────────────────────────────────────────────────


class _Source:
    """The entries of a file: streamed by ijson while the JSON is valid, then by the
    tolerant text reader from the first entry ijson could not read."""

    def __init__(self, f: IO[bytes], result: ParseResult) -> None:
        self.f = f
        self.r = result
        self._offsets: _ByteOffsets | None = None

    def entries(self) -> Iterator[tuple[Any, int | None, str | None]]:
        head = self.f.read(_HEAD)
        self.f.seek(0)
        text = head.lstrip(b" \t\r\n")
        prefix = "item" if text.startswith(b"[") else \
            "traceEvents.item" if text.startswith(b"{") else None
        done = 0
        if prefix is not None:  # a BOM or anything odd goes to the tolerant reader
            try:
                for entry in ijson.items(self.f, prefix, use_float=False):
                    yield entry, None, None
                    done += 1
            except Exception:  # not strictly valid JSON: read on, tolerantly
                pass
            else:
                if done or prefix == "item":
                    return
        yield from self._tolerant(done)

    def _tolerant(self, done: int) -> Iterator[tuple[Any, int | None, str | None]]:
        text = self._text()
        for n, item in enumerate(_entries(text, self.r)):
            if n >= done:  # the first ``done`` were read by ijson already
                yield item

    def _text(self) -> str:
        self.f.seek(0)
        data = self.f.read()
        text = data.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in data \
                and "invalid UTF-8 replaced by U+FFFD" not in self.r.notes:
            self.r.notes.append("invalid UTF-8 replaced by U+FFFD")
        self._offsets = _ByteOffsets(text)
        return text

    def byte_offset(self, pos: int | None) -> int | None:
        return None if pos is None or self._offsets is None else self._offsets(pos)

    def write_errors(self) -> None:
        """``errors`` from the sites, finding the byte offsets the stream did not give
        (a second read of the file, only when something was skipped)."""
        sites = self.r.sites
        missing = {index for index, offset, _, _ in sites if offset is None}
        found: dict[int, int] = {}
        if missing:
            scratch = ParseResult()
            text = self._text()
            last = max(missing)
            for n, (_, pos, _) in enumerate(_entries(text, scratch)):
                if n in missing and pos is not None:
                    found[n] = self.byte_offset(pos) or 0
                if n >= last:
                    break
        self.r.errors = [
            f"event #{index} (byte {offset if offset is not None else found.get(index, '?')})"
            f": {reason}" + (f": {detail}" if detail else "")
            for index, offset, reason, detail in sites]


def _decoder() -> json.JSONDecoder:
    # Decimals keep timestamps exact; NaN / Infinity literals become floats and are
    # refused where a number must be finite.
    return json.JSONDecoder(parse_float=Decimal)


def _entries(text: str, result: ParseResult) -> Iterator[tuple[Any, int, str | None]]:
    """(entry, char position, None) per array entry, or (None, position, error) per
    malformed stretch."""
    decoder = _decoder()
    stripped = text.lstrip("\ufeff \t\r\n")
    start = len(text) - len(stripped)
    pos = _array_start(stripped)
    if pos is None:
        raise ChromeFormatError("not Chrome trace-event JSON: neither a JSON array of "
                                "events nor an object with a 'traceEvents' array")
    pos += start
    n = len(text)
    closed = False
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            break
        if text[pos] == "]":
            closed = True
            break
        try:
            entry, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            m = _RESYNC.search(text, max(exc.pos, pos + 1))
            if m is None and text.rfind("]") > pos:  # a last malformed entry before ]
                yield None, pos, exc.msg
                closed = True
                break
            yield None, pos, exc.msg
            if m is None:
                break
            pos = m.end() - 1
            continue
        yield entry, pos, None
        pos = end
    if not closed:
        result.notes.append("the event array is not closed (file cut short?); everything "
                            "before the cut was read")


def _array_start(text: str) -> int | None:
    if text.startswith("["):
        return 1
    if text.startswith("{"):
        m = re.search(r'"traceEvents"\s*:\s*\[', text)
        if m is not None:
            return m.end()
    return None


class _ByteOffsets:
    """Char position → UTF-8 byte offset, cheap for ASCII files (the usual case)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ascii = text.isascii()
        self._last = (0, 0)  # (char position, byte offset): positions only grow

    def __call__(self, pos: int) -> int:
        if self.ascii:
            return pos
        last_pos, last_byte = self._last if pos >= self._last[0] else (0, 0)
        byte = last_byte + len(self.text[last_pos:pos].encode("utf-8"))
        self._last = (pos, byte)
        return byte


# ── events ───────────────────────────────────────────────────────────────────────────


class _Skip(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def ts_to_ns(value: Any, what: str = "ts") -> int:
    """A microsecond timestamp (int or decimal) as exact integer nanoseconds."""
    if isinstance(value, bool) or value is None:
        raise _Skip(f"missing or invalid {what}", repr(value))
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _Skip(f"non-finite {what}", str(value))
        try:
            return int((value * _THOUSAND).to_integral_value(rounding=ROUND_HALF_EVEN))
        except (InvalidOperation, OverflowError):
            raise _Skip(f"invalid {what}", str(value)) from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Skip(f"non-finite {what}", repr(value))
        return ts_to_ns(Decimal(repr(value)), what)
    if isinstance(value, str):  # some producers quote numbers
        try:
            return ts_to_ns(Decimal(value.strip()), what)
        except InvalidOperation:
            raise _Skip(f"invalid {what}", repr(value)) from None
    raise _Skip(f"missing or invalid {what}", repr(value))


def time_ns(value: Any, what: str = "ts") -> int:
    """:func:`ts_to_ns` within ±:data:`TIME_LIMIT_NS` (a time beyond is refused)."""
    ns = ts_to_ns(value, what)
    if not -TIME_LIMIT_NS <= ns < TIME_LIMIT_NS:
        raise _Skip(f"{what} outside ±2**63 ns (what OTLP and Rerun can hold)",
                    _shown(value))
    return ns


def _end(start: int, dur: int, value: Any) -> int:
    if start + dur >= TIME_LIMIT_NS:
        raise _Skip("ts + dur ends past 2**63 ns (what OTLP and Rerun can hold)",
                    _shown(value))
    return start + dur


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: One object per distinct pid / tid (each event would otherwise hold its own int).
_IDS: dict[Any, Any] = {}


def _id(value: Any) -> Id:
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int | str):
        if len(_IDS) > 1 << 16:
            _IDS.clear()
        return _IDS.setdefault(value, value)  # type: ignore[no-any-return]
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    return str(value)


def _args(value: Any) -> dict[str, Any]:
    # No args share one empty dict (most of a profiler's events have none); the keys
    # repeat on every event of a kind, so one string object each (~100 B a span saved).
    if isinstance(value, dict) and value:
        return {_intern(k): v for k, v in value.items()}
    return _NO_ARGS


def _name(e: Mapping[str, Any]) -> str:
    name = e.get("name")
    if not isinstance(name, str) or not name:
        raise _Skip("event without a name")
    return _intern(name)


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None
        return int(value) if value == value.to_integral_value() and abs(value) < 2 ** 63 \
            else float(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


@dataclass(slots=True)
class _Open:
    """A B or b that is not closed yet (a few per thread: only these are objects)."""

    name: str
    pid: Id
    tid: Id
    start_ns: int
    args: dict[str, Any]
    category: str | None
    seq: int
    opener: int = -1  # seq of the B open on its thread when this one opened


class _State:
    def __init__(self, result: ParseResult) -> None:
        self.r = result
        self.open: dict[tuple[Id, Id], list[_Open]] = {}  # B stacks per thread
        self.open_async: dict[tuple[Any, ...], list[_Open]] = {}  # b stacks per id
        self.instants: list[Instant] = []
        self.last_ns: int | None = None

    def _seen(self, ns: int) -> int:
        if self.last_ns is None or ns > self.last_ns:
            self.last_ns = ns
        return ns

    def event(self, e: Any, seq: int = 0) -> None:
        if not isinstance(e, dict):
            raise _Skip("entry is not a JSON object", type(e).__name__)
        ph = e.get("ph")
        if not isinstance(ph, str) or not ph:
            raise _Skip("event without a 'ph'")
        pid, tid = _id(e.get("pid")), _id(e.get("tid"))
        r = self.r
        if ph == "X":
            name = _name(e)
            start = time_ns(e.get("ts"))
            dur = ts_to_ns(e.get("dur"), "dur")
            if dur < 0:
                raise _Skip("negative dur", str(e.get("dur")))
            end = _end(start, dur, e.get("dur"))
            self._seen(start)
            self._seen(end)
            r.spans.append(name, pid, tid, start, end, _args(e.get("args")), "X",
                           _category(e), seq)
        elif ph == "B":
            name = _name(e)
            start = self._seen(time_ns(e.get("ts")))
            stack = self.open.setdefault((pid, tid), [])
            stack.append(_Open(name, pid, tid, start, _args(e.get("args")), _category(e),
                               seq, stack[-1].seq if stack else -1))
        elif ph == "E":
            end = self._seen(time_ns(e.get("ts")))
            opened = self.open.get((pid, tid))
            if not opened:
                raise _Skip("'E' without an open 'B' on its thread",
                            f"pid={pid} tid={tid} name={e.get('name')!r}")
            if opened[-1].start_ns > end:
                raise _Skip("'E' before its 'B'", f"name={opened[-1].name!r}")
            o = opened.pop()
            r.spans.append(o.name, pid, tid, o.start_ns, end,
                           _merged(o.args, e.get("args")),  # Chrome merges the E's args
                           "B", o.category, o.seq, close=seq, opener=o.opener)
        elif ph in ("b", "e"):
            self._async(e, ph, pid, tid, seq)
        elif ph in _INSTANT_PHASES:
            name = _name(e)
            ts = self._seen(time_ns(e.get("ts")))
            raw_scope = e.get("s")
            scope = raw_scope if isinstance(raw_scope, str) and raw_scope in "gpt" \
                and raw_scope else "t"
            self.instants.append(Instant(name, pid, tid, ts, _args(e.get("args")), scope))
        elif ph == "C":
            self._counter(e, pid)
        elif ph == "M":
            self._metadata(e, pid, tid)
            return  # counted in _metadata (used or ignored)
        else:
            raise _Skip(f"unsupported phase '{ph}'")
        r.used[ph] += 1

    def _async(self, e: Mapping[str, Any], ph: str, pid: Id, tid: Id, seq: int) -> None:
        ident = e.get("id", e.get("id2"))
        key = (pid, _category(e), json.dumps(ident, default=str, sort_keys=True))
        ts = self._seen(time_ns(e.get("ts")))
        if ph == "b":
            self.open_async.setdefault(key, []).append(
                _Open(_name(e), pid, tid, ts, _args(e.get("args")), _category(e), seq))
            return
        stack = self.open_async.get(key)
        if not stack:
            raise _Skip("'e' without an open 'b' of the same id", f"id={ident!r}")
        if stack[-1].start_ns > ts:
            raise _Skip("'e' before its 'b'", f"id={ident!r}")
        o = stack.pop()
        self.r.spans.append(o.name, o.pid, o.tid, o.start_ns, ts,
                            _merged(o.args, e.get("args")), "b", o.category, o.seq)

    def _counter(self, e: Mapping[str, Any], pid: Id) -> None:
        name = _name(e)
        ts = self._seen(time_ns(e.get("ts")))
        args = _args(e.get("args"))
        points = [(str(k), _number(v)) for k, v in args.items()]
        good = [(k, v) for k, v in points if v is not None]
        if not good:
            raise _Skip("counter without a numeric series", f"name={name!r}")
        for series, value in good:
            assert value is not None
            self.r.counters.append(CounterPoint(name, series, pid, ts, value))

    def _metadata(self, e: Mapping[str, Any], pid: Id, tid: Id) -> None:
        name = e.get("name")
        value = _args(e.get("args")).get("name")
        if name == "process_name" and isinstance(value, str):
            self.r.process_names[pid] = value
            self.r.used["M"] += 1
        elif name == "thread_name" and isinstance(value, str):
            self.r.thread_names[(pid, tid)] = value
            self.r.used["M"] += 1
        else:
            self.r.ignored[f"metadata {name!r}"] += 1

    def finish(self) -> None:
        r = self.r
        last = self.last_ns if self.last_ns is not None else 0
        for phase, stacks in (("B", self.open), ("b", self.open_async)):
            for stack in stacks.values():
                for o in stack:
                    r.spans.append(o.name, o.pid, o.tid, o.start_ns, max(last, o.start_ns),
                                   o.args, phase, o.category, o.seq, opener=o.opener,
                                   unterminated=True)
                    r.unterminated += 1
        self.open.clear()
        self.open_async.clear()
        _nest(r.spans, self.instants, r)
        self.instants = []


def _category(e: Mapping[str, Any]) -> str | None:
    cat = e.get("cat")
    return _intern(cat) if isinstance(cat, str) and cat else None


def _merged(args: dict[str, Any], extra: Any) -> dict[str, Any]:
    more = _args(extra)
    return {**args, **more} if more else args  # never into the shared empty dict


# ── nesting ──────────────────────────────────────────────────────────────────────────

#: Rows walked per ``tolist()`` (a million Python ints at once would cost ~36 MB).
_WALK = 1 << 16


def _rows(order: np.ndarray[Any, np.dtype[Any]]) -> Iterator[int]:
    for at in range(0, len(order), _WALK):
        yield from order[at:at + _WALK].tolist()


def _nest(t: SpanTable, instants: list[Instant], r: ParseResult) -> None:
    """Parents by time containment on each thread; instants onto their innermost span.

    Spans of one thread in the order (start, longest first, file order): a parent comes
    before its children, and of two spans with the very same interval the one the file
    opened first is the parent (py-spy opens a whole stack at one timestamp and closes
    it at another). numpy sorts the columns; the walk reads them as ``array`` values
    (Python ints made one at a time, none kept)."""
    order, opener_row = _walk_order(t)
    start, end, seq, close, phase = t.start, t.end, t.seq, t.close, t.phase
    parent, depth, thread = t.parent, t.depth, t.thread
    b = ord("B")

    def encloses(outer: int, inner: int) -> bool:
        """Whether ``inner`` (later in the containment order) nests in ``outer``. Two
        B/E spans by the file's own stack (opened after and closed before), which also
        keeps a zero-length span at its predecessor's end out of it; else by time."""
        if phase[outer] == b and phase[inner] == b:
            return seq[outer] < seq[inner] and close[inner] < close[outer] \
                and start[outer] <= start[inner] and end[inner] <= end[outer]
        return start[outer] <= start[inner] and end[inner] <= end[outer]

    stack: list[int] = []
    current = -1
    for i in _rows(order):
        if thread[i] != current:
            current = thread[i]
            stack = []
        while stack and not encloses(stack[-1], i):
            stack.pop()
        at = opener_row[i]
        if at >= 0 and (not stack or (not encloses(at, stack[-1]) and stack[-1] != at)):
            # Ties sorted a B/E span after a longer sibling subtree that popped its
            # opener: the file's own stack is the truth; the walk goes on from there.
            stack = _path(t, at)
        parent[i] = stack[-1] if stack else -1
        depth[i] = len(stack)
        stack.append(i)
    del opener_row
    if instants:
        _place_instants(t, order, instants, r)


def _walk_order(t: SpanTable) -> tuple[np.ndarray[Any, np.dtype[Any]], array[int]]:
    """The rows on thread stacks (async spans belong to none) thread by thread, each
    thread's in containment order; and each row's opener as a row (-1: none). The numpy
    views of the columns end here: an ``array`` cannot grow while one is exported."""
    n = len(t)
    starts, ends, seqs = t.column("start"), t.column("end"), t.column("seq")
    phases, threads, openers = t.column("phase"), t.column("thread"), t.column("opener")
    # A B's opener is a B row: found by its seq among the B rows'.
    is_b = phases == ord("B")
    b_rows = np.flatnonzero(is_b)
    by_seq = b_rows[np.argsort(seqs[b_rows], kind="stable")]
    has_opener = is_b & (openers >= 0)
    opener_row = array("q", bytes(8 * n))
    rows = np.frombuffer(opener_row, dtype=np.int64) if n else np.zeros(0, np.int64)
    rows[:] = -1
    rows[has_opener] = by_seq[np.searchsorted(seqs[by_seq], openers[has_opener])]
    del rows
    # lexsort's last key is the primary one; ``~end`` (= -end - 1) sorts the longest
    # first without overflow (times are within ±2**63). Without async spans (the usual
    # file) the columns are sorted as they are, not copied out first (8 MB a million).
    is_async = phases == ord("b")
    if not is_async.any():
        return np.lexsort((seqs, ~ends, starts, threads)), opener_row
    on_thread = np.flatnonzero(~is_async)
    order = on_thread[np.lexsort((seqs[on_thread], ~ends[on_thread], starts[on_thread],
                                  threads[on_thread]))]
    return order, opener_row


def _place_instants(t: SpanTable, order: np.ndarray[Any, np.dtype[Any]],
                    instants: list[Instant], r: ParseResult) -> None:
    """Each instant onto the innermost span of its thread that encloses it (``p``/``g``
    scope: of its process / of any thread, if its own has none); else a span itself."""
    threads = t.column("thread")[order]
    cut = np.flatnonzero(np.diff(threads)) + 1
    index: dict[tuple[Id, Id], tuple[np.ndarray[Any, np.dtype[Any]],
                                     np.ndarray[Any, np.dtype[Any]]]] = {}
    starts = t.column("start")
    for ids in np.split(order, cut):
        if len(ids):
            index[t.threads[t.thread[int(ids[0])]]] = (ids, starts[ids])
    del threads, cut, starts
    for inst in sorted(instants, key=lambda x: x.ts_ns):
        owner = _innermost(t, index.get((inst.pid, inst.tid)), inst.ts_ns)
        if owner is None and inst.scope in ("p", "g"):
            for (pid, _tid), entry in index.items():
                if inst.scope == "g" or pid == inst.pid:
                    owner = _innermost(t, entry, inst.ts_ns)
                    if owner is not None:
                        break
        if owner is not None:
            t.add_event(owner, inst)
        else:
            _lone_instant(t, inst, r)


def _lone_instant(t: SpanTable, inst: Instant, r: ParseResult) -> None:
    r.instants_as_spans += 1
    t.append(inst.name, inst.pid, inst.tid, inst.ts_ns, inst.ts_ns, inst.args, "i", None,
             len(t))


def _path(t: SpanTable, i: int) -> list[int]:
    """Span ``i`` and its ancestors, root first."""
    path: list[int] = []
    node = i
    while node >= 0:
        path.append(node)
        node = t.parent[node]
    path.reverse()
    return path


def _innermost(t: SpanTable, entry: tuple[np.ndarray[Any, np.dtype[Any]],
                                          np.ndarray[Any, np.dtype[Any]]] | None,
               ts: int) -> int | None:
    """The deepest span of a thread that encloses ``ts`` (latest-starting container)."""
    if entry is None:
        return None
    ids, starts = entry
    k = int(np.searchsorted(starts, ts, side="right")) - 1
    if k < 0:
        return None
    # The latest span starting at or before ts, else the nearest of its ancestors that
    # is still open at ts. Nothing earlier can enclose ts without also enclosing that
    # span, which would make it one of those ancestors.
    node = int(ids[k])
    while node >= 0 and t.end[node] < ts:
        node = t.parent[node]
    return node if node >= 0 else None
