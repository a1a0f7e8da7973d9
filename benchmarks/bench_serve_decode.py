"""Serve's CPU per received span, in process: the decode alone and the whole path to the
``.rrd`` (issue 29, decision 5: serve without a compiled decoder).

Run: python benchmarks/bench_serve_decode.py [--root BEFORE AFTER] [--spans N --repeats K]

``bench_trace.py`` measures a real ``proofscope serve`` behind gRPC; on a shared 2-CPU
machine its figures swing with the other jobs (gRPC's threads, the sender and serve
compete for the cores). This one takes the transport out: for each checkout (``--root``,
interleaved, each in a fresh child process with that checkout on ``PYTHONPATH``) and each
span set of ``bench_trace.py`` (foreign SP1-shaped spans; contract ``proof.layer`` spans
with 16 sumcheck round events), the child builds serve's own sinks (``serve_cmd``'s Rerun
exporter to a ``.rrd``, its trace-view bound, serve's collector policy) and its
``Ingest``, then measures:

* **decode**: the thread's CPU time to parse every request and convert its spans
  (``codec.decode`` + ``feed.chunks``, what ``Ingest.handle_traces`` runs before the
  sinks), nothing exported;
* **serve path**: the process's CPU time (every thread: the Rerun sink's, the Rerun SDK's
  native ones) from the first ``Ingest.handle`` of the requests, as the gRPC front end
  calls it, until the exporter has flushed everything to the file (the first request,
  which opens the recording, is handled before and not counted). The next request is
  handed once the sink's queue is empty, as a patient sender would, so that
  the figure is what drawing costs and not what refusals cost (a refused request is
  parsed, and its first chunk decoded, for nothing: ``bench_trace.py`` counts those);
  one refused anyway is handed again after 20 ms. Waiting costs no CPU.

Each figure is µs of CPU per span, median (range) of the rounds; spans per CPU-second is
1e6 ÷ the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = r"""
import json, pickle, resource, sys, tempfile, time
from pathlib import Path
from otel_proofscope.cli import serve_cmd
from otel_proofscope.integrations.otlp_receiver import codec, feed
from otel_proofscope.integrations.otlp_receiver.core import Ingest, Outcome
from otel_proofscope.pipeline.gc_policy import CollectWhenIdle

payloads = pickle.loads(Path(sys.argv[1]).read_bytes())
spans = sum(feed.span_count(codec.decode(codec.Signal.TRACES, p, codec.Encoding.PROTOBUF))
            for p in payloads)

def decode_only():
    t0 = time.thread_time()
    n = 0
    for p in payloads:
        request = codec.decode(codec.Signal.TRACES, p, codec.Encoding.PROTOBUF)
        for chunk, _ in feed.chunks(request, feed.CHUNK_SPANS, feed.Rejections()):
            n += len(chunk)
    assert n == spans, (n, spans)
    return time.thread_time() - t0

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

decode_s = min(decode_only() for _ in range(2))  # the first warms the caches
with tempfile.TemporaryDirectory() as d:
    span_exps, metric_exps = serve_cmd._exporters(f"file:{d}/b.rrd")
    ingest = Ingest(span_exps, metric_exps)
    collector = CollectWhenIdle(lambda: sorted(ingest.stats().items())).start()
    # The first request opens the recording and warms the translation: not counted.
    warm = feed.span_count(codec.decode(codec.Signal.TRACES, payloads[0],
                                        codec.Encoding.PROTOBUF))
    ingest.handle(codec.Signal.TRACES, payloads[0], codec.Encoding.PROTOBUF)
    for e in span_exps:
        e.force_flush(600_000)
    retries = 0
    t0 = cpu()
    for p in payloads[1:]:
        # A patient sender: the next request once the queue is empty (the byte bound
        # admits fewer than two 512-span requests of 16-round spans), so that the figure
        # is the cost of drawing, not of refusals (bench_trace.py has those).
        while any((b := e.backlog()) is not None and b[0] > 0 for e in span_exps):
            time.sleep(0.002)
        while True:
            result = ingest.handle(codec.Signal.TRACES, p, codec.Encoding.PROTOBUF)
            if result.outcome is Outcome.OK:
                break
            retries += 1
            time.sleep(0.02)
    for e in span_exps:
        e.force_flush(600_000)
    path_s = cpu() - t0
    collector.pause()
    stats = ingest.stats()
    ingest.shutdown()
print(json.dumps({"spans": spans, "decode_s": decode_s, "path_spans": spans - warm,
                  "path_s": path_s, "retries": retries,
                  "accepted": stats.get("spans_accepted", 0)}))
"""


def run_child(root: Path, payload_file: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as d:
        env["XDG_RUNTIME_DIR"] = d
        out = subprocess.run([sys.executable, "-c", CHILD, str(payload_file)], env=env,
                             cwd=root, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _mr(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"


def main() -> int:
    import pickle

    import bench_trace as bt

    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=5_120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", type=Path, nargs="+", default=[ROOT])
    args = parser.parse_args()
    sets = {"foreign (SP1-shaped)": bt.requests(bt.foreign_spans(args.spans)),
            "contract (proof.layer, 16 rounds)": bt.requests(bt.contract_spans(args.spans, 16))}
    roots = [r.resolve() for r in args.root]
    got: dict[tuple[str, Path], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for label, payloads in sets.items():
            files[label] = Path(d) / f"{len(files)}.pickle"
            files[label].write_bytes(pickle.dumps(payloads))
        for rep in range(args.repeats):
            for label in sets:
                for root in roots:  # interleaved
                    r = run_child(root, files[label])
                    got.setdefault((label, root), []).append(r)
                    print(f"round {rep} {label} [{root}]: decode "
                          f"{r['decode_s'] / r['spans'] * 1e6:.1f} µs/span, serve path "
                          f"{r['path_s'] / r['path_spans'] * 1e6:.1f} µs/span, accepted "
                          f"{r['accepted']}, refused+retried {r['retries']}",
                          file=sys.stderr, flush=True)
    print(f"\n{args.spans:,} spans per set, {args.repeats} interleaved rounds; µs of CPU per "
          "span, median (range); spans per CPU-second = 1e6 ÷ median\n")
    print("| spans | checkout | decode µs/span | serve path µs/span | spans per CPU-second "
          "(serve path) | refused + retried |")
    print("|---|---|---|---|---|---|")
    ok = True
    for label in sets:
        for root in roots:
            rs = got[(label, root)]
            dec = [r["decode_s"] / r["spans"] * 1e6 for r in rs]
            path = [r["path_s"] / r["path_spans"] * 1e6 for r in rs]
            ok = ok and all(r["accepted"] == r["spans"] for r in rs)
            print(f"| {label} | {root} | {_mr(dec)} | {_mr(path)} | "
                  f"{1e6 / statistics.median(path):,.0f} | {sum(r['retries'] for r in rs)} |")
    if not ok:
        print("\nsome spans were not accepted")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
