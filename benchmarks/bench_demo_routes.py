"""`proofscope demo` end to end under two checkouts, interleaved (issue 29's start-up budget).

Run: python benchmarks/bench_demo_routes.py --old /path/to/old-checkout [--new .] [--runs 5]
                                            [--layers 8] [--width 32]

Each run is a fresh ``python -m otel_proofscope demo --out TMP`` (the default: JSON-lines
files and a Rerun ``.rrd``) with ``PYTHONPATH`` set to the checkout, timed from the
start of the process to its exit; the two checkouts alternate, the order flipped every
round. Prints each run, then the median and range per checkout and the difference of
the medians. Issue 29's budget: the export process (this checkout) at most +0.3 s
against the thread route (e.g. ``git archive af4130b | tar -x -C /tmp/old``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(checkout: Path, layers: int, width: int) -> tuple[float, bool]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROOFSCOPE_RERUN_PROCESS", "PROOFSCOPE_EXPORT_PROCESS")}
    env["PYTHONPATH"] = str(checkout)
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "otel_proofscope", "demo", "--out", d,
                              "--layers", str(layers), "--width", str(width)],
                             env=env, cwd=d, capture_output=True, text=True)
        took = time.perf_counter() - start
        rrd = Path(d) / "proofscope.rrd"
        ok = (res.returncode == 0 and rrd.exists() and rrd.stat().st_size > 0
              and "dropped: nothing" in res.stdout)
    return took, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=32)
    args = parser.parse_args(argv)
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    times: dict[str, list[float]] = {name: [] for name in checkouts}
    for i in range(args.runs):
        for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
            took, ok = one(checkouts[name], args.layers, args.width)
            times[name].append(took)
            print(f"run {i + 1} {name}: {took:.3f} s{'' if ok else ' (FAILED or lost items)'}",
                  flush=True)
    for name, ts in times.items():
        print(f"{name} ({checkouts[name]}): median {statistics.median(ts):.2f} s "
              f"({min(ts):.2f}–{max(ts):.2f}), n={len(ts)}")
    delta = statistics.median(times["new"]) - statistics.median(times["old"])
    print(f"new - old (medians): {delta:+.2f} s; budget +0.30 s: "
          f"{'met' if delta <= 0.3 else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
