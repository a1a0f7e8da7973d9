"""Log-line rules: a CLI prover's own output lines become proof phases, events and results.

Many provers are command-line tools that already say what they are doing (``snarkjs
groth16 prove -v`` prints ``Multiexp start: multiexp A`` … ``Multiexp end: multiexp A``).
``proofscope run --map PRESET`` reads the child's stdout and stderr through pipes, passes
every byte on to the terminal unchanged, and feeds each line to a :class:`LineEngine`
built from the ``[[line]]`` tables of a rule file (format: ``docs/provers.md``).

A ``[[line]]`` table is one of four kinds, by the keys it has:

* ``start`` (with ``end`` and/or ``until_next``): a phase span from the line that matches
  ``start`` to the one that matches ``end``; ``key`` names the capture groups that tell
  two instances apart (``multiexp A`` from ``multiexp B1``), ``parent`` the enclosing phase;
* ``event``: a span event on the innermost open phase named in ``on`` (else the innermost
  open phase, else the ``proof`` root);
* ``match`` with ``set``: attributes set on the spans named in ``on`` (``"proof"`` is the
  root), e.g. ``OK!`` → ``proof.verified = true``;
* none of those: a command rule (``root`` attributes, a ``whole_run`` span, ``file_size``).

Every kind may carry ``command``, a regex on the command line: the rule applies only when
it matches. Named groups of a pattern become attributes through ``capture`` (group →
attribute name) and ``types`` (attribute → int, float, bool or str).

Time is the wrapper's monotonic clock when ``read()`` returned the line, turned into wall
time once per run: the prover's own flushing bounds the resolution, and lines arriving in
one read share a time. Every span made here says so (``proofscope.timing=log_arrival``).
No line can fail a run: a line no rule matches is counted as unmatched, one whose
captures do not convert (or that is over-long) as malformed, one the matcher had no room
for as dropped, and the four counts add up to the lines read.

Patterns are RE2 (mapping/regex.py): linear in the line, whatever a rule says. One RE2
set search per line finds which rules' patterns occur at all, so a line no rule matches
costs that one call: 9–14 µs a line (27–34 µs with ``re`` and a search per pattern),
220–240 µs for a line that opens and closes phases (span creation included; loaded
2-CPU machine, 2026-12-02).
"""

from __future__ import annotations

import os
import re
import threading
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import metrics, trace
from opentelemetry.trace import Span

from otel_proofscope.mapping.files import PRESETS_DIR, preset_names, resolve_rule_file
from otel_proofscope.mapping.regex import Pattern, PatternSet, RegexError, compile_regex
from otel_proofscope.mapping.rules import RuleError, parse_rules
from otel_proofscope.semconv import (
    METER_NAME,
    TRACER_NAME,
    Attr,
    LayerKind,
    LineAttr,
    Metric,
    SpanName,
    Timing,
)
from otel_proofscope.version import __version__

AttrValue = str | bool | int | float

#: Top-level keys of a rule file; the other readers own ``span`` and ``event``.
TOP_LEVEL_KEYS = frozenset({"meta", "span", "event", "line"})
_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str, "description": str, "system": str, "sources": list, "detect": list}
_LINE_KEYS = frozenset({
    "name", "command", "start", "end", "until_next", "key", "parent", "event", "match",
    "set", "on", "capture", "types", "attributes", "layer", "layer_kind", "whole_run",
    "root", "file_size", "balance"})
