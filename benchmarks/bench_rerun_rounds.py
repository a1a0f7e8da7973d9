"""The Rerun sink's cost per round-heavy span, two checkouts side by side (issue 29, decision 3).

Run: python benchmarks/bench_rerun_rounds.py --old /path/to/old-checkout [--new .]
                                             [--layers 3000] [--rounds 32] [--runs 5]

Each run is a fresh process with ``PYTHONPATH`` set to the checkout: ``--layers`` layer
spans made by ``ProofTracer``, one proof per 100 layers (``--rounds`` sumcheck rounds
each, distinct field elements; the round records unbuilt, as a prover's spans reach an
in-process Rerun exporter or the export process's backlog), drawn by one ``RerunSink``
into a ``.rrd`` file, garbage collection off (as in the export process while it works).
It times the submit and the flush: µs a span of wall time and of the process's CPU time
(every thread: ours and the Rerun SDK's). The checkouts alternate, the order flipped
every run; prints each run, then the median and range per checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import gc, random, sys, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DropLedger
from otel_proofscope.rerun.sink import CHILD_QUEUE_BYTES, RerunSink
from otel_proofscope.rerun.target import parse_target

layers, rounds, rrd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
tracer = ProofTracer(provider)
rng = random.Random(16)
field = 2**61 - 1
done = 0
while done < layers:  # one proof per 100 layers, as bench_pipeline's ProofTracer burst
    n = min(100, layers - done)
    with tracer.proof(system="bench", layers=n):
        for i in range(n):
            with tracer.layer(index=i, kind="MatMul", rounds=rounds, claim_initial=5,
                              trace_cost=4096):
                for r in range(rounds):
                    tracer.sumcheck_round(r, [rng.randrange(field) for _ in range(3)],
                                          rng.randrange(field),
                                          challenge=rng.randrange(field))
    done += n
spans = list(memory.get_finished_spans())
ledger = DropLedger()
sink = RerunSink(parse_target("file:" + rrd), queue_size=len(spans) + 1,
                 queue_bytes=CHILD_QUEUE_BYTES, ledger=ledger)
gc.disable()
start, cpu = time.perf_counter(), time.process_time()
for i in range(0, len(spans), 512):
    sink.submit_spans(spans[i:i + 512])
ok = sink.flush(600)
took, cpu = time.perf_counter() - start, time.process_time() - cpu
sink.close(10)
lost = ledger.total()
import otel_proofscope
print(f"{took / len(spans) * 1e6:.1f} {cpu / len(spans) * 1e6:.1f} {int(ok and not lost)} "
      f"{otel_proofscope.__file__}")
"""


def one(checkout: Path, layers: int, rounds: int) -> tuple[float, float, bool]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    with tempfile.TemporaryDirectory() as d:
        # cwd: ``-c`` puts the working directory ahead of PYTHONPATH, and a run from a
        # checkout would import that checkout's code, not ``checkout``'s.
        res = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(rounds),
                              str(Path(d) / "bench.rrd")], env=env, capture_output=True,
                             text=True, timeout=900, cwd=d)
    if res.returncode != 0:
        raise SystemExit(f"{checkout}: {res.stderr.strip()[-2000:]}")
    us, cpu, ok, code = res.stdout.split()
    if not Path(code).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"the run for {checkout} imported {code}")
    return float(us), float(cpu), ok == "1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--layers", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    times: dict[str, list[float]] = {name: [] for name in checkouts}
    cpus: dict[str, list[float]] = {name: [] for name in checkouts}
    for i in range(args.runs):
        for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
            us, cpu, ok = one(checkouts[name], args.layers, args.rounds)
            times[name].append(us)
            cpus[name].append(cpu)
            print(f"run {i + 1} {name}: {us:.1f} µs/span wall, {cpu:.1f} CPU"
                  f"{'' if ok else ' (LOST spans)'}", flush=True)
    for name, ts in times.items():
        cs = cpus[name]
        print(f"{name} ({checkouts[name]}): wall median {statistics.median(ts):.1f} µs/span "
              f"({min(ts):.1f}–{max(ts):.1f}), CPU (every thread) "
              f"{statistics.median(cs):.1f} ({min(cs):.1f}–{max(cs):.1f}), n={len(ts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
