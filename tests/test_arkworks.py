"""arkworks' ``print-trace`` timers as a span tree, read from the console.

The parser (``mapping/ark_timers.py``) is checked on timer trees rendered exactly as
ark-std 0.5.0's ``perf_trace.rs`` prints them (property test, with and without colour),
and on the real program: ``proofscope run --map arkworks`` over tests/arkworks_prover
(ark-groth16 0.5.0 from crates.io, a real Groth16 setup, proof and verification).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from peers import peer

from otel_proofscope.mapping.ark_timers import (
    TimerAssembler,
    TimerLineError,
    TimerNode,
    parse_timer_line,
)

# ── ark-std's format (src/perf_trace.rs, 0.5.0), rendered ─────────────────────────────


def _time(ns: int) -> str:
    secs, rest = divmod(ns, 1_000_000_000)
    millis, micros, nanos = rest // 1_000_000, rest // 1000 % 1000, rest % 1000
    if secs:
        return f"{secs}.{millis:03}s"
    if millis:
        return f"{millis}.{micros:03}ms"
    if micros:
        return f"{micros}.{nanos:03}µs"
    return f"{rest}ns"


def _printed(ns: int) -> int:
    """What the printed time says, in ns (the format drops digits)."""
    secs, rest = divmod(ns, 1_000_000_000)
    if secs:
        return secs * 1_000_000_000 + rest // 1_000_000 * 1_000_000
    if rest >= 1_000_000:
        return rest // 1000 * 1000
    return rest


def _precision(ns: int) -> int:
    """The last printed digit's worth: ms for seconds, µs for ms, ns below."""
    return 1_000_000 if ns >= 1_000_000_000 else 1000 if ns >= 1_000_000 else 1


def _render(label: str, depth: int, children: list[tuple[str, int, list]], ns: int,  # type: ignore[type-arg]
            colour: bool) -> list[str]:
    start = "\x1b[1;33mStart:  \x1b[0m" if colour else "Start:  "
    end = "\x1b[1;32mEnd:    \x1b[0m" if colour else "End:    "
    out = ["··" * depth + f"{start} {label}"]
    for c_label, c_ns, c_children in children:
        out += _render(c_label, depth + 1, c_children, c_ns, colour)
    indent = 2 * (depth + 1)
    message = f"{label} ".ljust(75 - indent, ".")
    stamp = f"\x1b[1m{_time(ns)}\x1b[0m" if colour else _time(ns)
    out.append("··" * (depth + 1) + f"{end} {message}{stamp}")
    return out


_LABEL = st.text(st.characters(codec="utf-8", categories=("L", "N", "Zs"),
                               include_characters=":()_-"), min_size=1, max_size=40) \
    .map(str.strip).filter(bool)
_TREE = st.recursive(
    st.tuples(_LABEL, st.integers(0, 200_000_000_000), st.just([])),
    lambda kids: st.tuples(_LABEL, st.integers(0, 200_000_000_000),
                           st.lists(kids, max_size=4)),
    max_leaves=12)


def _shape(node: TimerNode) -> tuple:  # type: ignore[type-arg]
    return (node.label, node.end_ns - node.start_ns,
            [_shape(c) for c in node.children])


def _expected(tree: tuple) -> tuple:  # type: ignore[type-arg]
    label, ns, children = tree
    return (label, _printed(ns), [_expected(c) for c in children])


@settings(max_examples=200, deadline=None)
@given(tree=_TREE, colour=st.booleans())
def test_a_rendered_tree_reads_back(tree: tuple, colour: bool) -> None:  # type: ignore[type-arg]
    asm = TimerAssembler()
    done: list[TimerNode] = []
    label, ns, children = tree
    for i, line in enumerate(_render(label, 0, children, ns, colour)):
        parsed = parse_timer_line(line)
        assert parsed is not None, line
        done += asm.add(parsed, 10**18 + i)
    assert asm.malformed == 0
    assert [_shape(n)[0] for n in done] == [label]
    # Durations as printed; the children sit inside their parent's span only as far as
    # the printed times allow, which the tree's own sums do not promise.
    assert _shape(done[0]) == _expected(tree)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="·StarEnd: .0123456789µmsn\x1bx[;", max_size=60),
                max_size=30))
def test_hostile_lines_are_refused_or_counted(lines: list[str]) -> None:
    """Garbage never raises anything but the declared error, and never leaves the
    assembler inconsistent: every line is read, skipped or counted."""
    asm = TimerAssembler()
    for i, line in enumerate(lines):
        try:
            parsed = parse_timer_line(line)
        except TimerLineError:
            continue
        if parsed is not None:
            asm.add(parsed, i)
    for root in asm.finish(len(lines)):
        for node in root.walk():
            assert node.end_ns >= node.start_ns