_TYPES = frozenset({"int", "float", "bool", "str"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
#: Escape sequences (colours, cursor moves) a CLI writes even into a pipe (circom does).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
#: A longer line is not matched (a rule's regex on megabytes of hex is a stall).
MAX_LINE_CHARS = 16384
#: Phases open at once; more is a runaway rule (counted as malformed lines).
MAX_OPEN = 256
_ROOT = SpanName.PROOF


class LineConsumer(Protocol):
    """A reader of whole output lines beside the rules (mapping/rust_console.py)."""

    def begin(self, t_mono: int) -> None: ...
    def feed(self, text: str, t_mono: int) -> bool: ...  # True: the line was its own
    def finish(self, t_mono: int) -> None: ...


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file, table and key."""


@dataclass(frozen=True)
class LineRule:
    index: int  # 1-based position among the file's [[line]] tables, for messages
    name: str | None = None
    command: Pattern | None = None
    start: Pattern | None = None
    end: Pattern | None = None
    until_next: bool = False
    #: Each start line of an open instance (or, given a regex, each start line that
    #: matches it) adds one, each end line takes one away; the phase ends when they
    #: balance (concurrent chunks that log their own start and end).
    balance: bool = False
    balance_pattern: Pattern | None = None
    key: tuple[str, ...] = ()
    parent: str | None = None
    event: Pattern | None = None
    match: Pattern | None = None
    set: Mapping[str, AttrValue] = field(default_factory=dict)
    on: tuple[str, ...] = ()
    capture: Mapping[str, str] = field(default_factory=dict)
    types: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    layer: bool = False
    layer_kind: str = LayerKind.UNKNOWN.value
    whole_run: bool = False
    root: Mapping[str, AttrValue] = field(default_factory=dict)
    file_size: str | None = None

    @property
    def kind(self) -> str:
        if self.start is not None:
            return "phase"
        if self.event is not None:
            return "event"
        if self.match is not None:
            return "set"
        return "command"


@dataclass(frozen=True)
class LineRules:
    """The ``[meta]`` and ``[[line]]`` parts of one rule file."""

    path: Path
    label: str  # the preset name, or the path as given: recorded as proofscope.mapping.rules
    meta: Mapping[str, Any]
    lines: tuple[LineRule, ...]

    @property
    def system(self) -> str | None:
        value = self.meta.get("system")
        return value if isinstance(value, str) else None

    def detects(self, command: str) -> bool:
        """Whether ``[meta].detect`` matches this command line."""
        return any(compile_regex(p).search(command) for p in self.meta.get("detect", ()))

    def for_command(self, command: str) -> list[LineRule]:
        return [r for r in self.lines if r.command is None or r.command.search(command)]

    def root_attributes(self, command: str) -> dict[str, AttrValue]:
        """Root attributes for this command: ``[meta].system``, then matching command rules."""
        out: dict[str, AttrValue] = {}
        if self.system:
            out[Attr.PROOF_SYSTEM] = self.system
        for rule in self.for_command(command):
            out.update(rule.root)
        return out


# ── loading ──────────────────────────────────────────────────────────────────────────


def load_line_rules(name_or_path: str) -> LineRules:
    """The line rules of a shipped preset (by name) or of a TOML file (by path)."""
    path = resolve_rule_file(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RuleFileError(f"{path}: {exc}") from exc
    label = path.stem if path.parent == PRESETS_DIR else name_or_path
    rules = parse_line_rules(data, path, label)
    # The [[span]] / [[event]] tables are not ours to apply, but a typo in them must
    # stop `run --map FILE` as it stops `import` and `serve` (same checks, same words).
    try:
        parse_rules(data, path)
    except RuleError as exc:
        raise RuleFileError(str(exc)) from None
    return rules


def parse_line_rules(data: Mapping[str, Any], path: Path, label: str | None = None) -> LineRules:
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise RuleFileError(f"{path}: unknown top-level key {key!r} (expected one of "
                                f"{', '.join(sorted(TOP_LEVEL_KEYS))})")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise RuleFileError(f"{path}: [meta] must be a table")
    for key, typ in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], typ):
            raise RuleFileError(f"{path}: [meta].{key} has the wrong type")
    for pattern in meta.get("detect", ()):
        _regex(pattern, path, "[meta].detect")
    tables = data.get("line", [])
    if not isinstance(tables, list):
        raise RuleFileError(f"{path}: 'line' must be an array of tables ([[line]])")
    rules = tuple(_rule(t, i, path) for i, t in enumerate(tables, start=1))
    return LineRules(path=path, label=label or path.stem, meta=meta, lines=rules)


def _regex(value: object, path: Path, where: str) -> Pattern:
    # RE2 (mapping/regex.py): a line the prover prints can never stall the match.
    if not isinstance(value, str):
        raise RuleFileError(f"{path}: {where}: a regex string is expected, got {value!r}")
    try:
        return compile_regex(value)
    except RegexError as exc:
        raise RuleFileError(f"{path}: {where}: bad regex {value!r}: {exc}") from None


def _attrs(value: object, path: Path, where: str) -> dict[str, AttrValue]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str | bool | int | float)
            for k, v in value.items()):
        raise RuleFileError(f"{path}: {where}: a table of attribute → string, bool or number "
                            "is expected")
    return dict(value)


def _rule(table: object, index: int, path: Path) -> LineRule:
    where = f"[[line]] #{index}"
    if not isinstance(table, dict):
        raise RuleFileError(f"{path}: {where} is not a table")
    for key in table:
        if key not in _LINE_KEYS:
            raise RuleFileError(f"{path}: {where}: unknown key {key!r} (expected one of "
                                f"{', '.join(sorted(_LINE_KEYS))})")

    def pattern(key: str) -> Pattern | None:
        return _regex(table[key], path, f"{where}.{key}") if key in table else None

    def text(key: str) -> str | None:
        v = table.get(key)
        if v is not None and not (isinstance(v, str) and v):
            raise RuleFileError(f"{path}: {where}.{key}: a non-empty string is expected")
        return v

    def flag(key: str) -> bool:
        v = table.get(key, False)
        if not isinstance(v, bool):
            raise RuleFileError(f"{path}: {where}.{key}: true or false is expected")
        return v

    def names(key: str) -> tuple[str, ...]:
        v = table.get(key, [])
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise RuleFileError(f"{path}: {where}.{key}: a name or a list of names is expected")
        return tuple(v)

    capture = table.get("capture", {})
    if not isinstance(capture, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in capture.items()):
        raise RuleFileError(f"{path}: {where}.capture: a table of group → attribute name "
                            "is expected")
    types = table.get("types", {})
    if not isinstance(types, dict) or not all(v in _TYPES for v in types.values()):
        raise RuleFileError(f"{path}: {where}.types: a table of attribute → one of "
                            f"{', '.join(sorted(_TYPES))} is expected")
    layer_kind = text("layer_kind") or LayerKind.UNKNOWN.value
    if layer_kind not in {k.value for k in LayerKind}:
        raise RuleFileError(f"{path}: {where}.layer_kind: {layer_kind!r} is not a layer kind "
                            f"({', '.join(k.value for k in LayerKind)})")
    rule = LineRule(
        index=index, name=text("name"), command=pattern("command"), start=pattern("start"),
        end=pattern("end"), until_next=flag("until_next"), balance="balance" in table
        and table["balance"] is not False, balance_pattern=_balance(table, path, where),
        key=names("key"),
        parent=text("parent"), event=pattern("event"), match=pattern("match"),
        set=_attrs(table.get("set", {}), path, f"{where}.set"), on=names("on"),
        capture=dict(capture), types=dict(types),
        attributes=_attrs(table.get("attributes", {}), path, f"{where}.attributes"),
        layer=flag("layer"), layer_kind=layer_kind, whole_run=flag("whole_run"),
        root=_attrs(table.get("root", {}), path, f"{where}.root"), file_size=text("file_size"))
    _check(rule, table, path, where)
    return rule


def _balance(table: Mapping[str, Any], path: Path, where: str) -> Pattern | None:
    value = table.get("balance", False)
    if isinstance(value, bool):
        return None
    return _regex(value, path, f"{where}.balance")


def _check(rule: LineRule, table: Mapping[str, Any], path: Path, where: str) -> None:
    kinds = [k for k in ("start", "event", "match") if k in table]
    if len(kinds) > 1:
        raise RuleFileError(f"{path}: {where}: one of start, event or match, not "
                            f"{' and '.join(kinds)}")
    pattern = rule.start or rule.event or rule.match
    groups = set(pattern.groupindex) if pattern is not None else set()
    if rule.end is not None:
        groups |= set(rule.end.groupindex)
    if rule.command is not None:
        groups |= set(rule.command.groupindex)
    for group in (*rule.capture, *rule.key):
        if group not in groups:
            raise RuleFileError(f"{path}: {where}: capture group {group!r} is not in the "
                                "rule's patterns")
    if rule.kind in ("phase", "event") and not rule.name:
        raise RuleFileError(f"{path}: {where}: a {rule.kind} rule needs a name")
    if rule.kind == "phase" and rule.end is None and not rule.until_next:
        raise RuleFileError(f"{path}: {where}: a phase needs end or until_next = true")
    if rule.kind != "phase" and ("end" in table or rule.until_next or rule.layer
                                 or rule.balance):
        raise RuleFileError(f"{path}: {where}: end, until_next, balance and layer belong to "
                            "a phase (start)")
    if rule.balance and rule.end is None:
        raise RuleFileError(f"{path}: {where}: balance needs an end pattern")
    if rule.kind == "set" and not (rule.set or rule.capture):
        raise RuleFileError(f"{path}: {where}: a match rule needs set or capture")
    if rule.whole_run and (rule.kind != "command" or not rule.name):
        raise RuleFileError(f"{path}: {where}: whole_run needs a name and no start, event "
                            "or match")
    if rule.file_size is not None and (rule.command is None
                                       or "file" not in rule.command.groupindex):
        raise RuleFileError(f"{path}: {where}: file_size needs a command regex with a "
                            "(?P<file>…) group")


def detect_preset(command: str) -> LineRules | None:
    """The first shipped preset whose ``[meta].detect`` matches ``command`` (or None)."""
    for name in preset_names():
        try:
            rules = load_line_rules(name)
        except (RuleFileError, FileNotFoundError):
            continue  # a preset of the span rules only, or a broken one: not ours to judge
        if rules.lines and rules.detects(command):
            return rules
    return None


# ── the engine ───────────────────────────────────────────────────────────────────────


class _Bad(ValueError):
    """A capture that does not convert: the line counts as malformed."""


@dataclass
class LineStats:
    lines: int = 0
    matched: int = 0
    unmatched: int = 0
    malformed: int = 0
    dropped: int = 0  # never matched: the matcher fell too far behind (counted in DROPS)
    phases: int = 0
    events: int = 0
    unterminated: int = 0
    errors: list[str] = field(default_factory=list)  # the first few, for the summary

    def report(self) -> str:
        dropped = f", {self.dropped} not matched (matcher behind)" if self.dropped else ""
        return (f"log lines: {self.lines} read, {self.matched} matched, {self.unmatched} "
                f"ignored (no rule), {self.malformed} malformed{dropped}; {self.phases} "
                f"phases ({self.unterminated} unterminated), {self.events} events")


@dataclass
class _Open:
    rule: LineRule
    name: str
    key: tuple[str | None, ...]
    span: Span
    start_ns: int
    parent: _Open | None
    depth: int = 1  # start lines not yet balanced by end lines (rule.balance)


def _convert(value: str, typ: str) -> AttrValue:
    try:
        if typ == "int":
            return int(value)
        if typ == "float":
            return float(value)
    except ValueError as exc:
        raise _Bad(f"{value!r} is not {typ}") from exc
    if typ == "bool":
        return value.strip().lower() not in _FALSE
    return value


class LineEngine:
    """Turns the lines of one run into spans under ``root``. Thread-safe; never raises
    from :meth:`feed`."""

    def __init__(self, rules: LineRules, command: str, root: Span, *,
                 tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None,
                 system: str = "unknown", backend: str = "unknown",
                 console: LineConsumer | None = None) -> None:
        self.rules = rules
        self.console = console
        self.command = command
        self.root = root
        self.stats = LineStats()
        self._active = rules.for_command(command)
        # One RE2 set search per line says which of the active rules' patterns occur in
        # it; a line that none can match (most of a prover's output) costs that one call.
        patterns = [p for r in self._active for p in (r.start, r.end, r.event, r.match)
                    if p is not None]
        self._prefilter = PatternSet(p.pattern for p in patterns)
        self._set_index = {id(p): i for i, p in enumerate(patterns)}
        self._hits: frozenset[int] = frozenset()
        self._tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider)
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._layer_duration = Metric.PROOF_LAYER_DURATION.histogram(meter)
        self._verify_count = Metric.PROOF_VERIFY_COUNT.counter(meter)
        self._system, self._backend = system, backend
        self._open: list[_Open] = []
        self._fresh: list[_Open] = []
        self._layers = 0
        self._verified: bool | None = None
        self._lock = threading.Lock()
        # Monotonic arrival times become wall times with one offset per run, so
        # durations stay monotonic even if the wall clock is stepped meanwhile.
        self._offset = time.time_ns() - time.monotonic_ns()

    # ── public ──

    def begin(self, t_mono: int) -> None:
        """The child started: open the whole-run spans."""
        with self._lock:
            if self.console is not None:
                self.console.begin(t_mono)
            for rule in self._active:
                if rule.whole_run and rule.name:
                    self._open_span(rule, rule.name, (), dict(rule.attributes), t_mono)

    def feed(self, line: str | bytes, t_mono: int) -> None:
        """One output line (without its newline) that arrived at ``t_mono`` (monotonic ns)."""
        with self._lock:
            self.stats.lines += 1
            try:
                text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
                if len(text) > MAX_LINE_CHARS:
                    raise _Bad(f"line longer than {MAX_LINE_CHARS} characters")
                text = _ANSI.sub("", text).strip()
                mine = self.console is not None and self.console.feed(text, t_mono)
                applied = self._apply(text, t_mono) or mine
            except _Bad as exc:
                self._malformed(str(exc))
                return
            except Exception as exc:  # a rule must never take the run down
                self._malformed(f"{type(exc).__name__}: {exc}")
                return
            if applied:
                self.stats.matched += 1
            else:
                self.stats.unmatched += 1

    def dropped_line(self) -> None:
        """A line passed on but never matched (the matcher's queue was full): counted."""
        with self._lock:
            self.stats.lines += 1
            self.stats.dropped += 1

    def malformed_line(self, why: str) -> None:
        """A line the reader could not hand over (over-long): counted, not matched."""
        with self._lock:
            self.stats.lines += 1
            self._malformed(why)

    def finish(self, t_mono: int) -> None:
        """The child exited: close what is open, record file sizes and the counts."""
        with self._lock:
            if self.console is not None:
                self.console.finish(t_mono)
            for o in reversed(list(self._open)):
                if not o.rule.whole_run:
                    o.span.set_attribute(LineAttr.UNTERMINATED, True)
                    self.stats.unterminated += 1
                self._close(o, t_mono)
            for rule in self._active:
                if rule.file_size and rule.command is not None:
                    self._file_size(rule)
            s = self.stats
            for key, value in ((LineAttr.LINES, s.lines), (LineAttr.MATCHED, s.matched),
                               (LineAttr.UNMATCHED, s.unmatched),
                               (LineAttr.MALFORMED, s.malformed),
                               (LineAttr.DROPPED, s.dropped)):
                self.root.set_attribute(key, value)
            self.root.set_attribute(Attr.MAPPING_RULES, self.rules.label)
            if self._verified is not None:
                self._verify_count.add(1, {Attr.PROOF_SYSTEM: self._system,
                                           Attr.PROOF_VERIFIED: self._verified})

    # ── per line ──

    def _apply(self, text: str, t: int) -> bool:
        # Starts first, so an event on the line that opens a phase lands on it; ends
        # after events, so the line that closes a phase can still report on it. A phase
        # opened by this very line is not closed by it (``_fresh``).
        applied = False
        bad: _Bad | None = None
        self._fresh = []
        if self._prefilter.active:
            self._hits = self._prefilter.matching(text)
            if not self._hits:
                return False
        for stage in ("start", "event", "end", "set"):
            for rule in self._active:
                try:
                    applied = getattr(self, f"_{stage}")(rule, text, t) or applied
                except _Bad as exc:
                    bad = bad or exc
        if bad is not None and not applied:
            raise bad
        return applied

    def _search(self, pattern: Pattern | None, text: str) -> Any:
        """``pattern.search(text)``, skipped when the set search found it absent."""
        if pattern is None:
            return None
        if self._prefilter.active and self._set_index[id(pattern)] not in self._hits:
            return None
        return pattern.search(text)

    def _end(self, rule: LineRule, text: str, t: int) -> bool:
        if rule.end is None or not (m := self._search(rule.end, text)):
            return False
        groups = m.groupdict()
        for o in reversed(self._open):
            if o.rule is rule and o not in self._fresh and all(
                    groups.get(k) is None or groups.get(k) == v
                    for k, v in zip(rule.key, o.key, strict=True)):
                o.depth -= 1
                if rule.balance and o.depth > 0:
                    return True
                self._set_captures(o.span, rule, groups, only=rule.end.groupindex)
                self._close(o, t)
                return True
        return False

    def _start(self, rule: LineRule, text: str, t: int) -> bool:
        if rule.start is None or not (m := self._search(rule.start, text)):
            return False
        groups = m.groupdict()
        key = tuple(groups.get(k) for k in rule.key)
        mine = [o for o in self._open if o.rule is rule]
        same = next((o for o in mine if o.key == key), None)
        if same is not None:  # another line of a phase already open (FFT mix/join lines)
            same.depth += self._counts(rule, text)
            return True
        if rule.until_next:
            for o in reversed(mine):
                self._close(o, t)
        assert rule.name is not None
        attrs = dict(rule.attributes)
        attrs.update(self._captures(rule, groups))
        self._open_span(rule, rule.name, key, attrs, t)
        self._open[-1].depth = self._counts(rule, text)
        return True

    @staticmethod
    def _counts(rule: LineRule, text: str) -> int:
        """How much a start line adds to the balance (rule.balance)."""
        if rule.balance_pattern is None:
            return 1
        return 1 if rule.balance_pattern.search(text) else 0

    def _event(self, rule: LineRule, text: str, t: int) -> bool:
        if rule.event is None or not (m := self._search(rule.event, text)):
            return False
        attrs = dict(rule.attributes)
        attrs.update(self._captures(rule, m.groupdict()))
        assert rule.name is not None
        self._event_target(rule.on).add_event(rule.name, attrs, timestamp=t + self._offset)
        self.stats.events += 1
        return True

    def _set(self, rule: LineRule, text: str, t: int) -> bool:
        if rule.match is None or not (m := self._search(rule.match, text)):
            return False
        attrs = dict(rule.set)
        attrs.update(self._captures(rule, m.groupdict()))
        for span in self._targets(rule.on or (_ROOT,)):
            for k, v in attrs.items():
                span.set_attribute(k, v)
        verified = attrs.get(Attr.PROOF_VERIFIED)
        if isinstance(verified, bool):
            self._verified = verified
        return True

    # ── helpers ──

    def _captures(self, rule: LineRule, groups: Mapping[str, str | None]) -> dict[str,
                                                                                 AttrValue]:
        out: dict[str, AttrValue] = {}
        for group, attr in rule.capture.items():
            value = groups.get(group)
            if value is None:
                continue
            out[attr] = _convert(value, rule.types.get(attr, "str"))
        return out

    def _set_captures(self, span: Span, rule: LineRule, groups: Mapping[str, str | None],
                      only: Mapping[str, int]) -> None:
        for group, attr in rule.capture.items():
            value = groups.get(group)
            if group in only and group not in rule.key and value is not None:
                span.set_attribute(attr, _convert(value, rule.types.get(attr, "str")))

    def _event_target(self, names: Sequence[str]) -> Span:
        """The innermost open phase named in ``names``; else the root if named; else the
        innermost open phase; else the root."""
        for o in reversed(self._open):
            if o.name in names:
                return o.span
        if _ROOT in names or not self._open:
            return self.root
        return self._open[-1].span

    def _targets(self, names: Sequence[str]) -> list[Span]:
        """Every span named: the root for ``proof``, else the innermost open phase."""
        out: list[Span] = []
        for name in names:
            if name == _ROOT:
                out.append(self.root)
                continue
            found = next((o for o in reversed(self._open) if o.name == name), None)
            if found is not None:
                out.append(found.span)
        return out

    def _open_span(self, rule: LineRule, name: str, key: tuple[str | None, ...],
                   attrs: dict[str, AttrValue], t: int) -> None:
        if len(self._open) >= MAX_OPEN:
            raise _Bad(f"more than {MAX_OPEN} phases open (an end pattern never matches?)")
        parent = None
        if rule.parent:
            parent = next((o for o in reversed(self._open) if o.name == rule.parent), None)
        attrs[Attr.PROOFSCOPE_TIMING] = Timing.LOG_ARRIVAL
        attrs[Attr.MAPPING_RULES] = self.rules.label
        if rule.layer:  # keeps its name; the layer attributes put it on the walk
            attrs[Attr.LAYER_INDEX] = self._layers
            attrs[Attr.LAYER_KIND] = rule.layer_kind
            self._layers += 1
        ctx = trace.set_span_in_context(parent.span if parent else self.root)
        span = self._tracer.start_span(name, context=ctx, attributes=attrs,
                                       start_time=t + self._offset)
        opened = _Open(rule, name, key, span, t, parent)
        self._open.append(opened)
        self._fresh.append(opened)
        self.stats.phases += 1

    def _close(self, o: _Open, t: int) -> None:
        if o not in self._open:
            return
        for child in [c for c in self._open if c.parent is o]:
            self._close(child, t)  # a phase ends no later than its parent
        self._open.remove(o)
        o.span.end(end_time=t + self._offset)
        if o.rule.layer:
            self._layer_duration.record(max(t - o.start_ns, 0) / 1e9, {
                Attr.PROOF_SYSTEM: self._system, Attr.PROOF_BACKEND: self._backend,
                Attr.LAYER_KIND: o.rule.layer_kind})

    def _file_size(self, rule: LineRule) -> None:
        assert rule.command is not None and rule.file_size is not None
        m = rule.command.search(self.command)
        path = m.group("file") if m else None
        if not path:
            return
        try:
            self.root.set_attribute(rule.file_size, os.stat(path).st_size)
        except OSError as exc:
            self._note(f"{rule.file_size}: cannot stat {path}: {exc.strerror}")

    def _malformed(self, why: str) -> None:
        self.stats.malformed += 1
        self._note(why)

    def _note(self, why: str) -> None:
        if len(self.stats.errors) < 5:
            self.stats.errors.append(why)
