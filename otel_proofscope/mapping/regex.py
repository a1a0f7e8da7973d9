"""User regular expressions on a linear-time engine (RE2), so no rule can stall a match.

Rule files carry regexes that run on input someone else controls: span names any OTLP
client may send to ``proofscope serve --map``, lines a prover prints under ``proofscope
run --map``. Python's ``re`` backtracks: ``^(\\w+\\s?)+_prove$`` against 26 characters of
``a`` and ``!`` takes seconds (~4x per 2 more characters) and holds the GIL meanwhile,
which stalls every thread of the process. RE2 (``google-re2``) matches in time linear in
the input whatever the pattern; the price is that backreferences and look-arounds are
refused, which :func:`compile_regex` says at load time, naming the pattern.

RE2 differences a rule writer may meet: ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII
only; ``(?P<name>…)`` groups, classes, anchors, lazy quantifiers and flags like ``(?i)``
work as in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import re2  # type: ignore[import-untyped]

#: Memory RE2 may use for one compiled pattern (its DFA cache); RE2's default is 8 MiB.
#: A pattern that needs more (``a{1000}{1000}``) is refused at load time.
MAX_MEM_BYTES = 32 << 20


class RegexError(ValueError):
    """A pattern the linear-time engine cannot compile; the message says why."""


class Match(Protocol):
    def groupdict(self, default: Any = None) -> dict[str, str | None]: ...

    def group(self, *groups: int | str) -> Any: ...

    def start(self, group: int | str = 0) -> int: ...

    def end(self, group: int | str = 0) -> int: ...


class Pattern(Protocol):
    """What the rule readers use of a compiled pattern (RE2's and ``re``'s alike)."""

    @property
    def pattern(self) -> str: ...

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    def search(self, text: str) -> Match | None: ...


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own copy of the error to stderr
    options.max_mem = MAX_MEM_BYTES
    return options


_OPTIONS = _options()
_HINT = {
    "invalid escape sequence": " (backreferences such as \\1 are not supported)",
    "invalid perl operator": " (look-arounds such as (?=…), (?!…), (?<=…) are not "
                             "supported)",
    "invalid named capture group": " (write named groups as (?P<name>…))",
    "bad repetition operator": " (possessive quantifiers such as a++ are not supported)",
}


class _Found:
    """A match: what the rule readers use (groups by name or number), decoded lazily."""

    __slots__ = ("_data", "_names", "_spans")

    def __init__(self, data: bytes, spans: Sequence[tuple[int, int]],
                 names: Mapping[str, int]) -> None:
        self._data, self._spans, self._names = data, spans, names

    def group(self, *groups: int | str) -> Any:
        picked = [self._one(g) for g in (groups or (0,))]
        return picked[0] if len(picked) == 1 else tuple(picked)

    def _one(self, group: int | str) -> str | None:
        index = self._names[group] if isinstance(group, str) else group
        start, end = self._spans[index]
        return None if start < 0 else self._data[start:end].decode("utf-8", "replace")

    def groupdict(self, default: Any = None) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name, index in self._names.items():
            value = self._one(index)
            out[name] = default if value is None else value
        return out

    def start(self, group: int | str = 0) -> int:
        raise NotImplementedError("byte offsets only; the rule readers need none")

    end = start


class _Compiled:
    """An RE2 pattern searched on the text's UTF-8 bytes in one C call.

    google-re2's own ``search`` on a ``str`` walks a Python generator and maps every
    byte offset back to a character offset; the rule readers need neither (only the
    groups' text), and that wrapper made a matched log line ~1.5x slower than with
    ``re``. Matching semantics are RE2's in both cases.
    """

    __slots__ = ("_inner", "_regexp", "groupindex", "pattern")

    def __init__(self, compiled: Any, text: str) -> None:
        self._inner = compiled
        self._regexp = compiled._regexp  # the RE2 object of google-re2's wrapper
        self.pattern = text
        self.groupindex: Mapping[str, int] = dict(compiled.groupindex)

    def search(self, text: str) -> Match | None:
        data = text.encode("utf-8", "surrogatepass")  # a lone surrogate: no match, no error
        spans = self._regexp.Match(_UNANCHORED, data, 0, len(data))
        if spans[0][0] < 0:
            return None
        return _Found(data, spans, self.groupindex)


_UNANCHORED = re2._Anchor.UNANCHORED


def compile_regex(text: str) -> Pattern:
    """``text`` compiled by RE2; :class:`RegexError` saying why when it cannot be."""
    try:
        pattern: Pattern = _Compiled(re2.compile(text, _OPTIONS), text)
    except re2.error as exc:
        reason = _reason(exc)
        hint = next((h for k, h in _HINT.items() if k in reason), "")
        raise RegexError(f"the linear-time regex engine (RE2) cannot use it: "
                         f"{reason}{hint}") from None
    except (TypeError, ValueError) as exc:
        raise RegexError(str(exc)) from None
    return pattern


def _reason(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else str(exc)
    if isinstance(arg, bytes):
        arg = arg.decode("utf-8", "replace")
    return str(arg)


class PatternSet:
    """Many patterns searched in one pass: which of them can match a text.

    The line rules run every rule's patterns on every line a prover prints; most lines
    match none. One RE2 set search per line (one C call, linear in the line) says which
    patterns match at all, so a line no rule matches costs that one call.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns: Sequence[str] = tuple(patterns)
        self._set: Any = None
        if self.patterns:
            try:
                built = re2.Set.SearchSet(_OPTIONS)
                for p in self.patterns:
                    built.Add(p)
                built.Compile()
            except re2.error:
                return  # over RE2's memory bound as a set: each pattern on its own
            self._set = built

    @property
    def active(self) -> bool:
        """False when the set could not be built (callers then search each pattern)."""
        return self._set is not None

    def matching(self, text: str) -> frozenset[int]:
        """Indexes (into :attr:`patterns`) of the patterns found in ``text``."""
        if self._set is None:
            return frozenset()
        found = self._set.Match(text)
        return frozenset(found) if found else frozenset()
