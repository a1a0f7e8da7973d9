"""How often does ``proofscope diff`` call a run slower that is not? And a heavier one?

Runs ``proofscope demo`` in pairs on the machine at hand and diffs each pair:

* ``same``: the same configuration twice (seeds 0 and 1: other weights, same work),
  one run after the other, as a CI job would. Every "slower" here is a false positive.
  Each pair is judged three ways: the default, ``--absolute`` (raw changes) and a naive
  rule (median beyond the threshold with p < 0.01, no interval), for comparison.
* ``heavy``: width 32 against width 256 (the candidate does far more work). A pair
  should be called slower, naming MatMul.

    python benchmarks/bench_diff.py --pairs 20 --proofs 10 [--blas-threads 1] [--chunks 3]

``--blas-threads 1`` runs the demos with ``OPENBLAS_NUM_THREADS=1``: the demo's MatMul
uses float64 BLAS products, and a multi-threaded BLAS on a loaded 2-CPU machine is
where most of its noise comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ENV = dict(os.environ)
CONCURRENT = False


def demo(out: Path, proofs: int, *args: str) -> None:
    if (out / "traces.jsonl").exists():  # --keep: recorded before, judge again
        return
    subprocess.run([sys.executable, "-m", "otel_proofscope", "demo", "--out", str(out),
                    "--repeat", str(proofs), "--rerun", "off", "--no-witness", *args],
                   check=True, capture_output=True, env=ENV)


def pair(root: Path, name: str, proofs: int, chunks: int, a_args: tuple[str, ...],
         b_args: tuple[str, ...]) -> tuple[Path, Path]:
    """Record base and candidate: one run each, or ``chunks`` runs each, alternating
    (base, candidate, base, …) and concatenated, as docs/diff.md recommends."""
    a, b = root / f"{name}a", root / f"{name}b"
    if chunks <= 1:
        demo(a, proofs, *a_args)
        demo(b, proofs, *b_args)
        return a, b
    per = max(1, proofs // chunks)
    for i in range(chunks):
        if CONCURRENT:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda job: demo(*job), [(root / f"{name}a{i}", per, *a_args),
                                                      (root / f"{name}b{i}", per, *b_args)]))
            continue
        demo(root / f"{name}a{i}", per, *a_args)
        demo(root / f"{name}b{i}", per, *b_args)
    for side, out in (("a", a), ("b", b)):
        out.mkdir(exist_ok=True)
        (out / "traces.jsonl").write_bytes(b"".join(
            (root / f"{name}{side}{i}" / "traces.jsonl").read_bytes() for i in range(chunks)))
    return a, b


def diff(a: Path, b: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "otel_proofscope", "diff", str(a), str(b),
                           "--format", "json", *args], capture_output=True, text=True)
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["exit_code"] == proc.returncode
    return doc


def naive_slower(doc: dict[str, Any], threshold: float = 10.0) -> list[str]:
    return [g["group"] for g in doc["groups"] if g["delta_pct"] is not None
            and g["delta_pct"] > threshold and g["p_value"] is not None
            and g["p_value"] < 0.01]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--proofs", type=int, default=10)
    ap.add_argument("--heavy-pairs", type=int, default=5)
    ap.add_argument("--blas-threads", type=int, default=None)
    ap.add_argument("--chunks", type=int, default=1,
                    help="record each side as this many runs, interleaved with the other")
    ap.add_argument("--concurrent", action="store_true",
                    help="with --chunks: run each base chunk and candidate chunk at once")
    ap.add_argument("--keep", type=Path, default=None,
                    help="record into (and reuse recordings from) this folder")
    args = ap.parse_args()
    global CONCURRENT
    CONCURRENT = args.concurrent
    if args.blas_threads is not None:
        ENV["OPENBLAS_NUM_THREADS"] = ENV["OMP_NUM_THREADS"] = str(args.blas_threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for i in range(args.pairs):
            a, b = pair(root, f"s{i}", args.proofs, args.chunks, ("--seed", "0"),
                        ("--seed", "1"))
            d, ab = diff(a, b), diff(a, b, "--absolute")
            # naive = the raw medians' change with the test alone (from --absolute's rows)
            rows.append(("same", d["drift"]["pct"], d["slower"], ab["slower"],
                         naive_slower(ab)))
        for i in range(args.heavy_pairs):
            a, b = pair(root, f"h{i}", args.proofs, args.chunks, (), ("--width", "256"))
            d = diff(a, b)
            rows.append(("heavy", d["drift"]["pct"], d["slower"], [], []))
    print("| kind | run-wide change | default: slower | --absolute: slower | naive: slower |")
    print("|---|---:|---|---|---|")
    for kind, drift, slower, absolute, naive in rows:
        print(f"| {kind} | {drift:+.0f} % | {len(slower)} {', '.join(slower[:3])} | "
              f"{len(absolute)} | {len(naive)} |")
    same = [r for r in rows if r[0] == "same"]
    heavy = [r for r in rows if r[0] == "heavy"]
    print(f"\nsame configuration, {len(same)} pairs called slower: "
          f"default {sum(bool(r[2]) for r in same)}, --absolute {sum(bool(r[3]) for r in same)}"
          f", naive {sum(bool(r[4]) for r in same)}")
    print(f"width 256 against 32, {len(heavy)} pairs called slower: "
          f"{sum(bool(r[2]) for r in heavy)}, naming MatMul (layer or rounds): "
          f"{sum(any('MatMul' in g for g in r[2]) for r in heavy)}")


if __name__ == "__main__":
    main()
