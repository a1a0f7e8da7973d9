"""Every sumcheck round is checkable from ``traces.jsonl`` alone: g(0)+g(1) = claim and
g(r) = next claim, with r the round's Fiat–Shamir challenge (``proof.sumcheck.challenge``).

The field arithmetic here is a second, independent QM31 written for this test (plain
integers, Lagrange interpolation over t = 0..d); it imports nothing from the prover, so
a bug shared by the prover and its own verifier cannot hide. The checks run on the
files `proofscope demo` writes and on what `proofscope replay` makes of a proof stream
that carries challenges.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# ── an independent QM31: (a + b·i) + (c + d·i)·u, i² = −1, u² = 2 + i, over 2^31 − 1 ──

P = (1 << 31) - 1
Q = tuple[int, int, int, int]


def qadd(x: Q, y: Q) -> Q:
    return ((x[0] + y[0]) % P, (x[1] + y[1]) % P, (x[2] + y[2]) % P, (x[3] + y[3]) % P)


def qsub(x: Q, y: Q) -> Q:
    return ((x[0] - y[0]) % P, (x[1] - y[1]) % P, (x[2] - y[2]) % P, (x[3] - y[3]) % P)


def _cmul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return ((a[0] * b[0] - a[1] * b[1]) % P, (a[0] * b[1] + a[1] * b[0]) % P)


def qmul(x: Q, y: Q) -> Q:
    x0, x1, y0, y1 = (x[0], x[1]), (x[2], x[3]), (y[0], y[1]), (y[2], y[3])
    lo = _cmul(x0, y0)
    mid = _cmul(x0, y1)
    mid2 = _cmul(x1, y0)
    hi = _cmul(_cmul(x1, y1), (2, 1))  # u² = 2 + i
    return ((lo[0] + hi[0]) % P, (lo[1] + hi[1]) % P, (mid[0] + mid2[0]) % P,
            (mid[1] + mid2[1]) % P)


def qscale(x: Q, k: int) -> Q:
    return (x[0] * k % P, x[1] * k % P, x[2] * k % P, x[3] * k % P)


def interpolate(evals: list[Q], r: Q) -> Q:
    """g(r) for the degree-d polynomial with g(t) = evals[t], t = 0..d."""
    out: Q = (0, 0, 0, 0)
    for i, gi in enumerate(evals):
        term, denom = gi, 1
        for j in range(len(evals)):
            if j != i:
                term = qmul(term, qsub(r, (j, 0, 0, 0)))
                denom = denom * (i - j) % P
        out = qadd(out, qscale(term, pow(denom, P - 2, P)))
    return out


def parse(text: str) -> Q:
    limbs = tuple(int(v) for v in text.strip("()").split(","))
    assert len(limbs) == 4 and all(0 <= v < P for v in limbs), text
    return limbs  # type: ignore[return-value]


def test_the_independent_field_is_a_field() -> None:
    rng = random.Random(5)
    x = tuple(rng.randrange(P) for _ in range(4))
    # x^(p^4 − 1) = 1 for a non-zero x holds only if u² − (2 + i) is irreducible and
    # the multiplication above is that field's.
    acc, base, e = (1, 0, 0, 0), x, P**4 - 1
    while e:
        if e & 1:
            acc = qmul(acc, base)  # type: ignore[arg-type]
        base = qmul(base, base)  # type: ignore[arg-type]
        e >>= 1
    assert acc == (1, 0, 0, 0)
    # A degree-2 polynomial through three points evaluates back at those points.
    g = [(3, 0, 0, 0), (5, 1, 0, 0), (9, 0, 7, 0)]
    for t in range(3):
        assert interpolate(g, (t, 0, 0, 0)) == g[t]


# ── reading traces.jsonl ─────────────────────────────────────────────────────────────


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "intValue" in v:
        return int(v["intValue"])
    return next(v[k] for k in ("stringValue", "boolValue", "doubleValue") if k in v)


def layer_spans(path: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    if s["name"] != "proof.layer":
                        continue
                    attrs = {a["key"]: _value(a["value"]) for a in s.get("attributes", [])}
                    rounds = [{a["key"]: _value(a["value"]) for a in e.get("attributes", [])}
                              for e in s.get("events", []) if e["name"] == "proof.sumcheck.round"]
                    out.append((attrs, sorted(rounds, key=lambda e: e["proof.sumcheck.round"])))
    return out


def check_layer(attrs: dict[str, Any], rounds: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """Both round checks for one layer; returns (rounds checked with r, failures)."""
    failures: list[str] = []
    claim = parse(attrs["proof.claim.initial"])
    with_r = 0
    for ev in rounds:
        n = ev["proof.sumcheck.round"]
        g = [parse(s) for s in ev["proof.sumcheck.poly"]]
        if qadd(g[0], g[1]) != claim:
            failures.append(f"round {n}: g(0) + g(1) != claim")
        if "proof.sumcheck.challenge" not in ev:
            failures.append(f"round {n}: no challenge")
            continue
        nxt = interpolate(g, parse(ev["proof.sumcheck.challenge"]))
        with_r += 1
        if "proof.claim" in ev and parse(ev["proof.claim"]) != nxt:
            failures.append(f"round {n}: g(r) != claim")
        claim = nxt
    return with_r, failures


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    runtime = Path(env.get("TMPDIR", "/tmp")) / f"proofscope-xdg-{os.getuid()}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    return env


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_proofscope", *args], input=stdin,
                          capture_output=True, text=True, timeout=180, env=_env())


@pytest.mark.parametrize("shape", [("8", "32"), ("3", "8")], ids=["default", "small"])
def test_demo_rounds_recomputed_with_challenges(tmp_path: Path,
                                                shape: tuple[str, str]) -> None:
    layers, width = shape
    proc = _cli("demo", "--out", str(tmp_path), "--layers", layers, "--width", width,
                "--rerun", "off")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = layer_spans(tmp_path / "traces.jsonl")
    assert len(spans) == int(layers)
    total = 0
    for attrs, rounds in spans:
        assert len(rounds) == attrs["proof.sumcheck.rounds"]
        checked, failures = check_layer(attrs, rounds)
        assert failures == [], (attrs["proof.layer.index"], failures)
        total += checked
    assert total > 0
    # Not vacuous: a challenge moved by one breaks the next round's g(0) + g(1).
    attrs, rounds = next((a, r) for a, r in spans if len(r) > 1)
    a, b, c, d = parse(rounds[0]["proof.sumcheck.challenge"])
    rounds[0]["proof.sumcheck.challenge"] = f"({(a + 1) % P},{b},{c},{d})"
    _, failures = check_layer(attrs, rounds)
    assert failures[0] == "round 0: g(r) != claim"


# ── the proof-stream bridge carries a challenge when the stream has one ─────────────


def _mirror(x: Q) -> dict[str, int]:
    return dict(zip("abcd", x, strict=True))


def _coeffs_to_evals(c: list[Q]) -> list[Q]:
    out = []
    for t in range(len(c)):
        acc: Q = (0, 0, 0, 0)
        for k, ck in enumerate(c):
            acc = qadd(acc, qscale(ck, t**k))
        out.append(acc)
    return out


def consistent_stream(rounds: int, seed: int) -> tuple[list[str], list[Q]]:
    """A one-layer stream whose rounds chain: p_{k+1}(0) + p_{k+1}(1) = p_k(r_k)."""
    rng = random.Random(seed)

    def rand() -> Q:
        return (rng.randrange(P), rng.randrange(P), rng.randrange(P), rng.randrange(P))

    claim = rand()
    lines = [json.dumps({"ProofStart": {"model_name": "chain", "backend": "cpu",
                                        "num_layers": 1, "input_shape": [1, 2],
                                        "output_shape": [1, 2]}}),
             json.dumps({"LayerStart": {"layer_idx": 0, "kind": "MatMul",
                                        "input_shape": [1, 2], "output_shape": [1, 2],
                                        "trace_cost": 4, "claim_value_approx": None,
                                        "gpu_device": None}})]
    challenges = []
    for k in range(rounds):
        c0, c2 = rand(), rand()
        # p(0) + p(1) = 2·c0 + c1 + c2 = claim
        c1 = qsub(qsub(claim, qscale(c0, 2)), c2)
        r = rand()
        challenges.append(r)
        lines.append(json.dumps({"SumcheckRound": {
            "layer_idx": 0, "round": k, "total_rounds": rounds,
            "poly_deg2": {"c0": _mirror(c0), "c1": _mirror(c1), "c2": _mirror(c2)},
            "poly_deg3": None, "claim_value_approx": None, "challenge": _mirror(r)}}))
        claim = interpolate(_coeffs_to_evals([c0, c1, c2]), r)
    lines.append(json.dumps({"LayerEnd": {"layer_idx": 0, "kind": "Sumcheck",
                                          "final_claim_value_approx": None,
                                          "duration_ms": 1, "rounds_completed": rounds}}))
    lines.append(json.dumps({"ProofComplete": {"duration_ms": 2, "num_layer_proofs": 1,
                                               "num_weight_openings": 0,
                                               "weight_binding_mode": "none"}}))
    return lines, challenges


def test_replay_records_the_stream_challenges(tmp_path: Path) -> None:
    lines, challenges = consistent_stream(rounds=5, seed=3)
    src = tmp_path / "stream.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = _cli("replay", str(src), "--out", str(tmp_path / "out"), "--rerun", "off")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unknown field" not in proc.stderr.lower(), proc.stderr
    [(attrs, rounds)] = layer_spans(tmp_path / "out" / "traces.jsonl")
    assert [parse(e["proof.sumcheck.challenge"]) for e in rounds] == challenges
    checked, failures = check_layer(attrs, rounds)
    assert (checked, failures) == (5, [])
