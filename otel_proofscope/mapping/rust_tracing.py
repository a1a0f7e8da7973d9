"""Spans rebuilt from a Rust prover's console: tracing-subscriber ``fmt`` close lines.

A Rust prover that logs with tracing-subscriber's ``fmt`` layer and
``with_span_events(FmtSpan::CLOSE)`` (SP1's default logger does) prints one line when
each span closes::

    2026-12-02T18:40:14.289898Z  INFO prove:core prove with pk:zerocheck: close
        time.busy=7.12ms time.idle=2.52µs mode=Core                      (compact)
    2026-12-02T18:40:14.289898Z  INFO prove{mode=Core}:core prove with pk:zerocheck:
        close time.busy=7.12ms time.idle=2.52µs                          (full)

(one line each, wrapped here).

This module is the pure half (no I/O, no OpenTelemetry): :func:`parse_close_line` reads
one line (ANSI colour, timestamp, level, thread name/id, target, file and line number
each optional), and :class:`SpanAssembler` turns a sequence of them into span trees.

What a line gives, and what is derived:

* the end: the line's RFC 3339 timestamp, or ``Uptime`` seconds since the subscriber
  started, else the time the line arrived (the caller passes it);
* the start: end − (``time.busy`` + ``time.idle``). tracing-subscriber prints both with
  three significant digits (``TimingDisplay``: ``7.12ms``, ``25.3µs``, ``100ns``), so a
  start is exact to ~0.5 % of the span's length;
* the parent: the span path (``prove:core prove with pk:zerocheck``) names the ancestors,
  root first. A child closes before its parent, so children wait in
  :attr:`SpanAssembler.pending` until a close line with their parent's path arrives; the
  fields tell apart two parents with the same path (``shard=0`` / ``shard=1`` on two
  threads): in the ``full`` format each path segment carries its span's fields in braces,
  in ``compact`` the fields of the whole scope follow the event's, root first, so a
  parent's are a prefix of its child's. Two open spans with the same path *and* the same
  fields cannot be told apart from their lines; a child goes to the first of them whose
  interval holds it;
* attributes: each span's own fields, as tracing-opentelemetry names them (field name as
  is, ``busy_ns``, ``idle_ns``, ``thread.id``, ``thread.name``, ``code.namespace``).

A span whose close line never came (the prover was killed, or its span outlives the
output) is made up at the end from its children: start = its earliest child's start, end =
the prover's exit, marked unterminated.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

Fields = tuple[tuple[str, str], ...]
AttrValue = str | bool | int | float

#: Escape sequences (colour, bold, italic, dim) tracing-subscriber writes with ANSI on.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d)[T ](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?")
_HEAD = re.compile(
    r"\s*(?:(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|\d+\.\d+s)\s+)?"
    r"(?:(?P<level>TRACE|DEBUG|INFO|WARN|ERROR)\s+)?"
    r"(?:(?:(?P<thread>\S+)\s+)?ThreadId\((?P<tid>\d+)\)\s+)?")
#: What may stand between the span path and the message: ``target:``, ``file.rs:``, ``12:``.
_PREFIXES = re.compile(r"(?:[\w:./\\-]+:\s*)*")
#: The close event's message, then its fields: ``time.busy`` and ``time.idle`` first.
_CLOSE = re.compile(r"close\s+(?=time\.busy=)")
_KEY = re.compile(r"(r#)?([A-Za-z_][\w.]*)=")
_NEXT_KEY = re.compile(r"\s+(?=(?:r#)?[A-Za-z_][\w.]*=)")
_DURATION = re.compile(r"(?P<n>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*(?P<unit>ns|µs|μs|us|ms|s)")
_UNIT_NS = {"ns": 1, "µs": 1_000, "μs": 1_000, "us": 1_000, "ms": 1_000_000,
            "s": 1_000_000_000}
_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?|-?inf|NaN")
_I64 = 2 ** 63

BUSY, IDLE = "time.busy", "time.idle"


class CloseLineError(ValueError):
    """A line that is a span's close line but cannot be read (a duration without unit…)."""


