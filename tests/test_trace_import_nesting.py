"""Chrome import: the span tree is the file's own, ties included.

py-spy (``record --format chrometrace``) opens a whole stack at one timestamp and closes
it at another, so most of its spans share their interval with their parent; before this
file's fix the parser nested such pairs by the order their ``E`` came in (the inner one
first) and built every tie upside down (issue 27). The oracle here is the file's own
B/E stack (or a generator's tree), never time containment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_proofscope.integrations.trace_import.chrome import ParseResult, parse


def _tree(r: ParseResult) -> set[tuple[str, str | None]]:
    """(span, parent) by name (the names below are unique)."""
    return {(s.name, None if s.parent is None else r.spans[s.parent].name) for s in r.spans}


def _ev(ph: str, name: str, ts: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": ph, "name": name, "ts": ts, "pid": 1, "tid": tid}


def test_identical_intervals_nest_in_the_files_order() -> None:
    events = [_ev("B", "outer", 0), _ev("B", "inner", 0), _ev("E", "inner", 10),
              _ev("E", "outer", 10)]
    r = parse(json.dumps(events))
    assert _tree(r) == {("outer", None), ("inner", "outer")}
    by = {s.name: s for s in r.spans}
    assert (by["outer"].depth, by["inner"].depth) == (0, 1)


def test_a_whole_stack_opened_and_closed_at_once() -> None:
    names = ["a", "b", "c", "d"]
    events = [_ev("B", n, 5) for n in names] + [_ev("E", n, 9) for n in reversed(names)]
    r = parse(json.dumps(events))
    assert _tree(r) == {("a", None), ("b", "a"), ("c", "b"), ("d", "c")}


def test_a_zero_length_span_at_its_siblings_end_is_its_sibling() -> None:
    events = [_ev("B", "root", 0), _ev("B", "first", 0), _ev("E", "first", 10),
              _ev("B", "blip", 10), _ev("E", "blip", 10), _ev("E", "root", 20)]
    r = parse(json.dumps(events))
    assert _tree(r) == {("root", None), ("first", "root"), ("blip", "root")}


def test_ties_with_an_instant_and_a_complete_event_inside() -> None:
    events = [_ev("B", "outer", 0), _ev("B", "inner", 0),
              {**_ev("X", "work", 2), "dur": 3}, _ev("i", "mark", 4),
              _ev("E", "inner", 10), _ev("E", "outer", 10)]
    r = parse(json.dumps(events))
    assert _tree(r) == {("outer", None), ("inner", "outer"), ("work", "inner")}
    assert [e.name for e in r.spans[[s.name for s in r.spans].index("work")].events] == ["mark"]


# ── the generator's tree ─────────────────────────────────────────────────────────────

@st.composite
def _stream(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """A random well-nested B/E stream on a few threads, times drawn from a tiny range
    so that ties (equal starts, equal ends, zero lengths) are the rule; and its tree."""
    events: list[dict[str, Any]] = []
    parents: dict[str, str | None] = {}
    counter = iter(range(10 ** 6))
    for tid in range(draw(st.integers(1, 3))):
        clock = 0
        stack: list[str] = []
        for _ in range(draw(st.integers(0, 30))):
            clock += draw(st.sampled_from([0, 0, 0, 1]))  # time stands still mostly
            if stack and draw(st.booleans()):
                events.append(_ev("E", stack.pop(), clock, tid))
            else:
                name = f"s{next(counter)}"
                parents[name] = stack[-1] if stack else None
                stack.append(name)
                events.append(_ev("B", name, clock, tid))
        while stack:
            clock += draw(st.sampled_from([0, 1]))
            events.append(_ev("E", stack.pop(), clock, tid))
    return events, parents


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_stream())
def test_random_well_nested_streams_with_ties_give_the_generators_tree(
        stream: tuple[list[dict[str, Any]], dict[str, str | None]]) -> None:
    events, parents = stream
    r = parse(json.dumps(events))
    assert dict(_tree(r)) == parents
    assert not r.skipped


# ── real py-spy output ───────────────────────────────────────────────────────────────

SCRIPT = '''
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def wrap(n):  # only ever calls leaf: every sample of it is one of leaf too (ties)
    return leaf(n)

def mid(n):
    return wrap(n) + wrap(n // 2) + leaf(n // 3)

def outer():
    t = 0
    for _ in range(800):
        t += mid(20000)
    return t

outer()
'''


def _stack_tree(events: list[dict[str, Any]]) -> tuple[dict[int, int | None], int]:
    """The file's own tree: each B's parent is the B open on its thread when it came
    (keyed by the B's position in the file); and how many B/E pairs tie with their
    parent's interval."""
    open_: dict[Any, list[int]] = {}
    parent: dict[int, int | None] = {}
    spans: dict[int, list[Any]] = {}
    for i, e in enumerate(events):
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            stack = open_.setdefault(key, [])
            parent[i] = stack[-1] if stack else None
            stack.append(i)
            spans[i] = [e["ts"], None]
        elif e.get("ph") == "E":
            spans[open_[key].pop()][1] = e["ts"]
    ties = sum(1 for i, p in parent.items() if p is not None and spans[i] == spans[p])
    return parent, ties


def test_real_py_spy_output_nests_as_the_file_says(tmp_path: Path) -> None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        pytest.skip("py-spy is not installed (dev extra)")
    script, out = tmp_path / "busy.py", tmp_path / "spy.json"
    script.write_text(SCRIPT)
    run = subprocess.run([py_spy, "record", "--format", "chrometrace", "-r", "250", "-o",
                          str(out), "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=180)
    if run.returncode != 0 and "ptrace" in (run.stderr + run.stdout).lower():
        pytest.skip(f"py-spy cannot trace here (ptrace): {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    events = json.loads(out.read_text())
    expected, ties = _stack_tree(events)
    assert ties >= 5, f"py-spy wrote {ties} ties: this run tests too little"
    r = parse(out.read_bytes())
    assert not r.skipped and r.unterminated == 0
    assert len(r.spans) == len(expected)
    got = {s.seq: (None if s.parent is None else r.spans[s.parent].seq) for s in r.spans}
    wrong = sum(1 for i, p in expected.items() if got.get(i, "missing") != p)
    assert wrong == 0, f"{wrong} of {len(expected)} spans under the wrong parent"
