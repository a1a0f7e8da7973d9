"""A Rust prover's console, read as OpenTelemetry spans.

``proofscope run`` hands every output line of the prover to :class:`RustTracingConsole`
(through :class:`~otel_proofscope.mapping.lines.LineEngine`): tracing-subscriber
``FmtSpan::CLOSE`` lines (:mod:`.rust_tracing`), tracing-forest trees (:mod:`.rust_forest`)
and arkworks' ``print-trace`` timer lines (:mod:`.ark_timers`) become spans under the
run's ``proof`` root, with the names, fields and nesting the prover gave them, and
``proofscope.timing``. Nothing in the prover changes.

A tree is exported when its top-level span closes (a child's parent is known only then),
so a prover whose outermost span covers the whole proof shows its spans at the end; a
prover killed before that still has them, under parents marked unterminated.

``--map rust-tracing`` asks for it; without ``--map`` it is on in ``auto`` mode, which
says nothing in the summary unless the prover printed close lines.
"""

from __future__ import annotations

import time
from pathlib import Path

from opentelemetry import trace
from opentelemetry.trace import Span

from otel_proofscope.ledger import DROPS
from otel_proofscope.mapping.ark_timers import (
    TimerAssembler,
    TimerLineError,
    TimerNode,
    parse_timer_line,
)
from otel_proofscope.mapping.lines import LineRules
from otel_proofscope.mapping.rust_forest import (
    ForestAssembler,
    ForestNode,
    forest_layout,
    parse_forest_line,
)
from otel_proofscope.mapping.rust_tracing import (
    CloseLineError,
    Rebuilt,
    SpanAssembler,
    field_value,
    parse_close_line,
)
from otel_proofscope.semconv import TRACER_NAME, Attr, DropReason, LineAttr, RustAttr, Timing
from otel_proofscope.version import __version__

#: ``--map`` name of the console parser (a built-in, not a rule file).
NAME = "rust-tracing"
#: Drop-ledger names for spans the assembler had no room to keep.
DROP_SIGNAL, DROP_SINK = "spans", "rust-tracing"


