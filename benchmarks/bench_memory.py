"""Prover RSS growth against a dead collector, per Rerun route (issue 16: <= +64 MB).

Run: python benchmarks/bench_memory.py [--spans 200000] [--events 0] [--repeat 5]
       [--routes otlp,export,split] [--old CHECKOUT]

Each run is a fresh process: ``configure()`` with an OTLP endpoint on a closed port
(every export fails), then N ``proof.layer`` spans (each with ``--events`` round
events) inside one proof. It reports the RSS growth from just before the burst to
just after it (psutil), of the prover's process and of the prover's process and its
export process together (issue 29, decision 6), and what the ledger counted as lost. The
base is taken once a first span is flushed and the export process's RSS has held still
for a second: it starts while configure() returns, and its imports (~100 MiB) and its
recording's start are its footprint, not the burst's growth. Routes:

* ``otlp``   — OTLP alone (``rerun="off"``);
* ``export`` — OTLP + Rerun ``.rrd`` file, both from the export process (configure()'s
  default with Rerun on; the growth of the prover's process only, as the test in
  tests/test_reliability.py measures);
* ``split``  — the same with ``PROOFSCOPE_EXPORT_PROCESS=0``: OTLP from the prover's
  process, Rerun still drawn by the export process.

(Issue 29 retired the Rerun-only child and the thread as configure() routes.)

With ``--old CHECKOUT`` every route also runs with ``PYTHONPATH=CHECKOUT`` (another tree
of this package, e.g. main; its rows are named ``old:ROUTE``), interleaved.

Every route must count every span that was not delivered (OTLP: all of them).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import os, sys, time, psutil
    import otel_proofscope as ps
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sys.argv[1]
    t = ps.configure(rerun=sys.argv[3], shutdown_timeout_s=1.0, set_global=False)
    tracer = t.tracer
    proc = psutil.Process()
    n, events = int(sys.argv[2]), int(sys.argv[4])
    poly = [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)]
    with tracer.proof(system="gkr"):
        with tracer.layer(index=0, kind="MatMul"):
            pass
        def children():  # the export process (and its own children), if any
            total = 0
            for c in proc.children(recursive=True):
                try:
                    total += c.memory_info().rss
                except psutil.Error:
                    pass
            return total

        # The export process imports Rerun, pyarrow and the OTLP exporters (~100 MiB)
        # while configure() returns, and opens its recording on the first span drawn:
        # flush that span, then settle before the base, or those are counted too.
        t.force_flush()
        last, steady, deadline = -1, 0, time.monotonic() + 60
        while steady < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
            now = children()
            steady = steady + 1 if now and abs(now - last) < 2**20 else 0
            last = now
        base, child_base = proc.memory_info().rss, children()
        for i in range(n):
            with tracer.layer(index=i % 100, kind="MatMul", rounds=max(1, events)):
                for r in range(events):
                    tracer.sumcheck_round(r, poly, (1, 2, 3, 4), 2)
        peak, child_peak = proc.memory_info().rss, children()
    report = t.shutdown(log_drops=False)
    print(report.trace_line, file=sys.stderr, flush=True)  # where the view drew them
    from otel_proofscope.ledger import DROPS
    print(peak - base, DROPS.total(signal="spans", sink="otlp"),
          DROPS.total(signal="spans", sink="rerun"), child_peak - child_base, flush=True)
""")


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HERE = str(Path(__file__).resolve().parent.parent)


def one(route: str, spans: int, events: int, tmp: Path,
        root: str = HERE) -> tuple[float, int, int, float, str]:
    target = "off" if route == "otlp" else f"file:{tmp / f'{route}.rrd'}"
    env = dict(os.environ, PROOFSCOPE_EXPORT_PROCESS="0" if route == "split" else "",
               PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", CHILD, f"http://127.0.0.1:{dead_port()}",
                          str(spans), target, str(events)], capture_output=True, text=True,
                         timeout=1200, check=True, env=env, cwd=tmp)
    growth, otlp_lost, rerun_lost, child = (int(x) for x in out.stdout.split())
    assert otlp_lost == spans + 2, out.stdout  # nothing delivered, nothing unaccounted
    drawn = next((line for line in out.stderr.splitlines() if line.startswith("rerun: ")), "")
    return growth / 2**20, otlp_lost, rerun_lost, child / 2**20, drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--events", type=int, default=0, help="round events per span")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--routes", default="otlp,export,split")
    parser.add_argument("--old", help="another checkout, run interleaved ('old:' rows)")
    args = parser.parse_args(argv)
    roots = {"": HERE} | ({"old:": args.old} if args.old else {})
    routes = [f"{tag}{r}" for r in args.routes.split(",") for tag in roots]
    growth: dict[str, list[float]] = {r: [] for r in routes}
    rerun_lost: dict[str, list[int]] = {r: [] for r in routes}
    both: dict[str, list[float]] = {r: [] for r in routes}  # prover + export process
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as d:
        for i in range(args.repeat):
            for route in routes if i % 2 == 0 else routes[::-1]:  # interleaved
                tag = "old:" if route.startswith("old:") else ""
                mib, _, lost, child, drawn = one(route.removeprefix(tag), args.spans,
                                                 args.events, Path(d), roots[tag])
                growth[route].append(mib)
                both[route].append(mib + child)
                rerun_lost[route].append(lost)
                print(f"run {i + 1} {route}: +{mib:.1f} MiB, with the export process "
                      f"+{mib + child:.1f} MiB, Rerun lost {lost}; {drawn}", file=sys.stderr,
                      flush=True)
    print(f"{args.spans:,} spans of {args.events} round events against a dead collector; "
          f"median (range) of {args.repeat} runs\n")
    print("| route | prover RSS growth, MiB | prover + export process, MiB | target (both) "
          "| Rerun spans lost (counted) |")
    print("|---|---|---|---|---|")
    for route in routes:
        g, b = growth[route], both[route]
        ok = "✔" if max(b) <= 64 else "**not met**"
        print(f"| {route} | {statistics.median(g):.1f} ({min(g):.1f}–{max(g):.1f}) | "
              f"{statistics.median(b):.1f} ({min(b):.1f}–{max(b):.1f}) | ≤ 64 {ok} | "
              f"{statistics.median(rerun_lost[route]):,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
