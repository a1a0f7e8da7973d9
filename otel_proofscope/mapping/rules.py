"""Load and validate the ``[meta]``, ``[[span]]`` and ``[[event]]`` parts of a rule file.

A rule file (TOML, docs/mapping.md) says which of a foreign prover's spans and span
events are which proof phase. This module only reads and checks it; applying the rules
is :mod:`otel_proofscope.mapping.apply`. ``[[line]]`` rules (log lines of CLI provers)
share the file and are read by ``mapping/lines.py``; they are accepted here unread.

Every mistake is an error that names the file, the rule (``[[span]] #2``, numbered from
1 in each kind of table) and the key, raised before a single span is mapped: a typo must
not silently map nothing. Regexes are compiled by RE2 (mapping/regex.py), so no pattern
can make a match take more than linear time.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from otel_proofscope.mapping import files
from otel_proofscope.mapping.files import PRESETS_DIR, preset_names
from otel_proofscope.mapping.regex import Pattern, RegexError, compile_regex
from otel_proofscope.semconv import EventName, SpanName

#: Top-level keys of a rule file; ``line`` belongs to mapping/lines.py.
TOP_LEVEL_KEYS = frozenset({"meta", "span", "event", "line"})
META_KEYS = frozenset({"name", "description", "system", "sources", "detect"})

_E = TypeVar("_E", bound=StrEnum)

#: Attribute values a rule may set: what OTel allows on a span, scalars or flat lists.
Scalar = str | int | float | bool


class RuleError(ValueError):
    """A rule file that cannot be used; the message names file, rule and key."""


class Target(StrEnum):
    """What a ``[[span]]`` rule turns a span into (the value of its ``to`` key)."""

    PROOF = "proof"
    CIRCUIT_COMPILE = "circuit_compile"
    LAYER = "layer"
    WEIGHT_OPENING = "weight_opening"
    AGGREGATED_BINDING = "aggregated_binding"
    STARK = "stark"
    VERIFY = "verify"
    #: Not a span of its own: a ``proof.sumcheck.round`` event on its parent layer, at
    #: the span's end (for provers that open one span per round instead of an event).
    ROUND = "round"

    @property
    def span_name(self) -> str:
        return _SPAN_NAMES[self]


_SPAN_NAMES = {
    Target.PROOF: SpanName.PROOF,
    Target.CIRCUIT_COMPILE: SpanName.CIRCUIT_COMPILE,
    Target.LAYER: SpanName.LAYER,
    Target.WEIGHT_OPENING: SpanName.WEIGHT_OPENING,
    Target.AGGREGATED_BINDING: SpanName.AGGREGATED_BINDING,
    Target.STARK: SpanName.STARK,
    Target.VERIFY: SpanName.VERIFY,
    Target.ROUND: EventName.SUMCHECK_ROUND,
}


class EventTarget(StrEnum):
    """What an ``[[event]]`` rule turns a span event into."""

    ROUND = "round"


@dataclass(frozen=True)
class Matcher:
    """Which names (and attribute values) a rule applies to."""

    name: str | None = None
    regex: Pattern | None = None  # RE2: linear in the name, whatever the pattern
    where: Mapping[str, Scalar] = field(default_factory=dict)

    def matches(self, name: str, attributes: Mapping[str, Any] | None) -> bool:
        if self.name is not None and name != self.name:
            return False
        if self.regex is not None and self.regex.search(name) is None:
            return False
        if self.where:
            attrs = attributes or {}
            for key, value in self.where.items():
                if attrs.get(key) != value:
                    return False
        return True


@dataclass(frozen=True)
class SpanRule:
    """One ``[[span]]`` table."""

    number: int  # 1-based position among the file's [[span]] tables, for messages
    match: Matcher
    to: Target
    attributes: Mapping[str, Scalar | tuple[Scalar, ...]] = field(default_factory=dict)
    copy: Mapping[str, str] = field(default_factory=dict)  # contract key ← source key
    index_from: str | None = None  # layer: attribute holding the layer index
    kind: str | None = None  # layer: fixed kind
    kind_from: str | None = None  # layer: attribute holding the kind
    kinds: Mapping[str, str] = field(default_factory=dict)  # layer: source name → kind
    round_from: str | None = None  # round: attribute holding the round number
    #: True: only spans without a parent (a trace's root); False: only spans with one.
    #: Tells apart two spans of one name, e.g. sp1-cluster's task span in the proof's
    #: trace (a parent) from its twin that starts the task's own trace (none).
    root: bool | None = None
    # Where the rule's names come from, for scripts/preset-names (the mapper ignores
    # them): the upstream repositories ("owner/name") that define them; the versions a
    # rule is kept for when the current source no longer has its names; and, for a name
    # built at run time, how (the source cannot be checked for it).
    upstream: tuple[str, ...] = ()
    legacy: str | None = None
    named_at_run_time: str | None = None

    def applies(self, name: str, attributes: Mapping[str, Any] | None,
                has_parent: bool) -> bool:
        if self.root is not None and self.root == has_parent:
            return False
        return self.match.matches(name, attributes)


@dataclass(frozen=True)
class EventRule:
    """One ``[[event]]`` table."""

    number: int
    match: Matcher
    to: EventTarget
    on: Matcher | None = None  # only events on spans whose *source* name matches
    round_from: str | None = None  # attribute holding the round number
    attributes: Mapping[str, Scalar | tuple[Scalar, ...]] = field(default_factory=dict)
    copy: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Meta:
    name: str
    description: str = ""
    system: str | None = None
    sources: tuple[str, ...] = ()
    detect: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuleSet:
    """A loaded rule file: ``meta``, ``spans``, ``events`` and where it came from."""

    meta: Meta
    spans: tuple[SpanRule, ...]
    events: tuple[EventRule, ...]
    path: Path | None = None

    @property
    def label(self) -> str:
        """What ``proofscope.mapping.rules`` says: the preset name or the file path."""
        if self.path is not None and self.path.parent == PRESETS_DIR:
            return self.meta.name
        return str(self.path) if self.path is not None else self.meta.name


# ── resolution ───────────────────────────────────────────────────────────────────────


def resolve_rule_file(name_or_path: str) -> Path:
    """A preset name (``sp1``) or a path to a rule file (``mapping/files.py`` resolves
    both rule readers' names), as a :class:`RuleError` when there is neither."""
    text = name_or_path.strip()
    if not text:
        raise RuleError("empty rule file name")
    try:
        return files.resolve_rule_file(text)
    except FileNotFoundError:
        raise RuleError(f"no preset or rule file named {text!r} (presets: "
                        f"{', '.join(preset_names()) or 'none'})") from None


def load_rules(name_or_path: str | Path) -> RuleSet:
    """Load and check a preset (by name) or a rule file (by path)."""
    path = resolve_rule_file(str(name_or_path))
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise RuleError(f"{path}: cannot read: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RuleError(f"{path}: not UTF-8 text: {exc}") from None
    return parse_rules(data, path)


def parse_rules(data: Mapping[str, Any], path: Path | None = None) -> RuleSet:
    """A rule set from already-parsed TOML (``path`` only names it in messages)."""
    where = str(path) if path is not None else "<rules>"
    unknown = sorted(set(data) - TOP_LEVEL_KEYS)
    if unknown:
        raise RuleError(f"{where}: unknown top-level key {unknown[0]!r} (allowed: "
                        f"{', '.join(sorted(TOP_LEVEL_KEYS))})")
    meta = _meta(data.get("meta"), where, path)
    spans = tuple(_span_rule(t, n, where)
                  for n, t in enumerate(_tables(data, "span", where), start=1))
    events = tuple(_event_rule(t, n, where)
                   for n, t in enumerate(_tables(data, "event", where), start=1))
    if "line" in data and not isinstance(data["line"], list):
        raise RuleError(f"{where}: 'line' must be an array of tables ([[line]])")
    return RuleSet(meta, spans, events, path)


# ── sections ─────────────────────────────────────────────────────────────────────────


def _tables(data: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    raw = data.get(key, [])
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise RuleError(f"{where}: '{key}' must be an array of tables ([[{key}]])")
    return raw


def _meta(raw: Any, where: str, path: Path | None) -> Meta:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RuleError(f"{where}: [meta] must be a table")
    ctx = f"{where}: [meta]"
    _no_unknown(raw, META_KEYS, ctx)
    default = path.stem if path is not None else "rules"
    return Meta(
        name=_opt_str(raw, "name", ctx) or default,
        description=_opt_str(raw, "description", ctx) or "",
        system=_opt_str(raw, "system", ctx),
        sources=_str_list(raw, "sources", ctx),
        detect=tuple(_regex(p, f"{ctx} key 'detect'").pattern
                     for p in _str_list(raw, "detect", ctx)),
    )


_SPAN_KEYS = frozenset({"match", "match_regex", "where", "root", "to", "attributes", "copy",
                        "index_from", "kind", "kind_from", "kinds", "round_from",
                        "upstream", "legacy", "named_at_run_time"})
_LAYER_ONLY = ("index_from", "kind", "kind_from", "kinds")
_EVENT_KEYS = frozenset({"match", "match_regex", "where", "to", "on", "on_regex",
                         "round_from", "attributes", "copy"})


def _span_rule(raw: Mapping[str, Any], number: int, where: str) -> SpanRule:
    ctx = f"{where}: [[span]] #{number}"
    _no_unknown(raw, _SPAN_KEYS, ctx)
    to = _enum(raw, "to", Target, ctx)
    if to is not Target.LAYER:
        for key in _LAYER_ONLY:
            if key in raw:
                raise RuleError(f"{ctx}: key {key!r} only applies to to = \"layer\"")
    if to is not Target.ROUND and "round_from" in raw:
        raise RuleError(f"{ctx}: key 'round_from' only applies to to = \"round\"")
    if "kind" in raw and ("kind_from" in raw or "kinds" in raw):
        raise RuleError(f"{ctx}: key 'kind' (a fixed kind) excludes 'kind_from' and 'kinds'")
    kinds = _str_map(raw, "kinds", ctx)
    root = raw.get("root")
    if root is not None and not isinstance(root, bool):
        raise RuleError(f"{ctx}: key 'root' must be true or false, got {root!r}")
    return SpanRule(number=number, match=_matcher(raw, ctx, "match", "match_regex"), to=to,
                    attributes=_values(raw, "attributes", ctx), copy=_str_map(raw, "copy", ctx),
                    index_from=_opt_str(raw, "index_from", ctx), kind=_opt_str(raw, "kind", ctx),
                    kind_from=_opt_str(raw, "kind_from", ctx), kinds=kinds,
                    round_from=_opt_str(raw, "round_from", ctx), root=root,
                    upstream=_upstream(raw, ctx), legacy=_opt_str(raw, "legacy", ctx),
                    named_at_run_time=_opt_str(raw, "named_at_run_time", ctx))


def _upstream(raw: Mapping[str, Any], ctx: str) -> tuple[str, ...]:
    value = raw.get("upstream", [])
    repos = [value] if isinstance(value, str) else value
    if not isinstance(repos, list) or not all(
            isinstance(r, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", r) for r in repos):
        raise RuleError(f"{ctx}: key 'upstream' must be a repository \"owner/name\" or a "
                        f"list of them, got {value!r}")
    return tuple(repos)


def _event_rule(raw: Mapping[str, Any], number: int, where: str) -> EventRule:
    ctx = f"{where}: [[event]] #{number}"
    _no_unknown(raw, _EVENT_KEYS, ctx)
    to = _enum(raw, "to", EventTarget, ctx)
    on = None
    if "on" in raw or "on_regex" in raw:
        on = _matcher(raw, ctx, "on", "on_regex", where_key=None)
    return EventRule(number=number, match=_matcher(raw, ctx, "match", "match_regex"), to=to,
                     on=on, round_from=_opt_str(raw, "round_from", ctx),
                     attributes=_values(raw, "attributes", ctx), copy=_str_map(raw, "copy", ctx))


def _matcher(raw: Mapping[str, Any], ctx: str, name_key: str, regex_key: str,
             where_key: str | None = "where") -> Matcher:
    name = _opt_str(raw, name_key, ctx)
    regex_text = _opt_str(raw, regex_key, ctx)
    if name is None and regex_text is None:
        raise RuleError(f"{ctx}: needs '{name_key}' (an exact name) or '{regex_key}' "
                        "(a regular expression)")
    if name is not None and regex_text is not None:
        raise RuleError(f"{ctx}: give '{name_key}' or '{regex_key}', not both")
    regex = _regex(regex_text, f"{ctx} key {regex_key!r}") if regex_text is not None else None
    cond: dict[str, Scalar] = {}
    if where_key is not None and where_key in raw:
        table = raw[where_key]
        if not isinstance(table, dict):
            raise RuleError(f"{ctx}: key {where_key!r} must be a table of attribute = value")
        for key, value in table.items():
            if not _is_scalar(value):
                raise RuleError(f"{ctx}: key '{where_key}.{key}' must be a string, number or "
                                f"boolean, got {type(value).__name__}")
            cond[key] = value
    return Matcher(name=name, regex=regex, where=cond)


# ── typed reads ──────────────────────────────────────────────────────────────────────


def _no_unknown(raw: Mapping[str, Any], allowed: frozenset[str], ctx: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise RuleError(f"{ctx}: unknown key {unknown[0]!r} (allowed: "
                        f"{', '.join(sorted(allowed))})")


def _opt_str(raw: Mapping[str, Any], key: str, ctx: str) -> str | None:
    if key not in raw:
        return None
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise RuleError(f"{ctx}: key {key!r} must be a non-empty string, got {value!r}")
    return value


def _str_list(raw: Mapping[str, Any], key: str, ctx: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(f"{ctx}: key {key!r} must be a list of strings")
    return tuple(value)


def _str_map(raw: Mapping[str, Any], key: str, ctx: str) -> dict[str, str]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise RuleError(f"{ctx}: key {key!r} must be a table of strings")
    for k, v in value.items():
        if not isinstance(v, str) or not v:
            raise RuleError(f"{ctx}: key '{key}.{k}' must be a non-empty string, got {v!r}")
    return dict(value)


def _values(raw: Mapping[str, Any], key: str, ctx: str,
            ) -> dict[str, Scalar | tuple[Scalar, ...]]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise RuleError(f"{ctx}: key {key!r} must be a table of attribute = value")
    out: dict[str, Scalar | tuple[Scalar, ...]] = {}
    for k, v in value.items():
        if _is_scalar(v):
            out[k] = v
        elif isinstance(v, list) and v and all(_is_scalar(x) for x in v) \
                and len({type(x) for x in v}) == 1:
            out[k] = tuple(v)
        else:
            raise RuleError(f"{ctx}: key '{key}.{k}' must be a string, number, boolean or a "
                            f"non-empty list of one of those, got {v!r}")
    return out


def _enum(raw: Mapping[str, Any], key: str, enum: type[_E], ctx: str) -> _E:
    if key not in raw:
        raise RuleError(f"{ctx}: missing key {key!r} (one of: "
                        f"{', '.join(e.value for e in enum)})")
    try:
        return enum(raw[key])
    except ValueError:
        raise RuleError(f"{ctx}: key {key!r} is {raw[key]!r}, not one of: "
                        f"{', '.join(e.value for e in enum)}") from None


def _regex(text: str, ctx: str) -> Pattern:
    # Checked here, at load time: serve and run match these on input anyone may send.
    try:
        return compile_regex(text)
    except RegexError as exc:
        raise RuleError(f"{ctx}: not a valid regular expression {text!r}: {exc}") from None


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | int | float | bool)
