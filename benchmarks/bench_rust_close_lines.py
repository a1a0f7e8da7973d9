"""CPU cost of reading a Rust prover's tracing close lines (mapping/rust_tracing.py).

Runs the stand-in prover of tests/rust_prover (built by ``tests/test_rust_tracing.py``
into ``build/rust_prover``) once per format with 8 shards, then parses and assembles its
output 5 times per format, interleaved, and prints the CPU time per close line: median
and range of the 5 runs. Only the pure parser and assembler, not span export.

Run: ``python benchmarks/bench_rust_close_lines.py`` (after the test built the prover).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from otel_proofscope.mapping.rust_tracing import SpanAssembler, parse_close_line

PROVER = Path(__file__).resolve().parent.parent / "build" / "rust_prover" / "debug" / \
    "rust_prover"
FORMATS = {"compact, ANSI (SP1's default)": [], "full, plain": ["full", "plain"]}


def per_line_us(lines: list[str]) -> float:
    t = time.process_time()
    assembler = SpanAssembler()
    for text in lines:
        line = parse_close_line(text)
        if line is not None:
            assembler.add(line, line.wall_ns or 0, stamped=True)
    assembler.finish(0)
    return (time.process_time() - t) / len(lines) * 1e6


def main() -> int:
    if not PROVER.exists():
        print(f"{PROVER} not built: run pytest tests/test_rust_tracing.py first")
        return 1
    outputs = {name: subprocess.run([str(PROVER), *args, "shards", "8"], capture_output=True,
                                    text=True, check=True).stdout.splitlines()
               for name, args in FORMATS.items()}
    runs: dict[str, list[float]] = {name: [] for name in FORMATS}
    for _ in range(5):
        for name, lines in outputs.items():
            runs[name].append(per_line_us(lines * 20))
    for name, values in runs.items():
        print(f"{name}: {statistics.median(values):.1f} us CPU per line "
              f"(range {min(values):.1f}-{max(values):.1f}, {len(outputs[name]) * 20} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
