"""A fast printer under ``proofscope run`` with and without ``--map``: the child's own time.

The child (Python) prints N short lines as fast as its stdout lets it, plus a line that a
rule matches every 11th line, and writes its own runtime (perf_counter around the loop)
to a file. ``proofscope run --rerun off`` runs it with no map and with a three-rule map,
alternately, ``--runs`` times each; printed: median (range) of the child's runtime and
of our wall time, and the lines the matcher could not keep up with (counted as dropped).

    python benchmarks/bench_run_map.py [--lines 200000] [--runs 5]

Run from a checkout (``PYTHONPATH`` = the checkout) to measure that checkout's code.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PRINTER = textwrap.dedent("""
    import os, sys, time
    t = time.perf_counter()
    w = sys.stdout.write
    for i in range(int(sys.argv[1])):
        w(f"step {i} ok\\n")
        if i % 11 == 0:
            w("snarkJS: ··· Computing A fft\\n" if i % 22 == 0 else "[INFO]  snarkJS: > ROUND 1\\n")
    sys.stdout.flush()
    open(os.environ["CHILD_T"], "w").write(f"{time.perf_counter() - t:.4f}")
""")

RULES = textwrap.dedent("""
    [meta]
    name = "bench"
    [[line]]
    name = "fft"
    start = 'snarkJS: ··· Computing (?P<poly>\\w+) (?P<inv>i?)fft$'
    until_next = true
    end = 'snarkJS: (> |··· |Multiexp start)'
    key = ["poly", "inv"]
    [[line]]
    name = "round"
    event = 'ROUND (?P<n>\\d+)'
    capture = { n = "round" }
""")


def one(tmp: Path, lines: int, rules: Path | None) -> tuple[float, float, int]:
    stamp = tmp / "child_t"
    env = {**os.environ, "CHILD_T": str(stamp), "XDG_RUNTIME_DIR": str(tmp)}
    env = {k: v for k, v in env.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    cmd = [sys.executable, "-m", "otel_proofscope", "run", "--rerun", "off", "--no-gpu",
           "--out", str(tmp / "out"), *(["--map", str(rules)] if rules else []), "--",
           sys.executable, str(tmp / "printer.py"), str(lines)]
    t = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=True)
    wall = time.monotonic() - t
    m = re.search(r"(\d+) not matched", proc.stderr)
    return float(stamp.read_text()), wall, int(m.group(1)) if m else 0


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "printer.py").write_text(PRINTER)
        rules = tmp / "rules.toml"
        rules.write_text(RULES)
        plain: list[tuple[float, float, int]] = []
        mapped: list[tuple[float, float, int]] = []
        for _ in range(args.runs):
            plain.append(one(tmp, args.lines, None))
            mapped.append(one(tmp, args.lines, rules))
    for name, rows in (("run", plain), ("run --map", mapped)):
        print(f"{name:10s} child {_fmt([r[0] for r in rows])} s, wall "
              f"{_fmt([r[1] for r in rows])} s, lines not matched (matcher behind) "
              f"{statistics.median([r[2] for r in rows]):.0f}")


if __name__ == "__main__":
    main()