# ── one line ─────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class CloseLine:
    """One ``FmtSpan::CLOSE`` line, as printed."""

    #: Span names from the root to the span that closed.
    path: tuple[str, ...]
    #: ``full`` format: each segment's fields (from its braces); ``()`` where none shown.
    path_fields: tuple[Fields, ...]
    #: Fields after ``close time.busy=… time.idle=…``: in ``compact``, the fields of every
    #: span in scope, root first; in ``full``, none.
    tail: Fields
    busy_ns: int | None
    idle_ns: int | None
    #: Wall-clock end from an RFC 3339 timestamp (ns since the epoch).
    wall_ns: int | None = None
    #: ``Uptime`` timer: seconds since the subscriber started, as ns.
    uptime_ns: int | None = None
    level: str | None = None
    thread_name: str | None = None
    thread_id: int | None = None
    #: Whatever stood between the path and ``close`` (``target:``, ``file.rs:12:``).
    target: str | None = None

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def timed(self) -> bool:
        return self.busy_ns is not None and self.idle_ns is not None


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def parse_duration(text: str) -> int:
    """``7.12ms`` → 7_120_000 ns; ns, µs (or us), ms and s, integer or float forms."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise CloseLineError(f"{text!r} is not a duration (a number with ns, µs, ms or s)")
    return round(float(m["n"]) * _UNIT_NS[m["unit"]])


def parse_timestamp(text: str) -> int:
    """RFC 3339 (``2026-12-02T18:40:14.289898Z``, any fraction, Z or ±hh:mm) → epoch ns.

    No offset means UTC (tracing-subscriber's ``SystemTime`` prints UTC with a ``Z``).
    """
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise CloseLineError(f"{text!r} is not an RFC 3339 timestamp")
    year, month, day = (int(x) for x in m["date"].split("-"))
    secs = calendar.timegm((year, month, day, int(m["h"]), int(m["m"]), int(m["s"]), 0, 0, 0))
    tz = m["tz"]
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        secs -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    frac = (m["frac"] or "")[:9].ljust(9, "0")
    return secs * 1_000_000_000 + int(frac)


def parse_fields(text: str) -> Fields:
    """``a=1 b="x y" c=Some(3) msg`` → ``(("a","1"), ("b",'"x y"'), ("c","Some(3)"), …)``.

    tracing's ``DefaultFields`` writes ``name=value`` pairs separated by one space, string
    values quoted (Debug), others as Display or Debug text that may hold spaces: a value
    runs to the next `` name=``. Text before the first ``name=`` is the message.
    """
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        m = _KEY.match(text, i)
        if m is None:  # the message (printed without its name)
            j = _value_end(text, i)
            out.append(("message", text[i:j].rstrip()))
            i = j
            continue
        key, i = m.group(2), m.end()
        if text.startswith('"', i):
            j = _quoted_end(text, i)
            if j < n and not text[j].isspace():  # "a"b: not one quoted value after all
                j = _value_end(text, j)
        else:
            j = _value_end(text, i)
        out.append((key, text[i:j].rstrip()))
        i = j
    return tuple(out)


def _value_end(text: str, i: int) -> int:
    m = _NEXT_KEY.search(text, i)
    return m.start() if m else len(text)


def _quoted_end(text: str, i: int) -> int:
    """Index just past the closing quote of the string starting at ``text[i] == '"'``."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return len(text)


def field_value(raw: str) -> AttrValue:
    """A printed field value as an attribute: int, float, bool, else the string (a
    Debug-quoted string unquoted)."""
    if raw in ("true", "false"):
        return raw == "true"
    if _INT.fullmatch(raw):
        v = int(raw)
        return v if -_I64 <= v < _I64 else raw
    if _FLOAT.fullmatch(raw):
        return float(raw)
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        try:
            out = json.loads(raw)
        except ValueError:
            return raw[1:-1]
        return out if isinstance(out, str) else raw[1:-1]
    return raw


def _split_path(rest: str) -> tuple[list[tuple[str, str | None]], int] | None:
    """The span path at the start of ``rest``: [(name, braces text or None)], and where
    it ends (after ``:``). Segments end at ``:`` outside braces and quotes; the path ends
    at the first such ``:`` followed by a space or the end of the line."""
    head = rest.find(": ")
    head = len(rest) - 1 if head < 0 and rest.endswith(":") else head
    if head > 0 and "{" not in rest[:head]:  # compact, or full with no fields: no braces
        names = rest[:head].split(":")
        if all(n and n == n.strip() for n in names):
            return [(n, None) for n in names], head + 1
        return None
    segments: list[tuple[str, str | None]] = []
    start, depth, i, n = 0, 0, 0, len(rest)
    brace_at = -1
    while i < n:
        c = rest[i]
        if c == '"' and depth:
            i = _quoted_end(rest, i)
            continue
        if c == "{":
            if depth == 0:
                brace_at = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
        elif c == ":" and depth == 0:
            if brace_at >= 0:
                name, inner = rest[start:brace_at], rest[brace_at + 1:i - 1]
                if not rest[start:i].endswith("}"):
                    return None
            else:
                name, inner = rest[start:i], None
            if not name or name != name.strip():
                return None
            segments.append((name, inner))
            start, brace_at = i + 1, -1
            if i + 1 >= n or rest[i + 1] == " ":
                return segments, i + 1
        i += 1
    return None


def parse_close_line(text: str) -> CloseLine | None:
    """The close line in ``text``, or None when it is not one.

    A close line without ``time.busy`` (FmtSpan timing off, or ``without_time()`` on the
    subscriber builder, which drops it too) says nothing of when the span started, and
    ``close`` alone is too common a word to read: neither is taken.

    Raises :class:`CloseLineError` for a close line that cannot be read (a bad duration
    or timestamp): the caller counts it as malformed.
    """
    text = strip_ansi(text).strip()
    if "close" not in text:
        return None
    head = _HEAD.match(text)
    assert head is not None  # every part of it is optional
    split = _split_path(text[head.end():])
    if split is None:
        return None
    segments, end = split
    rest = text[head.end() + end:].lstrip()
    prefix = _PREFIXES.match(rest)
    assert prefix is not None
    target = prefix.group(0).strip().rstrip(":").strip() or None
    rest = rest[prefix.end():]
    if not _CLOSE.match(rest):
        return None
    fields = list(parse_fields(rest[len("close"):]))
    busy = idle = None
    for key, value in list(fields):
        if key == BUSY:
            busy = parse_duration(value)
        elif key == IDLE:
            idle = parse_duration(value)
    if busy is None or idle is None:
        raise CloseLineError("a close line with time.busy but no time.idle")
    tail = tuple((k, v) for k, v in fields if k not in (BUSY, IDLE))
    ts = head["ts"]
    wall = uptime = None
    if ts and ts.endswith("s") and "-" not in ts:
        uptime = round(float(ts[:-1]) * 1e9)
    elif ts:
        wall = parse_timestamp(ts)
    return CloseLine(
        path=tuple(name for name, _ in segments),
        path_fields=tuple(parse_fields(inner) if inner else () for _, inner in segments),
        tail=tail, busy_ns=busy, idle_ns=idle, wall_ns=wall, uptime_ns=uptime,
        level=head["level"], thread_name=head["thread"],
        thread_id=int(head["tid"]) if head["tid"] else None, target=target)


# ── lines into trees ─────────────────────────────────────────────────────────────────


@dataclass
class Rebuilt:
    """One span rebuilt from its close line (or made up for a parent that never closed)."""

    name: str
    path: tuple[str, ...]
    start_ns: int
    end_ns: int
    #: The span's own fields (its ancestors' removed once they are known).
    fields: Fields
    line: CloseLine | None
    #: True when the end is the line's own timestamp (not its arrival).
    stamped: bool = False
    children: list[Rebuilt] = field(default_factory=list)
    #: No close line: made up from its children when the output ended.
    unterminated: bool = False
    #: Claimed by a parent although another open parent with the same path and fields
    #: could have been its parent as well.
    ambiguous: bool = False
    #: Moved earlier to end where the sibling that closed after it starts (see
    #: ``_place_by_close_order``): its length is measured, its position is not.
    placed_by_order: bool = False

    def walk(self) -> Iterator[Rebuilt]:
        yield self
        for c in self.children:
            yield from c.walk()

    @property
    def scope(self) -> Fields:
        """Fields of the whole scope as the line printed them (compact), else own."""
        return self.line.tail if self.line is not None and self.line.tail else self.fields


@dataclass
class AssemblerStats:
    spans: int = 0
    trees: int = 0
    unterminated: int = 0
    untimed: int = 0
    ambiguous: int = 0
    dropped: int = 0


#: Children waiting for their parent's close line, across all paths.
MAX_PENDING = 200_000


class SpanAssembler:
    """Close lines in, finished span trees out (root-level spans with all descendants).

    Pure and single-threaded: the caller serialises calls and turns trees into spans.
    """

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        #: Parent path → children that closed and wait for that parent's close line.
        self.pending: dict[tuple[str, ...], list[Rebuilt]] = {}
        self.stats = AssemblerStats()
        self._pending_count = 0
        self._max_pending = max_pending

    def add(self, line: CloseLine, end_ns: int, *, stamped: bool = False) -> list[Rebuilt]:
        """One close line whose span ended at ``end_ns``; the trees it completes.

        ``stamped``: the end came from the line's own timestamp (tight tolerances).
        """
        if not line.timed:
            self.stats.untimed += 1  # FmtSpan timing off: no start to derive
            return []
        assert line.busy_ns is not None and line.idle_ns is not None
        node = Rebuilt(name=line.name, path=line.path,
                       start_ns=end_ns - line.busy_ns - line.idle_ns, end_ns=end_ns,
                       fields=line.path_fields[-1] if line.path_fields[-1] else line.tail,
                       line=line, stamped=stamped)
        self.stats.spans += 1
        self._claim(node)
        return self._place(node)

    def finish(self, end_ns: int) -> list[Rebuilt]:
        """The output ended: parents that never closed are made up; every tree out."""
        out: list[Rebuilt] = []
        while self.pending:
            path = max(self.pending, key=len)  # the deepest first: they nest upwards
            waiting = self.pending.pop(path)
            self._pending_count -= len(waiting)
            for group in _by_parent(waiting, len(path)):
                start = min(c.start_ns for c in group)
                fields = group[0].line.path_fields[len(path) - 1] if group[0].line else ()
                node = Rebuilt(name=path[-1], path=path, start_ns=start,
                               end_ns=max(end_ns, max(c.end_ns for c in group)),
                               fields=fields, line=None, unterminated=True)
                self._adopt(node, group)
                self.stats.unterminated += 1
                out += self._place(node)
        return out

    def _place(self, node: Rebuilt) -> list[Rebuilt]:
        if len(node.path) == 1:
            self.stats.trees += 1
            return [node]
        if self._pending_count >= self._max_pending:
            self.stats.dropped += sum(1 for _ in node.walk())
            return []
        self.pending.setdefault(node.path[:-1], []).append(node)
        self._pending_count += 1
        return []

    def _claim(self, parent: Rebuilt) -> None:
        waiting = self.pending.get(parent.path)
        if not waiting:
            return
        # Lines that print the parent's fields exactly as its own line does: the common
        # case, a tuple comparison each; the looser match only when none does.
        alike = [c for c in waiting if _same_scope(c, parent)] or [
            c for c in waiting if _fields_fit(c, parent)]
        mine = [c for c in alike if _time_fits(c, parent)]
        if not mine:
            return
        taken = {id(c) for c in mine}
        rest = [c for c in waiting if id(c) not in taken]
        if rest:
            self.pending[parent.path] = rest
        else:
            del self.pending[parent.path]
        if len(alike) > len(mine):
            # Children with this parent's path and fields wait for another parent: two
            # such parents were open together, and only time told their children apart.
            for c in mine:
                c.ambiguous = True
            self.stats.ambiguous += len(mine)
        self._pending_count -= len(mine)
        self._adopt(parent, mine)

    @staticmethod
    def _adopt(parent: Rebuilt, children: Sequence[Rebuilt]) -> None:
        scope = parent.scope
        for c in children:
            if c.line is not None and c.line.tail and scope:
                c.fields = _own_fields(c.line.tail, scope)
        _place_by_close_order(parent, children)
        parent.children = sorted([*parent.children, *children], key=lambda c: c.start_ns)


def _place_by_close_order(parent: Rebuilt, children: Sequence[Rebuilt]) -> None:
    """Siblings whose lines were read together, laid end to end in the order they closed.

    Without a timestamp a span ends when its line was read, and lines read in one chunk
    share that end: siblings then overlap, and the one that ran longer seems to start
    first. Their close order is the only order the read left, and one thread runs
    siblings one after another, so each earlier-closed one is moved to end where the next
    one starts (its subtree with it), when that keeps it inside the parent. Lines read
    apart keep their derived times, and so do siblings on different threads (when the
    lines print threads) and stamped ones.
    """
    # ``children`` come in the order their lines did (pending lists keep arrival order).
    chain = [c for c in children if not c.stamped and c.line is not None]
    read_at = [c.end_ns for c in chain]
    floor = parent.start_ns - (parent.end_ns - parent.start_ns) // 100
    for i in range(len(chain) - 2, -1, -1):
        earlier, later = chain[i], chain[i + 1]
        assert earlier.line is not None and later.line is not None
        if read_at[i] != read_at[i + 1] or _thread(earlier.line) != _thread(later.line):
            continue
        shift = earlier.end_ns - later.start_ns
        if shift <= 0 or earlier.start_ns - shift < floor:
            continue
        for n in earlier.walk():
            n.start_ns -= shift
            n.end_ns -= shift
        earlier.placed_by_order = True


def _thread(line: CloseLine) -> tuple[int | None, str | None]:
    return line.thread_id, line.thread_name


def _own_fields(child_scope: Fields, parent_scope: Fields) -> Fields:
    """A compact line's fields less its parent's scope (a prefix of them, root first)."""
    if child_scope[:len(parent_scope)] == parent_scope:
        return child_scope[len(parent_scope):]
    return tuple(kv for kv in child_scope if kv not in parent_scope)


def _compatible(a: Fields, b: Fields) -> bool:
    """No field named in both with different values (a later ``record`` may add some)."""
    if a == b or not a or not b:
        return True
    bv: dict[str, set[str]] = {}
    for k, v in b:
        bv.setdefault(k, set()).add(v)
    av: dict[str, set[str]] = {}
    for k, v in a:
        av.setdefault(k, set()).add(v)
    return all(av[k] & bv[k] for k in av.keys() & bv.keys())


def _same_scope(child: Rebuilt, parent: Rebuilt) -> bool:
    cl, pl = child.line, parent.line
    assert cl is not None and pl is not None
    return (cl.path_fields[:len(pl.path_fields)] == pl.path_fields
            and cl.tail[:len(pl.tail)] == pl.tail)


def _fields_fit(child: Rebuilt, parent: Rebuilt) -> bool:
    cl, pl = child.line, parent.line
    assert cl is not None and pl is not None
    depth = len(parent.path)
    if any(not _compatible(cl.path_fields[i], pl.path_fields[i]) for i in range(depth)):
        return False
    return not (cl.tail and pl.tail and not _compatible_scope(cl.tail, pl.tail))


#: How far an end taken from a line's arrival may stray: the read's delay on a loaded
#: machine (bench_line_arrival.py: up to ~75 ms at load ~9), with room to spare. Time
#: only breaks ties between look-alike parents, so a wide bound costs little.
ARRIVAL_SLACK_NS = 250_000_000


def _time_fits(child: Rebuilt, parent: Rebuilt) -> bool:
    # Durations are printed to 3 significant digits; arrival times jitter by the read.
    slack = (parent.end_ns - parent.start_ns + child.end_ns - child.start_ns) // 100
    slack += 2_000 if parent.stamped and child.stamped else ARRIVAL_SLACK_NS
    return child.start_ns >= parent.start_ns - slack and child.end_ns <= parent.end_ns + slack


def _compatible_scope(child: Fields, parent: Fields) -> bool:
    """A compact parent's scope is a prefix of its child's; fields the parent recorded
    after the child closed (``Span::record``) are not in the child's line, so those are
    left out of the comparison."""
    if child[:len(parent)] == parent:
        return True
    names = {k for k, _ in child}
    known = tuple(kv for kv in parent if kv[0] in names)
    return len(known) < len(parent) and child[:len(known)] == known


def _by_parent(children: list[Rebuilt], depth: int) -> list[list[Rebuilt]]:
    """Children of one path split by what their lines say of their parent's fields."""
    groups: dict[Fields, list[Rebuilt]] = {}
    for c in children:
        key = c.line.path_fields[depth - 1] if c.line is not None else ()
        groups.setdefault(key, []).append(c)
    return list(groups.values())