def test_interleaved_threads_are_counted_not_guessed() -> None:
    asm = TimerAssembler()
    lines = ["Start:   a", "··Start:   b", "Start:   c",  # c: depth 0 while a is open
             "····End:     b .........1.000ms", "··End:     a .........2.000ms"]
    out: list[TimerNode] = []
    for i, text in enumerate(lines):
        parsed = parse_timer_line(text)
        assert parsed is not None
        out += asm.add(parsed, i * 1_000_000_000)
    assert asm.malformed == 1
    assert [_shape(n) for n in out] == [("a", 2_000_000, [("b", 1_000_000, [])])]


def test_bad_times_and_depths_are_declared_errors() -> None:
    for text in ("·Start:   odd", "End:     no depth ....1.000ms", "··End:     x ....1.5ks"):
        with pytest.raises(TimerLineError):
            parse_timer_line(text)
    assert parse_timer_line("Started: not a timer") is None


# ── the real prover ───────────────────────────────────────────────────────────────────

#: ark-groth16 0.5.0's timers, src/generator.rs and src/prover.rs, as the prover nests them.
PROVER_TREE = ("Groth16::Prover", ["Constraint synthesis", "Inlining LCs",
                                   "R1CS to QAP witness map", "Compute C", "Compute A",
                                   "Compute B in G1", "Compute B in G2", "Finish C"])
LAYERS = [("R1CS to QAP witness map", "FFT"), ("Compute C", "MSM"), ("Compute A", "MSM"),
          ("Compute B in G1", "MSM"), ("Compute B in G2", "MSM")]


def _spans(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values()))
                             for a in s.get("attributes", [])}
                    out.append({"name": s["name"], "id": s["spanId"],
                                "parent": s.get("parentSpanId", ""), "attrs": attrs,
                                "ns": int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])})
    return out


@pytest.mark.parametrize("colour", [False, True], ids=["piped", "CLICOLOR_FORCE"])
def test_run_map_arkworks_reads_a_real_groth16_proof(tmp_path: Path, colour: bool) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    if colour:
        env["CLICOLOR_FORCE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "otel_proofscope", "run", "--map", "arkworks", "--rerun", "off",
         "--out", str(tmp_path / "out"), "--", str(peer("arkworks-prover")),
         "--constraints", "4096"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "proof did not verify" not in proc.stderr
    printed = [ln for ln in proc.stdout.splitlines() if "Start:" in ln or "End:" in ln]
    timers = len(printed) // 2
    assert f"rust-tracing: {timers} spans from 1 ark-std timer tree" in proc.stderr, proc.stderr
    assert "mapped with arkworks: 6 of" in proc.stderr, proc.stderr
    spans = _spans(tmp_path / "out" / "traces.jsonl")
    by_id = {s["id"]: s for s in spans}
    (root,) = [s for s in spans if not s["parent"]]
    assert root["name"] == "proof" and root["attrs"]["proof.system"] == "groth16"

    def source(s: dict[str, object]) -> str:
        attrs = s["attrs"]
        assert isinstance(attrs, dict)
        return str(attrs.get("proofscope.mapping.source_name", s["name"]))

    (prover,) = [s for s in spans if source(s) == PROVER_TREE[0]]
    children = sorted((s for s in spans if s["parent"] == prover["id"]),
                      key=lambda s: int(str(s["attrs"].get("proof.layer.index", -1))))
    assert sorted(source(c) for c in children) == sorted(PROVER_TREE[1])
    layers = sorted((s for s in spans if s["name"] == "proof.layer"),
                    key=lambda s: int(str(s["attrs"]["proof.layer.index"])))
    assert [(source(s), s["attrs"]["proof.layer.kind"]) for s in layers] == LAYERS
    assert [int(str(s["attrs"]["proof.layer.index"])) for s in layers] == list(range(len(LAYERS)))
    (setup,) = [s for s in spans if s["name"] == "proof.circuit.compile"]
    assert source(setup) == "Groth16::Generator"
    # Every timer is under the run's proof, and a parent spans at least its children.
    for s in spans:
        p = s
        while p["parent"]:
            p = by_id[str(p["parent"])]
        assert p is root
        kids = [int(str(c["ns"])) for c in spans if c["parent"] == s["id"]]
        # Each printed time is truncated to its format's last digit.
        slack = sum(_precision(n) for n in [int(str(s["ns"])), *kids])
        assert int(str(s["ns"])) + slack >= sum(kids), (s["name"], s["ns"], kids)
