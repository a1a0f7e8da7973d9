"""Native memory the Rerun SDK keeps per entity path (issue 28 item 11, issue 29 decision 6).

Run: python benchmarks/bench_rerun_entities.py [--entities 20000] [--repeat 5]
       [--modes reused,pooled,distinct,shadowed] [--footer on,off]

Each run is a fresh process that opens a recording to a ``.rrd`` file and sends one
``Boxes2D`` row to each of N distinct entity paths (as the trace view does per trace,
and per redrawn lane generation), flushing every 512; once with a static clear of the
previous path after each (as a redraw "shadows" the old lane), once with one path
reused for all N rows (the control), once cycling through a pool of 1,024 paths (what a
bounded pool of lane entities would cost). It reports the process's RSS growth per entity
(psutil, after a flush and a collection), median and range of the runs. ``--footer``
runs each mode with the file's footer (``save(write_footer=True)``, the SDK's default: it
keeps an index entry of every chunk in memory until the file closes) and without it (as
``proofscope serve`` writes).

Why: ``serve`` grows ~2.5 KB per single-span trace without a plateau, and the export
process +284 MiB for 200,000 spans of one proof against a dead collector; Python-level
state in both is bounded. This measures the SDK's own share, per entity.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import gc, sys
    import numpy as np, psutil, rerun as rr
    n, mode, path, footer = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "on"
    proc = psutil.Process()
    rec = rr.RecordingStream("bench_entities")
    rec.save(path, write_footer=footer)
    rec.flush()
    base = proc.memory_info().rss
    for i in range(n):
        slot = 0 if mode == "reused" else i % 1024 if mode == "pooled" else i
        entity = f"/trace/flame/g{slot}/boxes"
        rec.send_columns(entity,
                         indexes=[rr.TimeColumn("proof_time", timestamp=np.array([i * 1e-6]))],
                         columns=rr.Boxes2D.columns(
                             centers=np.zeros((1, 2), dtype=np.float32),
                             half_sizes=np.ones((1, 2), dtype=np.float32)))
        if mode == "shadowed" and i:
            rec.log(f"/trace/flame/g{i - 1}/boxes", rr.Boxes2D.from_fields(clear_unset=True),
                    static=True)
        if i % 512 == 0:
            rec.flush()
    rec.flush()
    gc.collect()
    print(proc.memory_info().rss - base)
""")

MODES = ("reused", "pooled", "distinct", "shadowed")


def one(n: int, mode: str, footer: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", CHILD, str(n), mode,
                              str(Path(d) / "bench.rrd"), footer], capture_output=True,
                             text=True, timeout=900, check=True)
    return int(out.stdout.split()[-1]) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--footer", default="on", help="on, off or on,off")
    args = parser.parse_args(argv)
    cases = [(m, f) for m in args.modes.split(",") for f in args.footer.split(",")]
    got: dict[str, list[float]] = {f"{m}, footer {f}": [] for m, f in cases}
    for i in range(args.repeat):
        for mode, footer in (cases if i % 2 == 0 else cases[::-1]):
            key = f"{mode}, footer {footer}"
            got[key].append(one(args.entities, mode, footer))
            print(f"run {i + 1} {key}: {got[key][-1]:.0f} B/entity", flush=True)
    print(f"\n{args.entities:,} rows; RSS growth per row, median (range) of "
          f"{args.repeat} runs\n")
    print("| entity paths, footer | bytes per row |")
    print("|---|---|")
    for mode, values in got.items():
        print(f"| {mode} | {statistics.median(values):,.0f} "
              f"({min(values):,.0f}–{max(values):,.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
