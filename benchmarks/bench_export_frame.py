"""The export process's own CPU per span, part by part (issue 29, decisions 3 and 6).

Run: python benchmarks/bench_export_frame.py [--root BEFORE AFTER] [--repeats K]

Against a dead collector, decision 6's 200,000-span burst was drawn slower than the
prover made it, and the exit bound cut its tail (root included). This measures, in
process, the parts of the export process that changed, for each checkout (``--root``,
interleaved, each in a fresh child with that checkout on ``PYTHONPATH``):

* **OTLP stage, queue full**: ``OtlpStage.submit`` of 343-span frames (the frame loop's
  hand-over) to an OTLP queue a dead collector has filled, so every span is lost and
  counted: ns of CPU per span;
* **event count + size**: ``event_count`` and ``estimate_bytes`` of layer spans unpacked
  from a frame without events (what the queues and the backlog ask several times a
  span): ns per span;
* **trace view, one large trace**: ``TraceTranslator.translate`` of a 100,000-span proof
  (its root first, then its layers in time order, 512 a batch, as a prover's batches
  come): µs of CPU per span, and how many boxes it drew per span (redraws included).

Each figure is the median (range) of the rounds.
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

CHILD = r"""
import json, sys, threading, time
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanContext, TraceFlags
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.processor import estimate_bytes
from otel_proofscope.rerun import span_wire
from otel_proofscope.rerun.columns import Frame
from otel_proofscope.rerun.export_worker import OtlpStage, ProgressLedger
from otel_proofscope.rerun.translate_trace import TraceTranslator

def cpu():
    return time.thread_time()

memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
tracer = ProofTracer(provider)
with tracer.proof(system="gkr"):
    for i in range(342):
        with tracer.layer(index=i, kind="MatMul", rounds=1):
            pass
frame = span_wire.unpack_spans(span_wire.pack_spans_full(
    list(memory.get_finished_spans()))[0]).spans

class Dead(SpanExporter):
    def export(self, spans):
        time.sleep(60)
        return SpanExportResult.FAILURE

stage = OtlpStage(Dead(), DropLedger(), export_witness=False, queue=512,
                  ledger=ProgressLedger())
for _ in range(3):
    stage.submit(frame)  # fills the queue (the worker holds one batch in export)
t0 = cpu()
for _ in range(40):
    stage.submit(frame)
otlp_ns = (cpu() - t0) / (40 * len(frame)) * 1e9

t0 = cpu()
for _ in range(40):
    for span in frame:
        event_count(span)
        estimate_bytes(span)
count_ns = (cpu() - t0) / (40 * len(frame)) * 1e9

n, t_start = 100_000, 1_800_000_000_000_000_000
trace = 0xABCDEF
res = Resource({"service.name": "prover"})
def span(name, span_id, parent, start, end):
    ctx = SpanContext(trace, span_id, False, TraceFlags(1))
    par = SpanContext(trace, parent, False, TraceFlags(1)) if parent else None
    return ReadableSpan(name=name, context=ctx, parent=par, start_time=start,
                        end_time=end, resource=res)
spans = [span("prove", 1, None, t_start, t_start + 10)]
spans += [span("proof.layer", 10 + i, 1, t_start + 10 * i, t_start + 10 * i + 9)
          for i in range(1, n)]
view = TraceTranslator(wait_s=600.0)
drawn = 0
t0 = cpu()
for i in range(0, n, 512):
    issues = view.translate(spans[i:i + 512], Frame(), now=1.0)
    drawn += issues.drawn + issues.redrawn
last = view.drain(Frame())
drawn += last.drawn + last.redrawn
view_us = (cpu() - t0) / n * 1e6
print(json.dumps({"otlp_ns": otlp_ns, "count_ns": count_ns, "view_us": view_us,
                  "boxes": drawn / n}))
"""


def run_child(root: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as d:
        # cwd: ``-c`` puts the working directory ahead of PYTHONPATH.
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=d,
                             capture_output=True, text=True, check=True, timeout=900).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _mr(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", type=Path, nargs="+", default=[ROOT])
    args = parser.parse_args()
    roots = [r.resolve() for r in args.root]
    got: dict[Path, list[dict[str, float]]] = {r: [] for r in roots}
    for rep in range(args.repeats):
        for root in roots if rep % 2 == 0 else roots[::-1]:  # interleaved
            r = run_child(root)
            got[root].append(r)
            print(f"round {rep} [{root}]: {r}", file=sys.stderr, flush=True)
    print(f"\nmedian (range) of {args.repeats} interleaved rounds, CPU time of the "
          "measuring thread\n")
    print("| checkout | OTLP stage, queue full: ns a lost span | event count + size: ns a "
          "span | trace view, 100,000-span proof: µs a span | boxes drawn a span |")
    print("|---|---|---|---|---|")
    for root in roots:
        rs = got[root]
        print(f"| {root} | {_mr([r['otlp_ns'] for r in rs], ',.0f')} | "
              f"{_mr([r['count_ns'] for r in rs], ',.0f')} | "
              f"{_mr([r['view_us'] for r in rs], '.1f')} | "
              f"{_mr([r['boxes'] for r in rs], '.1f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
