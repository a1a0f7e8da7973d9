"""Foreign spans through ``proofscope serve`` vs contract spans: CPU cost per span.

Run: python benchmarks/bench_trace.py [--spans N --rounds R --repeats K]

Two span sets of the same size, made once in this process and encoded with the
official OTLP encoder into requests of 512 spans:

* **foreign**: a Rust zkVM prover's trace (SP1's names: ``prove`` → ``prove_shards`` →
  ``prove_shard`` → ``generate_traces`` / ``commit_main`` / ``open``, …; attributes
  ``shard`` and ``cycles``, one event per shard), drawn by the trace view only;
* **contract**: ``ProofTracer`` proofs (``proof`` → ``proof.layer`` with R sumcheck
  round events each), drawn by the 3D walk *and* the trace view.

Each round starts ``proofscope serve --rerun file:…`` (gRPC, no HTTP), sends one set
over gRPC, waits until serve is idle (its CPU time stops moving), stops it with SIGTERM
and reads its CPU time (user + system, ``wait4``) and its summary line (every span must
be drawn). An idle round (nothing sent) is subtracted, so start-up and shutdown do not
count. Variants are interleaved; the table gives medians and ranges of the rounds.
CPU time rather than wall time because the machine is shared: other processes slow the
wall clock, not the CPU seconds serve spends.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import ProofTracer

ROOT = Path(__file__).resolve().parent.parent
REQUEST_SPANS = 512
TARGET_RATIO = 2.0


def foreign_spans(n: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "sp1-prover"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("sp1_prover")
    made = 0
    while made < n:
        with tracer.start_as_current_span("prove"):
            with tracer.start_as_current_span("execute", attributes={"cycles": 1_000_000}):
                pass
            with tracer.start_as_current_span("prove_shards"):
                for shard in range(16):
                    with tracer.start_as_current_span(
                            "prove_shard", attributes={"shard": shard, "cycles": 2**20}) as s:
                        for phase in ("generate_traces", "commit_main", "open"):
                            with tracer.start_as_current_span(phase):
                                pass
                        s.add_event("shard.checkpoint", {"rows": 4096})
            with tracer.start_as_current_span("compress"):
                pass
            with tracer.start_as_current_span("verify"):
                pass
        made += 1 + 2 + 16 * 4 + 2
    return list(memory.get_finished_spans())[:n]


def contract_spans(n: int, rounds: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "gkr-prover"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    pt = ProofTracer(tp)
    layers = 62  # with the proof root and verify: 64 spans per proof
    poly = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))
    made = 0
    while made < n:
        with pt.proof(system="gkr", backend="cpu", layers=layers):
            for i in reversed(range(layers)):
                with pt.layer(index=i, kind="MatMul", rounds=rounds, claim_initial=(i, 2, 3, 4)):
                    for r in range(rounds):
                        pt.sumcheck_round(r, poly, (r * 7919 + i, 1, 2, 3))
            with pt.verify() as v:
                v.set_verified(True)
        made += layers + 2
    return list(memory.get_finished_spans())[:n]


def requests(spans: list[ReadableSpan]) -> list[bytes]:
    return [encode_spans(spans[i:i + REQUEST_SPANS]).SerializeToString()
            for i in range(0, len(spans), REQUEST_SPANS)]


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_once(payloads: list[bytes], tmp: Path) -> tuple[float, float, str]:
    """(serve CPU seconds, seconds from first request to idle, summary line)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", f"file:{tmp / 'bench.rrd'}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    endpoint = ""
    for line in proc.stdout:
        if line.startswith("OTLP/gRPC listening on"):
            endpoint = line.split()[-1]
            break
    with grpc.insecure_channel(endpoint) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        start = time.perf_counter()
        for payload in payloads:
            export(payload, timeout=60)
    # idle: CPU time unchanged over 0.5 s (the Rerun thread has drawn everything)
    last = -1.0
    while True:
        time.sleep(0.5)
        now = _cpu(proc.pid)
        if now - last < 0.01:
            break
        last = now
    busy = time.perf_counter() - start
    proc.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read()
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = next((x for x in out.splitlines() if x.startswith("rerun: drawn")), "")
    return usage.ru_utime + usage.ru_stime, busy, line


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=10_240)
    parser.add_argument("--rounds", type=int, default=4,
                        help="sumcheck round events per contract layer span")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = args.spans
    sets = {"foreign (SP1-shaped, trace view only)": requests(foreign_spans(n)),
            f"contract (proof.layer, {args.rounds} rounds; walk + trace view)":
                requests(contract_spans(n, args.rounds)),
            "idle (nothing sent)": []}
    cpu: dict[str, list[float]] = {k: [] for k in sets}
    wall: dict[str, list[float]] = {k: [] for k in sets}
    for r in range(args.repeats):
        for label, payloads in sets.items():  # interleaved
            with tempfile.TemporaryDirectory() as d:
                c, w, line = serve_once(payloads, Path(d))
            if payloads:
                m = re.match(r"rerun: drawn (\d+) spans", line)
                if not m or int(m.group(1)) != n:
                    print(f"round {r} {label}: not every span was drawn: {line!r}")
                    return 1
            cpu[label].append(c)
            wall[label].append(w)
            print(f"round {r} {label}: serve CPU {c:.2f} s, first request → idle {w:.2f} s",
                  file=sys.stderr, flush=True)
    idle = cpu.pop("idle (nothing sent)")
    wall.pop("idle (nothing sent)")
    print(f"\n{n:,} spans per round, {args.repeats} interleaved rounds; serve CPU minus the "
          f"median idle round ({statistics.median(idle):.2f} s: start-up + shutdown)\n")
    print("| spans | serve CPU µs/span, median (range) | spans per CPU-second | "
          "first request → idle, s |")
    print("|---|---|---|---|")
    base = statistics.median(idle)
    rates = {}
    for label in cpu:
        per = [(c - base) / n * 1e6 for c in cpu[label]]
        rates[label] = 1e6 / statistics.median(per)
        print(f"| {label} | {statistics.median(per):.0f} ({min(per):.0f}–{max(per):.0f}) | "
              f"{rates[label]:,.0f} | {statistics.median(wall[label]):.2f} |")
    foreign, contract = rates.values()
    ratio = contract / foreign
    ok = ratio <= TARGET_RATIO
    print(f"\ncontract spans/s ÷ foreign spans/s = {ratio:.2f} "
          f"(target ≤ {TARGET_RATIO:.0f}: {'met' if ok else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
