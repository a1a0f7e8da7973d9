"""A Rust prover's tracing close lines as spans (mapping/rust_tracing.py, rust_console.py).

The parser is checked on lines copied from the real program in tests/rust_prover (built
from Debian's tracing-subscriber 0.3.16), on generated trees printed the way
tracing-subscriber prints them (both formats, ANSI or not, timestamps or not, threads
interleaved), and end to end: that program under ``proofscope run``, read back from the
OTLP JSON file and the .rrd.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_proofscope.mapping.rust_forest import (
    ForestAssembler,
    forest_layout,
    parse_forest_line,
)
from otel_proofscope.mapping.rust_tracing import (
    ARRIVAL_SLACK_NS,
    CloseLineError,
    Rebuilt,
    SpanAssembler,
    field_value,
    parse_close_line,
    parse_duration,
    parse_fields,
    parse_timestamp,
)
from otel_proofscope.semconv import SpanName, Timing

REPO = Path(__file__).resolve().parent.parent
PROVER_SRC = REPO / "tests" / "rust_prover"
PROVER_BUILD = REPO / "build" / "rust_prover"

# Copied from `rust_prover` (compact, ANSI: SP1's default logger) and `rust_prover full`.
COMPACT_ANSI = (
    "\x1b[2m2026-12-02T18:51:30.294930Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[1mprove\x1b[0m:"
    "\x1b[1mcore prove with pk\x1b[0m:\x1b[1mprove shard with data\x1b[0m:\x1b[1mzerocheck"
    "\x1b[0m:\x1b[1mzerocheck round\x1b[0m: close \x1b[3mtime.busy\x1b[0m\x1b[2m=\x1b[0m"
    "3.38ms \x1b[3mtime.idle\x1b[0m\x1b[2m=\x1b[0m7.41µs \x1b[2m\x1b[3mmode\x1b[0m\x1b[2m="
    "\x1b[0m\"Compressed\"\x1b[0m \x1b[2m\x1b[3mshard\x1b[0m\x1b[2m=\x1b[0m0\x1b[0m "
    "\x1b[2m\x1b[3mround\x1b[0m\x1b[2m=\x1b[0m0\x1b[0m")
FULL_ANSI = (
    "\x1b[32m INFO\x1b[0m \x1b[1mprove\x1b[0m\x1b[1m{\x1b[0m\x1b[3mmode\x1b[0m\x1b[2m=\x1b[0m"
    "\"Compressed\"\x1b[1m}\x1b[0m\x1b[2m:\x1b[0m\x1b[1mcore prove with pk\x1b[0m\x1b[2m:"
    "\x1b[0m\x1b[1mprove shard with data\x1b[0m\x1b[1m{\x1b[0m\x1b[3mshard\x1b[0m\x1b[2m="
    "\x1b[0m1\x1b[1m}\x1b[0m\x1b[2m:\x1b[0m\x1b[1mcommit traces\x1b[0m\x1b[2m:\x1b[0m close "
    "\x1b[3mtime.busy\x1b[0m\x1b[2m=\x1b[0m15.1ms \x1b[3mtime.idle\x1b[0m\x1b[2m=\x1b[0m"
    "11.6µs")


# ── single lines ─────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("text", "ns"), [
    ("100ns", 100), ("9.50ns", 10), ("25.3µs", 25_300), ("25.3μs", 25_300),
    ("25.3us", 25_300), ("7.12ms", 7_120_000), ("114ms", 114_000_000),
    ("1.50s", 1_500_000_000), ("1234s", 1_234_000_000_000), ("1.5e3ms", 1_500_000_000),
    ("3ms", 3_000_000)])
def test_every_duration_unit(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["7.12", "ms", "7.12 m", "-1ms", "1.2.3ms"])
def test_a_bad_duration_is_an_error(text: str) -> None:
    with pytest.raises(CloseLineError):
        parse_duration(text)


def test_timestamps_utc_offset_and_fraction() -> None:
    base = int(datetime(2026, 12, 2, 18, 40, 14, tzinfo=UTC).timestamp()) * 10**9
    assert parse_timestamp("2026-12-02T18:40:14.289898Z") == base + 289_898_000
    assert parse_timestamp("2026-12-02T18:40:14.289898123Z") == base + 289_898_123
    assert parse_timestamp("2026-12-02T19:40:14+01:00") == base
    assert parse_timestamp("2026-12-02T18:40:14") == base


def test_compact_line_with_ansi_as_sp1_prints_it() -> None:
    line = parse_close_line(COMPACT_ANSI)
    assert line is not None
    assert line.path == ("prove", "core prove with pk", "prove shard with data", "zerocheck",
                         "zerocheck round")
    assert (line.busy_ns, line.idle_ns) == (3_380_000, 7_410)
    assert line.tail == (("mode", '"Compressed"'), ("shard", "0"), ("round", "0"))
    assert line.level == "INFO" and line.wall_ns is not None


def test_full_line_fields_in_braces_without_timestamp() -> None:
    line = parse_close_line(FULL_ANSI)
    assert line is not None
    assert line.path == ("prove", "core prove with pk", "prove shard with data",
                         "commit traces")
    assert line.path_fields == ((("mode", '"Compressed"'),), (), (("shard", "1"),), ())
    assert line.tail == () and line.wall_ns is None
    assert (line.busy_ns, line.idle_ns) == (15_100_000, 11_600)


@pytest.mark.parametrize("text", [
    # thread name and id, target, file and line number
    "2026-12-02T18:40:14.289898Z DEBUG shard-1 ThreadId(03) prove:zerocheck: "
    "sp1_core::prover: src/prover.rs:12: close time.busy=1.00ms time.idle=2.00µs",
    # Uptime timer, no level
    "   0.012345678s prove:zerocheck: close time.busy=1.00ms time.idle=2.00µs",
])
def test_optional_parts_of_the_line(text: str) -> None:
    line = parse_close_line(text)
    assert line is not None and line.path == ("prove", "zerocheck")
    assert line.busy_ns == 1_000_000


def test_thread_and_target_are_kept() -> None:
    line = parse_close_line(
        "2026-12-02T18:40:14.289898Z  WARN shard-1 ThreadId(03) prove{a=\"x: y}\"}:zerocheck: "
        "sp1_core::prover: close time.busy=1.00ms time.idle=2.00µs")
    assert line is not None
    assert (line.thread_name, line.thread_id, line.target) == ("shard-1", 3, "sp1_core::prover")
    assert line.path_fields[0] == (("a", '"x: y}"'),)


def test_uptime_is_relative() -> None:
    line = parse_close_line("   1.500000000s  INFO prove: close time.busy=1.00s time.idle=0ns")
    assert line is not None and line.uptime_ns == 1_500_000_000 and line.wall_ns is None


@pytest.mark.parametrize("text", [
    "2026-12-02T18:51:30.349118Z  INFO prove: proof done proof_size=1234",
    " INFO prove: close enough, said the prover",
    "Closing the file: close",
    "plain output of a prover",
    "",
])
def test_other_lines_are_not_close_lines(text: str) -> None:
    assert parse_close_line(text) is None


def test_close_line_with_a_bad_duration_is_malformed() -> None:
    with pytest.raises(CloseLineError):
        parse_close_line(" INFO prove: close time.busy=7.12 time.idle=1ns")


def test_fields_quoted_spaced_and_typed() -> None:
    fields = parse_fields('a=1 b="x y=2 \\"q\\"" c=Some(3) d=[1, 2] e=true f=1.5 msg')
    assert fields == (("a", "1"), ("b", '"x y=2 \\"q\\""'), ("c", "Some(3)"), ("d", "[1, 2]"),
                      ("e", "true"), ("f", "1.5 msg"))
    assert [field_value(v) for _, v in fields[:5]] == [1, 'x y=2 "q"', "Some(3)", "[1, 2]",
                                                       True]
    assert field_value("1.5") == 1.5 and field_value(str(2**70)) == str(2**70)


# ── trees from lines ─────────────────────────────────────────────────────────────────


def _assemble(lines: list[str], ends: list[int] | None = None) -> tuple[list[Rebuilt],
                                                                       SpanAssembler]:
    a = SpanAssembler()
    trees: list[Rebuilt] = []
    for i, text in enumerate(lines):
        line = parse_close_line(text)
        assert line is not None, text
        end = line.wall_ns if line.wall_ns is not None else (ends[i] if ends else i * 10**9)
        trees += a.add(line, end, stamped=line.wall_ns is not None)
    return trees + a.finish(10**12), a


def test_concurrent_parents_with_one_path_keep_their_children_by_fields() -> None:
    # Two shards on two threads, closes interleaved; compact puts the scope's fields last.
    c = " INFO p:shard:{}: close time.busy=1.00s time.idle=0ns mode=1 {}"
    lines = [c.format("a", "shard=0"), c.format("a", "shard=1"),
             c.format("b", "shard=1"), c.format("b", "shard=0"),
             " INFO p:shard: close time.busy=2.95s time.idle=0ns mode=1 shard=1",
             " INFO p:shard: close time.busy=3.05s time.idle=0ns mode=1 shard=0",
             " INFO p: close time.busy=5.00s time.idle=0ns mode=1"]
    ends = [2.0, 2.05, 3.0, 3.05, 4.0, 4.05, 5.0]
    (tree,), a = _assemble(lines, [round(e * 10**9) for e in ends])
    shards = {dict(s.fields)["shard"]: [ch.name for ch in s.children] for s in tree.children}
    assert shards == {"0": ["a", "b"], "1": ["a", "b"]}
    assert all(not ch.fields for s in tree.children for ch in s.children)  # own fields only
    assert a.stats.ambiguous == 0 and a.stats.unterminated == 0


def test_same_path_same_fields_concurrently_is_placed_by_time_and_flagged() -> None:
    # Two `s` open at once with nothing in their lines to tell them apart: s1 [0, 12 s]
    # with x [1, 2 s], s2 [8, 11 s] with y [9, 10 s].
    lines = [" INFO p:s:x: close time.busy=1.00s time.idle=0ns",
             " INFO p:s:y: close time.busy=1.00s time.idle=0ns",
             " INFO p:s: close time.busy=3.00s time.idle=0ns",
             " INFO p:s: close time.busy=12.0s time.idle=0ns",
             " INFO p: close time.busy=13.0s time.idle=0ns"]
    (tree,), a = _assemble(lines, [e * 10**9 for e in (2, 10, 11, 12, 13)])
    s1, s2 = tree.children
    assert [c.name for c in s1.children] == ["x"] and [c.name for c in s2.children] == ["y"]
    assert s2.children[0].ambiguous and a.stats.ambiguous == 1


ROUNDS_READ_TOGETHER = [" INFO p:zc:round: close time.busy=3.00ms time.idle=0ns round=0",
                        " INFO p:zc:round: close time.busy=3.10ms time.idle=0ns round=1",
                        " INFO p:zc:round: close time.busy=2.90ms time.idle=0ns round=2",
                        " INFO p:zc: close time.busy=9.50ms time.idle=0ns",
                        " INFO p: close time.busy=10.0ms time.idle=0ns"]


def _rounds(tree: Rebuilt) -> list[Rebuilt]:
    (zc,) = tree.children
    return zc.children


def test_siblings_read_together_are_laid_out_in_close_order() -> None:
    # No timestamps, one read: every line ends at the same instant, so round 1 (the
    # longest) would seem to start first. One thread runs them one after another.
    e = 10**9
    (tree,), _ = _assemble(ROUNDS_READ_TOGETHER, [e] * 5)
    rounds = _rounds(tree)
    assert [dict(r.fields)["round"] for r in rounds] == ["0", "1", "2"]
    assert [(r.start_ns, r.end_ns) for r in rounds] == [
        (e - 9_000_000, e - 6_000_000), (e - 6_000_000, e - 2_900_000), (e - 2_900_000, e)]
    assert [r.placed_by_order for r in rounds] == [True, True, False]


def test_siblings_read_apart_keep_their_derived_times() -> None:
    e = 10**9
    (tree,), _ = _assemble(ROUNDS_READ_TOGETHER, [e, e + 1, e + 2, e + 3, e + 3])
    rounds = _rounds(tree)
    by_round = sorted(rounds, key=lambda r: dict(r.fields)["round"])
    assert [r.end_ns for r in by_round] == [e, e + 1, e + 2]
    assert not any(r.placed_by_order for r in rounds)


def test_siblings_on_two_threads_read_together_may_overlap() -> None:
    lines = [" INFO ThreadId(02) p:zc:round: close time.busy=3.00ms time.idle=0ns",
             " INFO ThreadId(03) p:zc:round: close time.busy=3.10ms time.idle=0ns",
             " INFO ThreadId(01) p:zc: close time.busy=9.00ms time.idle=0ns",
             " INFO ThreadId(01) p: close time.busy=10.0ms time.idle=0ns"]
    (tree,), _ = _assemble(lines, [10**9] * 4)
    assert [r.line.thread_id for r in _rounds(tree) if r.line] == [3, 2]
    assert {r.end_ns for r in _rounds(tree)} == {10**9}
    assert not any(r.placed_by_order for r in _rounds(tree))


def test_close_order_never_moves_a_child_out_of_its_parent() -> None:
    # Read together, but laid end to end they would not fit in zc (9.5 ms > 5 ms): they
    # overlapped (threads not printed), so they stay as derived.
    lines = [*ROUNDS_READ_TOGETHER[:3], " INFO p:zc: close time.busy=5.00ms time.idle=0ns",
             ROUNDS_READ_TOGETHER[4]]
    (tree,), _ = _assemble(lines, [10**9] * 5)
    rounds = _rounds(tree)
    assert min(r.start_ns for r in rounds) >= 10**9 - 5_050_000
    assert not any(r.placed_by_order for r in rounds)


def test_parents_that_never_close_are_made_up_and_marked() -> None:
    lines = [" INFO prove:core:shard{shard=0}:a: close time.busy=1.00s time.idle=0ns",
             " INFO prove:core:shard{shard=1}:a: close time.busy=1.00s time.idle=0ns"]
    (tree,), a = _assemble(lines)
    assert tree.name == "prove" and tree.unterminated
    (core,) = tree.children
    assert [dict(s.fields)["shard"] for s in core.children] == ["0", "1"]
    assert a.stats.unterminated == 4  # prove, core, two shards
    assert core.end_ns == 10**12  # ended when the output ended


def test_close_lines_without_timing_are_not_read() -> None:
    # FmtSpan timing off (or without_time() on the builder): no start to derive.
    assert parse_close_line(' INFO prove: close mode="x"') is None
    assert parse_close_line(" INFO prove: close") is None


def test_pending_children_are_bounded_and_counted() -> None:
    a = SpanAssembler(max_pending=2)
    for _ in range(5):
        line = parse_close_line(" INFO p:c: close time.busy=1.00ns time.idle=0ns")
        assert line is not None
        a.add(line, 100)
    assert a.stats.dropped == 3


# ── generated trees, printed as tracing-subscriber prints them ─────────────────────


def timing_display(ns: int) -> str:
    """tracing-subscriber 0.3's ``TimingDisplay`` (fmt/format/mod.rs)."""
    t = float(ns)
    for unit in ("ns", "µs", "ms", "s"):
        if t < 10:
            return f"{t:.2f}{unit}"
        if t < 100:
            return f"{t:.1f}{unit}"
        if t < 1000:
            return f"{t:.0f}{unit}"
        t /= 1000
    return f"{t * 1000:.0f}s"


