"""Foreign spans through ``proofscope serve`` vs contract spans: CPU cost per span.

Run: python benchmarks/bench_trace.py [--spans N --rounds R [R ...] --repeats K]

Two span sets of the same size, made once in this process and encoded with the
official OTLP encoder into requests of 512 spans:

* **foreign**: a Rust zkVM prover's trace (SP1's names: ``prove`` → ``prove_shards`` →
  ``prove_shard`` → ``generate_traces`` / ``commit_main`` / ``open``, …; attributes
  ``shard`` and ``cycles``, one event per shard), drawn by the trace view only;
* **contract**: ``ProofTracer`` proofs (``proof`` → ``proof.layer`` with R sumcheck
  round events each; one set per R, by default 4 and 16), drawn by the 3D walk *and*
  the trace view.

Each round starts ``proofscope serve --rerun file:…`` (gRPC, no HTTP), sends one set
over gRPC, waits until serve is idle (its CPU time stops moving), stops it with SIGTERM
and reads its CPU time (user + system, ``wait4``) and its summary line (every span must
be drawn). An idle round (nothing sent) is subtracted, so start-up and shutdown do not
count. Variants are interleaved; the table gives medians and ranges of the rounds.
Requests serve refuses (its byte budget) are sent again, as an OTLP exporter would, and
counted; every span serve did not draw is counted from its summary line (a round that
lost any fails the run). Spans/s is the wall-clock rate: spans ÷ (first request → the
moment serve's CPU time last moved), so it includes the gRPC transport and waits.
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
from dataclasses import dataclass
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
#: Issue 16: contract spans (16 round events each) per second per serve process.
SERVE_TARGET = 10_000


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


#: Serve is idle once its CPU time has not moved for this long (the last change is the
#: end of its work; sampled every POLL_S).
IDLE_S = 0.5
POLL_S = 0.02
#: gRPC codes an OTLP exporter retries (serve's byte budget answers RESOURCE_EXHAUSTED).
RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


@dataclass
class Round:
    cpu_s: float  # serve's CPU time (user + system), start-up and shutdown included
    busy_s: float  # first request → serve's CPU time last moved (wall clock)
    drawn: int  # "rerun: drawn N spans"
    lost: str  # what serve says it did not draw, "" when nothing
    retries: int  # requests refused by serve and sent again


def serve_once(payloads: list[bytes], tmp: Path, root: Path = ROOT) -> Round:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp), "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", f"file:{tmp / 'bench.rrd'}"],
        # cwd: ``python -m`` puts the working directory ahead of PYTHONPATH.
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=root)
    assert proc.stdout is not None
    endpoint = ""
    for line in proc.stdout:
        if line.startswith("OTLP/gRPC listening on"):
            endpoint = line.split()[-1]
            break
    retries = 0
    with grpc.insecure_channel(endpoint) as channel:
        # The official exporter's call: ExportTraceServiceRequest bytes made by the
        # official encoder (encode_spans), one request at a time, retried when refused.
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        start = time.perf_counter()
        for payload in payloads:
            while True:
                try:
                    export(payload, timeout=60)
                    break
                except grpc.RpcError as exc:
                    if exc.code() not in RETRYABLE:
                        raise
                    retries += 1
                    time.sleep(0.05)
    last_cpu, last_change = _cpu(proc.pid), time.perf_counter()
    while time.perf_counter() - last_change < IDLE_S:
        time.sleep(POLL_S)
        now = _cpu(proc.pid)
        if now != last_cpu:
            last_cpu, last_change = now, time.perf_counter()
    busy = last_change - start
    proc.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read()
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = next((x for x in out.splitlines() if x.startswith("rerun: drawn")), "")
    m = re.match(r"rerun: drawn (\d+) spans?(?: \([^)]*\))?; not drawn (\d+)(.*)", line)
    drawn = int(m.group(1)) if m else -1
    lost = "" if m and m.group(2) == "0" else (line or "no summary line")
    return Round(usage.ru_utime + usage.ru_stime, busy, drawn, lost, retries)


def _range(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=10_240)
    parser.add_argument("--rounds", type=int, nargs="+", default=[4, 16],
                        help="sumcheck round events per contract layer span, one contract "
                             "set per value (default: 4 and 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-foreign", action="store_true",
                        help="contract sets only (the 2x target is then not checked)")
    parser.add_argument("--root", type=Path, nargs="+", default=[ROOT],
                        help="checkouts whose serve to run, interleaved (A/B: an older "
                             "checkout, then this one); default: this checkout")
    args = parser.parse_args()
    n = args.spans
    sets: dict[str, list[bytes]] = {}
    if not args.no_foreign:
        sets["foreign (SP1-shaped, trace view only)"] = requests(foreign_spans(n))
    for r in args.rounds:
        sets[f"contract (proof.layer, {r} rounds; walk + trace view)"] = \
            requests(contract_spans(n, r))
    sets["idle (nothing sent)"] = []
    roots: list[Path] = [r.resolve() for r in args.root]
    all_rounds = {root: {k: list[Round]() for k in sets} for root in roots}
    for rep in range(args.repeats):
        for label, payloads in sets.items():  # interleaved
            for root in roots:
                with tempfile.TemporaryDirectory() as d:
                    r = serve_once(payloads, Path(d), root)
                all_rounds[root][label].append(r)
                print(f"round {rep} {label} [{root}]: serve CPU {r.cpu_s:.2f} s, first "
                      f"request → idle {r.busy_s:.2f} s, drawn {r.drawn}, refused+retried "
                      f"{r.retries}" + (f", LOST: {r.lost}" if r.lost else ""),
                      file=sys.stderr, flush=True)
    ok = True
    for root in roots:
        if len(roots) > 1:
            print(f"\n### serve from {root}")
        ok = report(all_rounds[root], n, args) and ok
    return 0 if ok else 1


def report(rounds: dict[str, list[Round]], n: int, args: argparse.Namespace) -> bool:
    idle = [r.cpu_s for r in rounds.pop("idle (nothing sent)")]
    base = statistics.median(idle)
    print(f"\n{n:,} spans per set, {args.repeats} interleaved rounds; serve CPU minus the "
          f"median idle round ({base:.2f} s: start-up + shutdown); spans/s = spans ÷ (first "
          f"request → serve's CPU time last moved), wall clock\n")
    print("| spans | serve CPU µs/span, median (range) | spans per CPU-second | "
          "spans/s, wall, median (range) | not drawn (all rounds) | refused + retried |")
    print("|---|---|---|---|---|---|")
    rates: dict[str, float] = {}
    walls: dict[str, list[float]] = {}
    lost_any = False
    for label, rs in rounds.items():
        per = [(r.cpu_s - base) / n * 1e6 for r in rs]
        rates[label] = 1e6 / statistics.median(per)
        walls[label] = [n / r.busy_s for r in rs]
        not_drawn = sum(n - r.drawn for r in rs)
        lost_any = lost_any or any(r.lost or r.drawn != n for r in rs)
        print(f"| {label} | {_range(per, '.0f')} | {rates[label]:,.0f} | "
              f"{_range(walls[label], ',.0f')} | {not_drawn} | "
              f"{sum(r.retries for r in rs)} |")
    for label, rs in rounds.items():
        for r in rs:
            if r.lost:
                print(f"{label}: {r.lost}")
    ok = not lost_any
    labels = list(rounds)
    if not args.no_foreign and len(labels) > 1:
        ratio = rates[labels[1]] / rates[labels[0]]
        met = ratio <= TARGET_RATIO
        ok = ok and met
        print(f"\ncontract spans/s ÷ foreign spans/s = {ratio:.2f} (target ≤ "
              f"{TARGET_RATIO:.0f}: {'met' if met else 'MISSED'})")
    for label in labels:
        if "16 rounds" in label:
            cpu_met = rates[label] >= SERVE_TARGET
            wall_met = statistics.median(walls[label]) >= SERVE_TARGET
            print(f"{label}: {rates[label]:,.0f} spans per CPU-second, "
                  f"{statistics.median(walls[label]):,.0f} spans/s wall (issue 16: ≥ "
                  f"{SERVE_TARGET:,} per serve process, nothing lost: CPU "
                  f"{'met' if cpu_met else 'NOT met'}, wall {'met' if wall_met else 'NOT met'}"
                  f"{'' if not lost_any else ', spans were LOST'})")
    return ok


if __name__ == "__main__":
    sys.exit(main())
