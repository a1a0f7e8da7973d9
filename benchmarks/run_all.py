"""Run every benchmark, side by side on this machine, and print their tables.

    python benchmarks/run_all.py            # the full suite (a few minutes on 2 cores)
    python benchmarks/run_all.py --quick    # smaller workloads, for a smoke check

Figures quoted in benchmarks/README.md come from this command.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SUITE: list[tuple[str, list[str], list[str]]] = [
    # (title, full args, quick args)
    ("Instrumentation API: telemetry-off hook cost, round cost vs raw SDK",
     ["bench_api.py", "--no-check"], ["bench_api.py", "--no-check"]),
    ("Pipeline: prover-thread cost per span, OTLP delivery vs stock SDK",
     ["bench_pipeline.py", "--spans", "20000", "--rounds", "5"],
     ["bench_pipeline.py", "--spans", "3000"]),
    ("Rerun translation + sink vs naive per-entity rr.log",
     ["bench_rerun.py"], ["bench_rerun.py", "--layers", "32", "--repeats", "2"]),
    ("Trace view: serve CPU per foreign span vs per contract span",
     ["bench_trace.py"], ["bench_trace.py", "--spans", "2048", "--repeats", "2"]),
    ("Scale-out: 1 vs 2 serve processes fed by trace id",
     ["bench_serve_scale.py"], ["bench_serve_scale.py", "--spans", "1280", "--repeats", "1"]),
    ("GPU sampler and dispatch accounting",
     ["bench_gpu.py"], ["bench_gpu.py", "--seconds", "1"]),
    ("Demo overhead: telemetry off vs full",
     ["bench_demo.py"], ["bench_demo.py", "--repeat", "3", "--sizes", "8x32"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    args = parser.parse_args()
    failed = []
    for title, full, quick in SUITE:
        argv = quick if args.quick else full
        print(f"\n## {title}\n", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], timeout=1800)
        print(f"\n({argv[0]}: {time.perf_counter() - start:.0f} s, exit {proc.returncode})",
              flush=True)
        if proc.returncode != 0:
            failed.append(argv[0])
    if failed:
        print(f"\nbenchmarks that missed a target or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
