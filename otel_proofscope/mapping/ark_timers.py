"""Spans from a Rust prover's console, part three: arkworks' ``print-trace`` timers.

ark-std's ``start_timer!`` / ``end_timer!`` (feature ``print-trace``, which ark-groth16,
ark-poly and ark-relations pass on) print one line when a timer starts and one when it
ends, to stdout (ark-std 0.5.0, ``src/perf_trace.rs``)::

    Start:   Groth16::Prover
    ··Start:   R1CS to QAP witness map
    ····End:     R1CS to QAP witness map ...........................................7.599ms
    ··End:     Groth16::Prover .....................................................182.118ms

The indent is two ``·`` (U+00B7) per open timer, read from one process-wide counter
before it changes: a Start line at depth d has 2d dots, its End line 2(d+1). The label
is padded to 8 after ``Start:``/``End:``, the End line's message is filled with ``.`` to
75 − indent characters, and the time is ``S.mmms``, ``M.uuums``, ``U.nnnµs`` or ``Nns``.
Colours (``colored``) appear only on a terminal or with ``CLICOLOR_FORCE``.

Timers nest by that depth. A timer's end is its End line's arrival and its start that
minus the printed time, so a tree is exact to the printed precision whatever the pipe
buffered. Pure: no I/O, no OpenTelemetry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from otel_proofscope.mapping.rust_tracing import strip_ansi

#: Dots of indent, Start:/End:, the label (an End line's message runs into its fill).
_LINE = re.compile(r"(?P<dots>(?:·)*)(?P<kind>Start|End):\s+(?P<rest>.*)")
#: An End line's tail: the label, one space, the ``.`` fill, the time right after it.
_END = re.compile(r"(?P<label>.*?) ?\.*(?P<value>\d+)(?:\.(?P<frac>\d{3}))?(?P<unit>s|ms|µs|ns)$")
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "µs": 1_000, "ns": 1}
#: Timers open at once beyond which a stream is not believed (a runaway or garbage).
MAX_OPEN = 256


class TimerLineError(ValueError):
    """A Start/End line that cannot be read (its time, or its depth)."""


@dataclass(frozen=True)
class TimerLine:
    start: bool  # Start: (True) or End: (False)
    depth: int  # the timer's own depth (0: a top-level timer)
    label: str
    duration_ns: int | None = None  # End lines only


def parse_timer_line(text: str) -> TimerLine | None:
    """One ark-std timer line, or None when the line is not one."""
    text = strip_ansi(text).rstrip()
    m = _LINE.fullmatch(text)
    if m is None:
        return None
    dots = len(m["dots"])
    if dots % 2:
        raise TimerLineError(f"odd indent ({dots} dots): {text[:120]!r}")
    if m["kind"] == "Start":
        return TimerLine(True, dots // 2, m["rest"].strip())
    end = _END.fullmatch(m["rest"])
    if end is None or dots == 0:
        raise TimerLineError(f"End line without a time or depth: {text[:120]!r}")
    scale = _UNIT_NS[end["unit"]]
    ns = int(end["value"]) * scale
    if end["frac"] is not None:
        ns += int(end["frac"]) * scale // 1000
    return TimerLine(False, dots // 2 - 1, end["label"].strip(), ns)


@dataclass
class TimerNode:
    """One timer: its label, when it ran (ns), its children in start order."""

    label: str
    depth: int
    start_ns: int
    end_ns: int = 0
    unterminated: bool = False
    children: list[TimerNode] = field(default_factory=list)

    def walk(self) -> Iterator[TimerNode]:
        yield self
        for c in self.children:
            yield from c.walk()


class TimerAssembler:
    """Timer lines in, whole trees out: a tree is done when its top-level timer ends.

    ``start_ns`` of a timer still open is its Start line's arrival, replaced by End's
    arrival minus the printed time when it ends. A line that does not fit the open stack
    (an End for a timer that is not open, a Start deeper than the stack) is counted in
    ``malformed`` and skipped: two threads timing at once interleave their lines.
    """

    def __init__(self) -> None:
        self.stack: list[TimerNode] = []
        self.malformed = 0
        self.timers = 0
        self.trees = 0

    def add(self, line: TimerLine, arrival_ns: int) -> list[TimerNode]:
        if line.start:
            if line.depth != len(self.stack) or len(self.stack) >= MAX_OPEN:
                self.malformed += 1
                return []
            node = TimerNode(line.label, line.depth, arrival_ns)
            if self.stack:
                self.stack[-1].children.append(node)
            self.stack.append(node)
            return []
        if not self.stack or line.depth != len(self.stack) - 1 \
                or self.stack[-1].label != line.label:
            self.malformed += 1
            return []
        node = self.stack.pop()
        assert line.duration_ns is not None
        node.end_ns = arrival_ns
        node.start_ns = arrival_ns - line.duration_ns
        self.timers += 1
        if not self.stack:
            self.trees += 1
            return [node]
        return []

    def finish(self, now_ns: int) -> list[TimerNode]:
        """The output ended: timers still open end now, marked unterminated."""
        if not self.stack:
            return []
        for node in self.stack:
            node.end_ns, node.unterminated = max(now_ns, node.start_ns), True
            self.timers += 1
        root = self.stack[0]
        self.stack = []
        self.trees += 1
        return [root]
