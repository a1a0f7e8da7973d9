"""Spans from a Rust prover's console, part two: tracing-forest trees.

tracing-forest's ``Pretty`` printer (``RUST_LOGGER=forest`` in SP1, Plonky3's examples)
prints a whole tree when its root span closes, one line per span or event::

    INFO     prove [ 1.20s | 2.10% / 100.00% ]
    INFO     ┝━ commit traces [ 300ms | 25.00% ] shard: 0
    INFO     │  ┕━ ｉ [info]: committed | rows: 1024
    INFO     ┕━ zerocheck [ 870ms | 72.50% ]

``{level:<8} `` (optionally after a uuid and an RFC 3339 open time padded to 36), then one
three-character unit per level of depth (``   ``, ``│  ``, ``┝━ ``, ``┕━ ``), then a span
``name [ DURATION | BASE% / TOTAL% ]`` (``| TOTAL%`` alone for a leaf), its fields after
the bracket as ``key: value | key: value`` in newer versions, or an event
``icon [tag]: message | key: value`` (the crate's ``src/printer/pretty.rs``). DURATION is
the time the span was entered (busy), in the same three-significant-digit units as fmt's
close lines (:mod:`.rust_tracing`). Pure: no I/O, no OpenTelemetry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from otel_proofscope.mapping.rust_tracing import (
    Fields,
    parse_duration,
    parse_timestamp,
    strip_ansi,
)

_FOREST_UNITS = ("   ", "│  ", "┝━ ", "┕━ ")
_FOREST_PREFIX = re.compile(
    r"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12} )?"
    r"(?:(?P<ts>\d{4}-\d\d-\d\dT\S+)\s+)?(?P<level>TRACE|DEBUG|INFO|WARN|ERROR)")
_FOREST_SPAN = re.compile(
    r"(?P<name>.+?) \[ (?P<dur>\S+) \| (?:(?P<base>[\d.]+)% / )?(?P<total>[\d.]+)% \]"
    r"(?P<fields>.*)")
_FOREST_EVENT = re.compile(r"(?P<icon>\S+) \[(?P<tag>[^\]]*)\]: (?P<rest>.*)")


@dataclass
class ForestNode:
    """One span of a tracing-forest tree, or one event (``event`` True)."""

    name: str
    depth: int
    level: str
    duration_ns: int = 0
    fields: Fields = ()
    opened_ns: int | None = None  # the printed open time (tracing-forest's chrono feature)
    event: bool = False
    children: list[ForestNode] = field(default_factory=list)

    def walk(self) -> Iterator[ForestNode]:
        yield self
        for c in self.children:
            yield from c.walk()


def parse_forest_line(text: str) -> ForestNode | None:
    """One line of a tracing-forest tree, or None when it is not one.

    Raises :class:`CloseLineError` for a span line with an unreadable duration.
    """
    text = strip_ansi(text).rstrip()
    m = _FOREST_PREFIX.match(text)
    if m is None:
        return None
    level = m["level"]
    # The level is padded to 8 and followed by one space: depth units start at 9.
    pad_end = m.start("level") + 9
    if len(text) <= pad_end or not text[m.end("level"):pad_end].isspace() \
            or len(text[m.end("level"):pad_end]) != 9 - len(level):
        return None
    rest, depth = text[pad_end:], 0
    while rest[:3] in _FOREST_UNITS:
        last, rest, depth = rest[:3], rest[3:], depth + 1
    if depth and last not in ("┝━ ", "┕━ "):
        return None  # the continuation of a multi-line message
    opened = parse_timestamp(m["ts"]) if m["ts"] else None
    if (span := _FOREST_SPAN.fullmatch(rest)) is not None:
        return ForestNode(name=span["name"], depth=depth, level=level,
                          duration_ns=parse_duration(span["dur"]),
                          fields=_forest_fields(span["fields"]), opened_ns=opened)
    if depth and (event := _FOREST_EVENT.fullmatch(rest)) is not None:
        message, _, tail = event["rest"].partition(" | ")
        return ForestNode(name=message, depth=depth, level=level, event=True,
                          fields=(("tag", event["tag"]), *_forest_fields(tail)),
                          opened_ns=opened)
    return None


def _forest_fields(text: str) -> Fields:
    out = []
    for part in text.strip().split(" | "):
        key, sep, value = part.partition(": ")
        if sep and key and " " not in key:
            out.append((key, value))
    return tuple(out)


class ForestAssembler:
    """tracing-forest lines in, whole trees out: a tree ends where the next root starts,
    at a line that is not part of a tree, or at :meth:`finish`."""

    def __init__(self) -> None:
        self._stack: list[ForestNode] = []
        self._root_arrival: int | None = None
        self.malformed = 0

    def add(self, node: ForestNode | None, arrival_ns: int) -> list[tuple[ForestNode, int]]:
        """The next output line (None: not a forest line); finished (tree, arrival) pairs."""
        if node is None:
            return self.finish()
        if node.depth == 0:
            out = self.finish()
            if not node.event:
                self._stack, self._root_arrival = [node], arrival_ns
            return out
        if node.depth > len(self._stack) or self._stack[node.depth - 1].event:
            self.malformed += 1  # a child with no parent line above it
            return []
        parent = self._stack[node.depth - 1]
        parent.children.append(node)
        del self._stack[node.depth:]
        self._stack.append(node)
        return []

    def finish(self) -> list[tuple[ForestNode, int]]:
        if not self._stack or self._root_arrival is None:
            return []
        out = [(self._stack[0], self._root_arrival)]
        self._stack, self._root_arrival = [], None
        return out


def forest_layout(root: ForestNode, arrival_ns: int) -> dict[int, tuple[int, int]]:
    """Start and end (ns) of every node of a tree, by ``id(node)``.

    A tree prints no end times. With printed open times: start = open time, end = start +
    entered time. Without: the root ends when its line arrived (it is printed when the
    root closes), and each child is placed after the previous one from its parent's start
    (lengths measured, positions not: ``proofscope.rust.packed``).
    """
    out: dict[int, tuple[int, int]] = {}

    def place(node: ForestNode, start: int) -> None:
        if node.opened_ns is not None:
            start = node.opened_ns
        out[id(node)] = (start, start + node.duration_ns)
        cursor = start
        for child in node.children:
            place(child, cursor)
            cursor = out[id(child)][1]

    start = root.opened_ns if root.opened_ns is not None else arrival_ns - root.duration_ns
    place(root, start)
    return out