@dataclass
class Node:
    name: str
    fields: list[tuple[str, str]]
    start: int
    end: int
    idle: int
    children: list[Node] = field(default_factory=list)
    parent: Node | None = None

    def walk(self) -> Any:
        yield self
        for c in self.children:
            yield from c.walk()


NAMES = st.sampled_from(["prove", "core prove with pk", "prove shard with data", "zerocheck",
                         "commit traces", "a", "logup gkr proof"])
VALUES = st.one_of(st.integers(-5, 10**6).map(str),
                   st.text("abc xyz=:{}", min_size=0, max_size=6).map(json.dumps),
                   st.sampled_from(["true", "Some(3)", "1.5"]))


@st.composite
def trees(draw: Any, depth: int = 0, start: int = 10**15, length: int = 10**10,
          lane: int | None = None) -> Node:
    fields = [(k, draw(VALUES)) for k in draw(st.lists(st.sampled_from(["shard", "round",
                                                                        "x"]), max_size=2,
                                                       unique=True))]
    if lane is not None:
        fields = [f for f in fields if f[0] != "lane"] + [("lane", str(lane))]
    node = Node(draw(NAMES), fields, start, start + length, 0)
    if depth < 3 and length > 10_000:
        n = draw(st.integers(0, 3))
        concurrent = n >= 2 and draw(st.booleans())
        for i in range(n):
            if concurrent:  # overlapping lanes (threads) tell themselves apart by a field
                s = start + length // (4 * n) * (i + 1) // 2
                ln = length // 2
                child = draw(trees(depth + 1, s, ln, lane=i))
            else:  # one after the other inside the parent
                slot = length // n
                s = start + slot * i + slot // 10
                child = draw(trees(depth + 1, s, slot * 8 // 10))
            child.parent = node
            node.children.append(child)
    # Part of the span's life not entered: time.idle.
    node.idle = draw(st.integers(0, length // 2))
    return node


def _ansi(s: str, on: bool, code: str = "1") -> str:
    return f"\x1b[{code}m{s}\x1b[0m" if on else s


def render(node: Node, fmt: str, ansi: bool, stamped: bool) -> str:
    chain = []
    n: Node | None = node
    while n is not None:
        chain.append(n)
        n = n.parent
    chain.reverse()
    fields = lambda fs: " ".join(f"{_ansi(k, ansi, '3')}={v}" for k, v in fs)  # noqa: E731
    if fmt == "full":
        path = ":".join(_ansi(c.name, ansi) + ("{" + fields(c.fields) + "}" if c.fields else "")
                        for c in chain) + ":"
        tail = ""
    else:
        path = ":".join(_ansi(c.name, ansi) for c in chain) + ":"
        tail = "".join(" " + _ansi(fields(c.fields), ansi, "2") for c in chain if c.fields)
    busy = node.end - node.start - node.idle
    ts = ""
    if stamped:
        dt = datetime.fromtimestamp(node.end // 10**9, UTC)
        ts = _ansi(dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{node.end % 10**9 // 1000:06d}Z",
                   ansi, "2") + " "
    return (f"{ts}{_ansi(' INFO', ansi, '32')} {path} close time.busy={timing_display(busy)} "
            f"time.idle={timing_display(node.idle)}{tail}")


def _same_shape(got: Rebuilt, want: Node, stamped: bool) -> None:
    assert got.name == want.name
    assert dict(got.fields) == dict(want.fields), got.name
    length = want.end - want.start
    tol = length // 200 + (2_000 if stamped else 2)
    assert abs(got.end_ns - (want.end // 1000 * 1000 if stamped else want.end)) <= tol
    assert abs(got.start_ns - want.start) <= tol
    assert not got.unterminated and not got.ambiguous
    key = lambda n: n.start  # noqa: E731
    assert len(got.children) == len(want.children), got.name
    for g, w in zip(got.children, sorted(want.children, key=key), strict=True):
        _same_shape(g, w, stamped)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), fmt=st.sampled_from(["full", "compact"]), ansi=st.booleans(),
       stamped=st.booleans())
def test_generated_trees_come_back_whole(tree: Node, fmt: str, ansi: bool,
                                         stamped: bool) -> None:
    # Lines come in the order the spans closed, whatever thread each ran on.
    nodes = sorted(tree.walk(), key=lambda n: (n.end, -len(list(n.walk()))))
    if len({n.end for n in nodes}) < len(nodes):
        return  # two spans ending at once: their printed order is the program's choice
    a = SpanAssembler()
    out: list[Rebuilt] = []
    for n in nodes:
        line = parse_close_line(render(n, fmt, ansi, stamped))
        assert line is not None
        out += a.add(line, line.wall_ns if stamped and line.wall_ns else n.end,
                     stamped=stamped)
    out += a.finish(tree.end + 1)
    assert len(out) == 1 and a.stats.unterminated == 0
    _same_shape(out[0], tree, stamped)


# ── the real program ─────────────────────────────────────────────────────────────────


def _cargo() -> str | None:
    return shutil.which("cargo") or next(
        (p for p in (str(Path.home() / ".cargo" / "bin" / "cargo"),) if os.path.exists(p)),
        None)


@pytest.fixture(scope="session")
def rust_prover() -> Path:
    """tests/rust_prover built offline from Debian's crates, once (cargo skips a build
    that is up to date), into the ignored build/ folder."""
    cargo = _cargo()
    if cargo is None:
        pytest.skip("cargo is not installed (scripts/test installs Debian's cargo)")
    env = dict(os.environ, CARGO_TARGET_DIR=str(PROVER_BUILD))
    # cwd: .cargo/config.toml there points cargo at Debian's registry, offline.
    proc = subprocess.run([cargo, "build", "--quiet"], cwd=PROVER_SRC, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        "building tests/rust_prover failed (needs apt-get install "
        f"librust-tracing-subscriber-dev):\n{proc.stderr[-3000:]}")
    return PROVER_BUILD / "debug" / "rust_prover"


def _run(tmp_path: Path, *args: str, rerun: bool = False) -> tuple[subprocess.
                                                                   CompletedProcess[str],
                                                                   list[dict[str, Any]]]:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_", "TRACEPARENT"))}
    env["PYTHONPATH"] = str(REPO)
    rr = ["--rerun", f"file:{out / 'run.rrd'}"] if rerun else ["--rerun", "off"]
    proc = subprocess.run([sys.executable, "-m", "otel_proofscope", "run", "--out", str(out),
                           *rr, "--no-gpu", *args], env=env, capture_output=True,
                          text=True, timeout=120)
    spans: list[dict[str, Any]] = []
    traces = out / "traces.jsonl"
    for raw in traces.read_text().splitlines() if traces.exists() else []:
        for rs in json.loads(raw)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans += ss["spans"]
    return proc, spans


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span.get("attributes", []):
        (kind, value), = a["value"].items()
        out[a["key"]] = int(value) if kind == "intValue" else value
    return out


def _tree(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """The proof root with nested {name, attrs, start, end, children}."""
    nodes = {s["spanId"]: {"name": s["name"], "attrs": _attrs(s), "children": [],
                           "start": int(s["startTimeUnixNano"]),
                           "end": int(s["endTimeUnixNano"])} for s in spans}
    root = None
    for s in spans:
        parent = nodes.get(s.get("parentSpanId", ""))
        if parent is None:
            root = nodes[s["spanId"]]
        else:
            parent["children"].append(nodes[s["spanId"]])
    for n in nodes.values():
        n["children"].sort(key=lambda c: (c["start"], str(c["attrs"].get("shard"))))
    assert root is not None and root["name"] == SpanName.PROOF
    return root


def _check_sp1_shape(root: dict[str, Any], stamped: bool = True) -> None:
    (prove,) = root["children"]
    assert prove["name"] == "prove" and prove["attrs"]["mode"] == "Compressed"
    assert [c["name"] for c in prove["children"]] == ["execute_program", "core prove with pk",
                                                      "prove shrink"]
    execute, core, _shrink = prove["children"]
    assert execute["attrs"]["cycles"] == 1_048_576
    shards = core["children"]
    assert sorted(s["attrs"]["shard"] for s in shards) == [0, 1]
    for shard in shards:
        assert shard["name"] == "prove shard with data"
        assert "mode" not in shard["attrs"]  # the parent's field stays on the parent
        names = [c["name"] for c in shard["children"]]
        assert names == ["commit traces", "logup gkr proof", "zerocheck",
                         "prove evaluation claims"]
        zerocheck = shard["children"][2]
        assert [r["attrs"]["round"] for r in zerocheck["children"]] == [0, 1, 2]
        claims = shard["children"][3]
        # Entered 20 ms after it was created, busy 12 ms: both come back from the line.
        assert claims["attrs"]["idle_ns"] >= 19_000_000
        assert claims["attrs"]["busy_ns"] >= 11_500_000
        assert claims["end"] - claims["start"] >= 31_000_000
        assert shard["children"][0]["end"] - shard["children"][0]["start"] >= 14_500_000

    def inside(node: dict[str, Any], depth: int = 0) -> None:
        if depth:
            assert node["attrs"]["proofscope.timing"] == Timing.LOG_CLOSE
        for c in node["children"]:
            # Three significant digits: a child starts no earlier than ~0.5 % of its
            # parent's length before the parent and ends within it; without timestamps
            # each end is when its line was read, which jitters by the read.
            slack = (node["end"] - node["start"]) // 100 + (2_000 if stamped
                                                             else ARRIVAL_SLACK_NS)
            if depth:
                assert c["start"] >= node["start"] - slack, c["name"]
                assert c["end"] <= node["end"] + slack, c["name"]
            inside(c, depth + 1)
    inside(root)


def test_real_prover_compact_ansi_with_map(rust_prover: Path, tmp_path: Path) -> None:
    from otel_proofscope.rerun.readback import read

    proc, spans = _run(tmp_path, "--map", "rust-tracing", "--", str(rust_prover), rerun=True)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" in proc.stdout and "close" in proc.stdout  # passed on unchanged
    assert "rust-tracing: 20 spans from close lines, 1 tree" in proc.stderr
    _check_sp1_shape(_tree(spans))
    rec = read(tmp_path / "out" / "run.rrd")
    rounds = [k for k in rec.entities if k.endswith("zerocheck\\ round")
              and "/durations/" in k]
    assert rounds and len(rec.rows(rounds[0])) == 6  # three rounds on each of two shards
    (claims,) = [k for k in rec.entities if "/durations/" in k
                 and k.endswith("prove\\ evaluation\\ claims")]
    assert all(r.values["Scalars:scalars"][0] >= 31 for r in rec.rows(claims))  # ms


@pytest.mark.parametrize("mode", [["full"], ["full", "plain", "no-time"],
                                  ["compact", "plain", "no-time"], ["full", "plain"]])
def test_real_prover_detected_without_map(rust_prover: Path, tmp_path: Path,
                                          mode: list[str]) -> None:
    proc, spans = _run(tmp_path, "--", str(rust_prover), *mode)
    assert proc.returncode == 0, proc.stderr
    assert "rust-tracing: 20 spans from close lines" in proc.stderr
    _check_sp1_shape(_tree(spans), stamped="no-time" not in mode)


def test_composes_with_a_span_preset(rust_prover: Path, tmp_path: Path) -> None:
    proc, spans = _run(tmp_path, "--map", "rust-tracing", "--map", "sp1", "--",
                       str(rust_prover))
    assert proc.returncode == 0, proc.stderr
    assert "rust-tracing: 20 spans" in proc.stderr
    # The span rules saw every span (what they rename is the sp1 preset's business).
    assert "mapped with sp1: " in proc.stderr and " of 21 spans" in proc.stderr
    root = next(s for s in spans if not s.get("parentSpanId"))
    assert _attrs(root)["proof.system"] == "sp1"
    assert len(spans) == 21


def test_no_map_leaves_the_output_alone(rust_prover: Path, tmp_path: Path) -> None:
    proc, spans = _run(tmp_path, "--no-map", "--", str(rust_prover))
    assert proc.returncode == 0 and "rust-tracing" not in proc.stderr
    assert [s["name"] for s in spans] == [SpanName.PROOF]


def test_quiet_when_a_prover_prints_no_close_lines(tmp_path: Path) -> None:
    proc, _spans = _run(tmp_path, "--", sys.executable, "-c", "print('hello')")
    assert proc.returncode == 0 and proc.stdout == "hello\n"
    assert "rust-tracing" not in proc.stderr and "mapping" not in proc.stderr


def test_missing_prover_says_cannot_start_not_exited(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, "--", str(tmp_path / "no-such-prover"))
    assert proc.returncode == 127
    first = proc.stderr.splitlines()[0]
    assert "cannot start" in first and "exit code 127" in first
    assert "exited with code" not in proc.stderr


# ── tracing-forest trees ─────────────────────────────────────────────────────────────
# The reference is a real capture: tests/plonky3_prover (Plonky3 0.8.0's Keccak prover)
# with RUST_LOG=debug, printed by tracing-forest 0.3.1's ForestLayer, ANSI as printed.
# tests/test_plonky3.py runs the program itself and compares with its OTLP export.
FOREST = (REPO / "tests" / "fixtures" / "plonky3_forest_debug.txt").read_text().splitlines()
# Events: Plonky3 prints none, so these two lines follow the printer's event format
# (tracing-forest src/printer/pretty.rs: `icon [tag]: message | key: value`).
FOREST_EVENTS = [
    "INFO     prove [ 1.20s | 2.10% / 100.00% ] mode: Compressed",
    "DEBUG    ┕━ ｉ [debug]: committed | rows: 1024",
]


def test_forest_lines() -> None:
    root = parse_forest_line(FOREST[0])
    assert root is not None and (root.name, root.depth) == ("plonky3-prover", 0)
    assert dict(root.fields) == {"log_rows": "10", "hashes": "42"}
    assert root.duration_ns == 419_000_000
    nodes = [parse_forest_line(t) for t in FOREST]
    unread = [t for t, n in zip(FOREST, nodes, strict=True) if n is None]
    assert not unread, unread
    merkle = next(n for n in nodes if n is not None and n.name == "build merkle tree")
    assert (merkle.level, merkle.depth, dict(merkle.fields)) == (
        "DEBUG", 4, {"dimensions": '"[2633x2048]"'})
    tiny = next(n for n in nodes if n is not None and n.name == "reserve_exact")
    assert tiny.duration_ns == 221
    event = parse_forest_line(FOREST_EVENTS[1])
    assert event is not None and event.event and event.depth == 1
    assert (event.name, event.fields) == ("committed", (("tag", "debug"), ("rows", "1024")))
    for other in (COMPACT_ANSI, " INFO prove: proof done", "INFO: [ 1s | 1% ]",
                  "INFO     │  continued message"):
        assert parse_forest_line(other) is None


def test_forest_tree_and_packed_layout() -> None:
    a = ForestAssembler()
    out = []
    for text in FOREST:
        out += a.add(parse_forest_line(text), 10**12)
    out += a.add(None, 0)  # the next line is not part of the tree
    ((root, arrival),) = out
    assert [c.name for c in root.children] == ["generate Keccak trace", "prove", "verify"]
    assert sum(1 for _ in root.walk()) == len(FOREST)
    prove = root.children[1]
    (stark,) = prove.children
    assert [c.name for c in stark.children] == [
        "get_log_num_quotient_chunks", "commit to trace data", "quotient_values",
        "commit to quotient poly chunks", "open"]
    layout = forest_layout(root, arrival)
    assert layout[id(root)] == (10**12 - 419_000_000, 10**12)
    first, second = root.children[:2]
    # Placed one after the other from the parent's start; lengths as printed.
    assert layout[id(first)] == (layout[id(root)][0], layout[id(root)][0] + first.duration_ns)
    assert layout[id(second)][0] == layout[id(first)][1]


@settings(max_examples=100, deadline=None)
@given(tree=trees(), ansi=st.booleans())
def test_generated_forest_trees_come_back_whole(tree: Node, ansi: bool) -> None:
    lines: list[str] = []

    def render_forest(node: Node, indent: list[str]) -> None:
        busy = node.end - node.start - node.idle
        fields = "".join(f"{' |' if i else ''} {k}: {v}" for i, (k, v) in
                         enumerate(node.fields))
        level = _ansi("INFO    ", ansi, "1;32")
        lines.append(f"{level} {''.join(indent)}{node.name} [ {timing_display(busy)} | "
                     f"50.00% ]{fields}")
        if node.children:
            if indent:
                indent[-1] = {"┕━ ": "   ", "┝━ ": "│  "}.get(indent[-1], indent[-1])
            for i, child in enumerate(node.children):
                render_forest(child, [*indent, "┕━ " if i == len(node.children) - 1
                                      else "┝━ "])

    render_forest(tree, [])
    a = ForestAssembler()
    out = []
    for text in lines:
        node = parse_forest_line(text)
        assert node is not None, text
        out += a.add(node, 0)
    out += a.finish()
    assert len(out) == 1 and a.malformed == 0

    def same(got: Any, want: Node) -> None:
        assert got.name == want.name
        assert [k for k, _ in got.fields] == [k for k, _ in want.fields]
        busy = want.end - want.start - want.idle
        assert abs(got.duration_ns - busy) <= busy // 200 + 1
        assert len(got.children) == len(want.children)
        for g, w in zip(got.children, want.children, strict=True):
            same(g, w)
    same(out[0][0], tree)


def test_forest_tree_under_proofscope_run(tmp_path: Path) -> None:
    script = "import sys\nsys.stdout.write(sys.argv[1])\n"
    proc, spans = _run(tmp_path, "--", sys.executable, "-c", script,
                       "\n".join(FOREST + FOREST_EVENTS) + "\nproof written\n")
    assert proc.returncode == 0, proc.stderr
    assert f"rust-tracing: {len(FOREST) + 1} spans from 2 tracing-forest trees\n" in proc.stderr
    root = _tree(spans)
    prover, prove = sorted(root["children"], key=lambda c: c["name"] != "plonky3-prover")
    assert (prover["name"], prove["name"]) == ("plonky3-prover", "prove")
    assert prover["attrs"]["proofscope.timing"] == Timing.LOG_TREE
    assert prover["attrs"]["busy_ns"] == 419_000_000
    assert (prover["attrs"]["log_rows"], prover["attrs"]["hashes"]) == (10, 42)
    assert prover["attrs"]["proofscope.rust.packed"] is True
    assert [c["name"] for c in prover["children"]] == [
        "generate Keccak trace", "prove", "verify"]
    (with_events,) = [s for s in spans if s.get("events")]
    assert with_events["name"] == "prove"
    assert [e["name"] for e in with_events["events"]] == ["committed"]


# ── --map names ──────────────────────────────────────────────────────────────────────


def _maps(*maps: str, no_map: bool = False, command: str = "./prove") -> Any:
    import argparse

    from otel_proofscope.cli.run_cmd import _maps as maps_of

    return maps_of(argparse.Namespace(map=list(maps) or None, no_map=no_map),
                   command.split())


def test_map_names_compose() -> None:
    lines, spans, console = _maps("rust-tracing,sp1")
    assert (lines, spans.label, console) == (None, "sp1", "on")
    lines, spans, console = _maps("snarkjs", "rust-tracing")
    assert lines.label == "snarkjs" and spans is None and console == "on"
    lines, spans, console = _maps("sp1")  # the console reader still looks, quietly
    assert lines is None and spans.label == "sp1" and console == "auto"
    assert _maps() == (None, None, "auto")
    assert _maps(no_map=True) == (None, None, "off")
    lines, _spans, console = _maps(command="npx snarkjs groth16 prove c.zkey w.wtns p.json "
                                           "pub.json")
    assert lines.label == "snarkjs" and console == "auto"


def test_map_names_that_cannot_be_used(tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text('[meta]\nname = "empty"\n')
    with pytest.raises(ValueError, match="no \\[\\[line\\]\\], \\[\\[span\\]\\]"):
        _maps(str(empty))
    with pytest.raises(FileNotFoundError):
        _maps("rust-tracing,no-such-preset")
