"""CPU the export process spends per sumcheck round, stage by stage (issue 29 decision 3).

Run: python benchmarks/bench_child_rounds.py [--layers 1000] [--runs 5]
       [--old CHECKOUT]

A ``ProofTracer`` burst (``--layers`` layers of 32 rounds, as ``bench_pipeline.py``'s
makes them, one ``proof`` per 100 layers) is packed once into the frames the prover's
process writes (``span_wire.pack_spans_full``, 512 spans a frame). Each run is a fresh
process that reads those frames as the export process does, timing each stage's CPU:

* ``unpack``: ``span_wire.unpack_spans`` of every frame;
* ``otlp``: ``encode_export_request`` of the unpacked spans (the OTLP stage's encoder);
* ``rerun``: a ``RerunSink`` writing a ``.rrd``, fed the spans 512 at a time and
  flushed: the whole process's CPU (the Rerun SDK encodes on threads of its own).

CPU per round = the stage's CPU ÷ the burst's rounds (per-span work included). With
``--old``, each run is made once with this tree and once with CHECKOUT's code
(``PYTHONPATH``), interleaved; the table gives median (range) of the runs.

Why: within the 3 s exit bound the export process must unpack, encode and draw a
160,000-round burst; this splits where its CPU goes, without the start-up, the prover
and the sockets that ``bench_pipeline.py`` measures together.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import gc, json, marshal, sys, tempfile, time
    from otel_proofscope.rerun.span_wire import unpack_spans
    from otel_proofscope.otlp.encode import encode_export_request
    from otel_proofscope.rerun.sink import RerunSink
    from otel_proofscope.rerun.target import parse_target

    frames, rounds = marshal.load(open(sys.argv[1], "rb"))
    gc.disable()  # as the export process runs (pipeline/gc_policy.py)
    cpu = time.process_time
    t = cpu()
    batches = [unpack_spans(f).spans for f in frames]
    unpack = cpu() - t
    t = cpu()
    for spans in batches:
        encode_export_request(spans)
    otlp = cpu() - t
    sink = RerunSink(parse_target("file:" + tempfile.mkdtemp() + "/bench.rrd"))
    t = cpu()
    for spans in batches:  # as the export process's backlog feeds it: nothing dropped
        while spans:
            n = sink.fits(spans)
            if n:
                sink.submit_spans(spans[:n])
                spans = spans[n:]
            else:
                time.sleep(0.001)
    sink.flush(600)
    rerun = cpu() - t
    sink.close(60)
    lost = sum(n for k, n in __import__("otel_proofscope.ledger").ledger.DROPS
               .snapshot().items() if k.signal == "spans")
    import otel_proofscope
    print(json.dumps({"unpack": unpack, "otlp": otlp, "rerun": rerun, "rounds": rounds,
                      "lost": lost, "code": otel_proofscope.__file__}))
""")


def make_frames(layers: int, path: Path) -> int:
    """Pack the burst into frames at ``path``; returns its rounds."""
    import marshal

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_pipeline
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_proofscope.rerun.span_wire import pack_spans_full

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    bench_pipeline.workload_tracer(provider, layers)
    spans = memory.get_finished_spans()
    frames = [pack_spans_full(spans[i:i + 512])[0] for i in range(0, len(spans), 512)]
    rounds = layers * 32
    with path.open("wb") as f:
        marshal.dump((frames, rounds), f)
    return rounds


def run_once(tree: Path, frames: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # Run from the frames' folder: ``-c`` puts the working directory first on the path,
    # and this checkout's package would shadow ``tree``'s.
    out = subprocess.run([sys.executable, "-c", CHILD, str(frames)], env=env, check=True,
                         capture_output=True, text=True, timeout=900, cwd=frames.parent)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    code = Path(str(result.pop("code"))).resolve()
    if not code.is_relative_to(tree):
        raise SystemExit(f"the run for {tree} imported {code}")
    return result


def _mr(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--old", type=Path, default=None, metavar="CHECKOUT",
                        help="another tree to run interleaved with this one")
    args = parser.parse_args()
    trees = [("this tree", ROOT)] + ([("old", args.old.resolve())] if args.old else [])
    with tempfile.TemporaryDirectory() as work:
        frames = Path(work) / "frames.marshal"
        rounds = make_frames(args.layers, frames)
        results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
        for i in range(args.runs):
            for label, tree in (trees if i % 2 == 0 else trees[::-1]):
                results[label].append(run_once(tree, frames))
    print(f"{args.layers} layers × 32 rounds = {rounds} rounds; CPU µs per round, "
          f"median (range) of {args.runs} runs, interleaved")
    print("| tree | unpack | OTLP encode | Rerun sink (process CPU) | total | spans lost |")
    print("|---|---|---|---|---|---|")
    for label, runs in results.items():
        per = {k: [r[k] * 1e6 / r["rounds"] for r in runs] for k in ("unpack", "otlp", "rerun")}
        total = [sum(v) for v in zip(*per.values(), strict=True)]
        lost = sorted(int(r["lost"]) for r in runs)
        print(f"| {label} | {_mr(per['unpack'])} | {_mr(per['otlp'])} | "
              f"{_mr(per['rerun'])} | {_mr(total)} | {lost[len(lost) // 2]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