class RustTracingConsole:
    """Close lines in (``feed``), spans out; not thread-safe (the engine's lock covers it).

    ``auto``: on without being asked, so silent in the summary until a close line came.
    """

    def __init__(self, root: Span, *, tracer_provider: trace.TracerProvider | None = None,
                 auto: bool = False) -> None:
        self.root = root
        self.auto = auto
        self.assembler = SpanAssembler()
        self.forest = ForestAssembler()
        self.forest_spans = 0
        self.forest_trees = 0
        self.timers = TimerAssembler()
        self.malformed = 0
        self.errors: list[str] = []
        self._tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider)
        # Arrival (monotonic) to wall time with one offset per run, as LineEngine does.
        self._offset = time.time_ns() - time.monotonic_ns()
        self._began_wall: int | None = None

    def begin(self, t_mono: int) -> None:
        """The child started: ``Uptime`` timestamps count from here."""
        self._began_wall = t_mono + self._offset

    def feed(self, text: str, t_mono: int) -> bool:
        """One output line (ANSI already stripped or not); True when it was a close line."""
        try:
            line = parse_close_line(text)
            node = parse_forest_line(text) if line is None else None
            timer = parse_timer_line(text) if line is None and node is None else None
        except (CloseLineError, TimerLineError) as exc:
            self.malformed += 1
            if len(self.errors) < 5:
                self.errors.append(f"{NAME}: {exc}")
            return True
        if timer is not None:
            for root in self.timers.add(timer, t_mono + self._offset):
                self._timer_span(root, self.root)
            return True
        if line is None:
            for tree, arrival in self.forest.add(node, t_mono + self._offset):
                self._emit_forest(tree, arrival)
            return node is not None
        if line.wall_ns is not None:
            end, stamped = line.wall_ns, True
        elif line.uptime_ns is not None and self._began_wall is not None:
            end, stamped = self._began_wall + line.uptime_ns, True
        else:
            end, stamped = t_mono + self._offset, False
        before = self.assembler.stats.dropped
        self._emit(self.assembler.add(line, end, stamped=stamped))
        self._count_drops(before)
        return True

    def finish(self, t_mono: int) -> None:
        """The output ended: parents that never closed end now, marked unterminated."""
        self._emit(self.assembler.finish(t_mono + self._offset))
        for tree, arrival in self.forest.finish():
            self._emit_forest(tree, arrival)
        for root in self.timers.finish(t_mono + self._offset):
            self._timer_span(root, self.root)

    @property
    def seen(self) -> bool:
        s = self.assembler.stats
        return bool(s.spans or self.malformed or self.forest_spans or self.forest.malformed
                    or self.timers.timers or self.timers.malformed)

    def report(self) -> list[str]:
        """Summary lines (none in auto mode when the prover printed no close line)."""
        if self.auto and not self.seen:
            return []
        s = self.assembler.stats
        extra = []
        if s.spans or not (self.forest_spans or self.timers.timers):
            extra.append(f"{s.spans} spans from close lines, {s.trees} "
                         f"{'tree' if s.trees == 1 else 'trees'}")
        if s.unterminated:
            extra.append(f"{s.unterminated} parents never closed (ended at exit)")
        if self.forest_spans:
            extra.append(f"{self.forest_spans} spans from {self.forest_trees} tracing-forest "
                         f"{'tree' if self.forest_trees == 1 else 'trees'}")
        if self.timers.timers:
            extra.append(f"{self.timers.timers} spans from {self.timers.trees} ark-std timer "
                         f"{'tree' if self.timers.trees == 1 else 'trees'}")
        if self.timers.malformed:
            extra.append(f"{self.timers.malformed} ark-std timer lines out of order (skipped)")
        if self.forest.malformed:
            extra.append(f"{self.forest.malformed} tracing-forest lines outside a tree")
        if s.ambiguous:
            extra.append(f"{s.ambiguous} spans placed by time between parents with the same "
                         "path and fields")
        if self.malformed:
            extra.append(f"{self.malformed} malformed")
        if s.dropped:
            extra.append(f"{s.dropped} dropped (more than the pending bound)")
        return [f"{NAME}: " + "; ".join(extra), *self.errors]

    # ── spans ──

    def _count_drops(self, before: int) -> None:
        dropped = self.assembler.stats.dropped - before
        if dropped:
            DROPS.record(DROP_SIGNAL, DROP_SINK, DropReason.SIZE_CAP.value, dropped)

    def _emit(self, trees: list[Rebuilt]) -> None:
        for tree in trees:
            self._span(tree, self.root)

    def _emit_forest(self, root: ForestNode, arrival_ns: int) -> None:
        self.forest_trees += 1
        self._forest_span(root, self.root, forest_layout(root, arrival_ns))

    def _forest_span(self, node: ForestNode, parent: Span,
                     layout: dict[int, tuple[int, int]]) -> None:
        start, end = layout[id(node)]
        attrs = _typed(node.fields)
        if node.event:
            attrs[RustAttr.LEVEL] = node.level
            tag = attrs.pop("tag", None)
            if tag is not None:
                attrs[RustAttr.FOREST_TAG] = tag
            parent.add_event(node.name, attrs, timestamp=start)
            return
        attrs[RustAttr.BUSY_NS] = node.duration_ns
        attrs[RustAttr.LEVEL] = node.level
        if node.opened_ns is None:
            attrs[RustAttr.PACKED] = True
        attrs[Attr.PROOFSCOPE_TIMING] = Timing.LOG_TREE
        attrs[Attr.MAPPING_RULES] = NAME
        span = self._tracer.start_span(node.name, context=trace.set_span_in_context(parent),
                                       attributes=attrs, start_time=start)
        self.forest_spans += 1
        for child in node.children:
            self._forest_span(child, span, layout)
        span.end(end_time=end)

    def _timer_span(self, node: TimerNode, parent: Span) -> None:
        attrs: dict[str, str | bool | int | float] = {
            Attr.PROOFSCOPE_TIMING: Timing.LOG_CLOSE, Attr.MAPPING_RULES: NAME}
        if node.unterminated:
            attrs[LineAttr.UNTERMINATED] = True
        span = self._tracer.start_span(node.label, context=trace.set_span_in_context(parent),
                                       attributes=attrs, start_time=node.start_ns)
        for child in node.children:
            self._timer_span(child, span)
        span.end(end_time=node.end_ns)

    def _span(self, node: Rebuilt, parent: Span) -> None:
        attrs = _typed(node.fields)
        line = node.line
        if line is not None:
            assert line.busy_ns is not None and line.idle_ns is not None
            attrs[RustAttr.BUSY_NS] = line.busy_ns
            attrs[RustAttr.IDLE_NS] = line.idle_ns
            if line.level:
                attrs[RustAttr.LEVEL] = line.level
            if line.thread_name:
                attrs[RustAttr.THREAD_NAME] = line.thread_name
            if line.thread_id is not None:
                attrs[RustAttr.THREAD_ID] = line.thread_id
            if line.target:
                attrs[RustAttr.TARGET] = line.target
        if node.unterminated:
            attrs[LineAttr.UNTERMINATED] = True
        if node.ambiguous:
            attrs[RustAttr.AMBIGUOUS_PARENT] = True
        if node.placed_by_order:
            attrs[RustAttr.PLACED_BY_CLOSE_ORDER] = True
        attrs[Attr.PROOFSCOPE_TIMING] = Timing.LOG_CLOSE
        attrs[Attr.MAPPING_RULES] = NAME
        span = self._tracer.start_span(node.name, context=trace.set_span_in_context(parent),
                                       attributes=attrs, start_time=node.start_ns)
        for child in node.children:
            self._span(child, span)
        span.end(end_time=node.end_ns)


def console_rules() -> LineRules:
    """Empty line rules under this reader's name: the engine that carries the reader when
    no rule file is given."""
    return LineRules(path=Path(NAME), label=NAME, meta={}, lines=())


def _typed(fields: tuple[tuple[str, str], ...]) -> dict[str, str | bool | int | float]:
    attrs: dict[str, str | bool | int | float] = {}
    for key, raw in fields:
        if key not in attrs:  # the first of a repeated name, as tracing records it
            attrs[key] = field_value(raw)
    return attrs
