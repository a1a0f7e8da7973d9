"""Pipeline cost on the prover thread and OTLP end-to-end delivery, vs the stock SDK.

Run: python benchmarks/bench_pipeline.py [--spans N] [--rounds R] [--round-heavy EVENTS]
Starts a real OTLP gRPC receiver on 127.0.0.1 in a separate process (the official proto
services, answering success), as a collector would be, and measures, side by side and
interleaved over several rounds:

* per-span cost on the prover thread: discarding exporter, stock SDK
  BatchSpanProcessor + OTLP, otel_proofscope's bounded pipeline + the official OTLP
  exporter, the bounded pipeline + FastOTLPSpanExporter (direct wire encoder), the
  OTLP/JSON-lines file with the upstream ``FileSpanExporter`` and with this project's
  ``JsonLinesSpanExporter`` (the same file: ``configure()``'s default without an
  endpoint; no receiver, so the delivery columns do not apply and losses are the
  ledger's), and the full pipeline (OTLP + Rerun) with the Rerun translation in a
  thread and in a child, and with both sinks in one export process (each span packed
  once in the prover's process; OTLP encoding and sending and the Rerun translation in
  the child);
* the same per round event, on a round-heavy burst (N/4 layers of 32 rounds), once with
  the SDK's own ``add_event`` and once made by ``ProofTracer`` (compact round records,
  built into events by whichever exporter reads them: what a prover pays);
* a burst of N spans: how many the receiver got, and how many were lost (and, for
  otel_proofscope, whether the loss was counted exactly);
* the encoders alone: µs per prover span, official ``encode_spans`` +
  ``SerializeToString`` vs ``encode_export_request``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter, encode_export_request
from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter
from otel_proofscope.pipeline.multi_sink import MultiSinkBatchSpanProcessor
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.rerun.export_process import ExportConfig, ExportProcessSpanExporter
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.process import RerunProcessSpanExporter


def _serve(port_out: Any, count: Any, stop: Any) -> None:
    """The receiver process: a real OTLP gRPC TraceService that counts spans."""

    class Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request, context):  # type: ignore[no-untyped-def]
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with count.get_lock():
                count.value += n
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    port_out.value = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop.wait(3600)
    server.stop(0)


class Receiver:
    """A collector stand-in in its own process, as a real collector would be: its
    decoding must not compete for this process's GIL and skew the prover's figures."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._count = ctx.Value("q", 0)
        port = ctx.Value("i", 0)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_serve, args=(port, self._count, self._stop),
                                 daemon=True)
        self._proc.start()
        deadline = time.monotonic() + 30
        while port.value == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if port.value == 0:
            raise RuntimeError("receiver process did not start")
        self.port = int(port.value)

    @property
    def spans(self) -> int:
        return int(self._count.value)

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.spans < n and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._proc.join(10)


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def workload(provider: TracerProvider, n: int, rounds: int = 4) -> float:
    """A prover-like span: a layer with 8 attributes and ``rounds`` round events."""
    tracer = provider.get_tracer("bench")
    root: Any = None
    attrs: dict[str, Any] = {"proof.layer.index": 1, "proof.layer.kind": "MatMul",
             "proof.layer.proof_kind": "Sumcheck", "proof.sumcheck.rounds": 4,
             "proof.layer.trace_cost": 4096, "proof.claim.initial": "(1,2,3,4)",
             "proof.layer.input.shape": [1, 64], "proof.layer.output.shape": [1, 64]}
    ev: dict[str, Any] = {"proof.sumcheck.round": 0, "proof.sumcheck.degree": 2,
          "proof.sumcheck.poly": ["(1,2,3,4)", "(5,6,7,8)", "(9,10,11,12)"],
          "proof.claim": "(1,2,3,4)"}
    start = time.perf_counter()
    for i in range(n):
        # one proof root per 100 layers, as a prover would produce them
        root = tracer.start_span("proof", attributes={"proof.system": "bench"}) \
            if i % 100 == 0 else root
        ctx = trace.set_span_in_context(root)
        attrs["proof.layer.index"] = i % 100
        with tracer.start_as_current_span("proof.layer", context=ctx, attributes=attrs) as span:
            for _r in range(rounds):
                span.add_event("proof.sumcheck.round", ev)
        if i % 100 == 99 or i == n - 1:
            root.end()
    return time.perf_counter() - start


def workload_tracer(provider: TracerProvider, n: int, rounds: int = 32) -> float:
    """The same layers made by ``ProofTracer``, as a prover makes them: ``rounds``
    ``sumcheck_round`` calls per layer (compact records, built into events by whichever
    exporter reads them), one ``proof`` root per 100 layers."""
    from otel_proofscope.instrumentation import ProofTracer

    tracer = ProofTracer(provider)
    # Distinct field elements, as a real proof's rounds have: repeated values would let
    # the encoders' caches answer for them. Drawn before the clock starts, more than the
    # caches hold.
    rng = random.Random(16)
    pool = [([rng.randrange(_FIELD) for _ in range(3)], rng.randrange(_FIELD),
             rng.randrange(_FIELD)) for _ in range(_POOL)]
    start = time.perf_counter()
    done = 0
    k = 0
    while done < n:
        with tracer.proof(system="bench", backend="cpu", layers=100):
            for i in range(min(100, n - done)):
                with tracer.layer(index=i, kind="MatMul", rounds=rounds, trace_cost=4096,
                                  claim_initial=5):
                    for r in range(rounds):
                        poly, claim, challenge = pool[k % _POOL]
                        k += 1
                        tracer.sumcheck_round(r, poly, claim, challenge=challenge)
            done += min(100, n - done)
    return time.perf_counter() - start


_FIELD = 2**61 - 1  # a Mersenne prime field, as many provers use
_POOL = 1 << 15


def encoder_costs(n: int = 512, reps: int = 7) -> list[tuple[str, list[float], list[float]]]:
    """Median (and range) of reps µs/span of both encoders on a batch of n workload spans,
    for identical spans (the benchmark's) and for spans whose round values all differ."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def batch(varied: bool) -> Sequence[ReadableSpan]:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        if not varied:
            workload(provider, n)
            return memory.get_finished_spans()
        tracer = provider.get_tracer("bench")
        for i in range(n):
            with tracer.start_as_current_span("proof.layer", attributes={
                    "proof.layer.index": i, "proof.layer.kind": "MatMul",
                    "proof.layer.proof_kind": "Sumcheck", "proof.sumcheck.rounds": 4,
                    "proof.layer.trace_cost": 4096 + i, "proof.claim.initial": f"({i},2,3,4)",
                    "proof.layer.input.shape": [1, 64], "proof.layer.output.shape": [1, 64]},
                    ) as span:
                for r in range(4):
                    span.add_event("proof.sumcheck.round", {
                        "proof.sumcheck.round": r, "proof.sumcheck.degree": 2,
                        "proof.sumcheck.poly": [f"({i},{r},1)", f"({i},{r},2)", f"({i},{r},3)"],
                        "proof.claim": f"({i},{r},3,4)"})
        return memory.get_finished_spans()

    def runs(fn, spans: Sequence[ReadableSpan]) -> list[float]:  # type: ignore[no-untyped-def]
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(spans)
            times.append(time.perf_counter() - start)
        return [t / len(spans) * 1e6 for t in times]

    rows = []
    for label, varied in (("identical spans", False), ("every value distinct", True)):
        spans = batch(varied)
        assert encode_export_request(spans) == encode_spans(spans).SerializeToString()
        official = runs(lambda s: encode_spans(s).SerializeToString(), spans)
        ours = runs(encode_export_request, spans)
        rows.append((label, official, ours))
    return rows


def run(label: str, processor_factory, n: int, receiver: Receiver | None,  # type: ignore[no-untyped-def]
        ledger: DropLedger | None = None, rounds: int = 4,
        tracer: bool = False) -> dict[str, object]:
    provider = TracerProvider()
    made = processor_factory()
    for processor in made if isinstance(made, list) else [made]:
        provider.add_span_processor(processor)
    before = receiver.spans if receiver else 0
    # The Rerun sink and its worker count their own losses in the process-wide ledger.
    rerun_before = DROPS.total(signal="spans", sink="rerun")
    # The export process reports its OTLP losses to the process-wide ledger too.
    otlp_before = DROPS.total(signal="spans", sink="otlp")
    elapsed = (workload_tracer if tracer else workload)(provider, n, rounds)
    total = n + (n + 99) // 100  # the layers and their proof roots
    flush_start = time.perf_counter()
    provider.shutdown()
    flush = time.perf_counter() - flush_start
    if receiver:  # let the receiver process count what was already sent
        receiver.wait_for(before + total, timeout=2.0)
    delivered = (receiver.spans - before) if receiver else total
    counted = (ledger.total(signal="spans", sink="otlp")
               + DROPS.total(signal="spans", sink="otlp") - otlp_before) if ledger else None
    rerun_lost = (DROPS.total(signal="spans", sink="rerun") - rerun_before
                  + (ledger.total(signal="spans", sink="rerun") if ledger else 0))
    return {"label": label, "per_span_us": elapsed / n * 1e6,
            "per_round_us": elapsed / (n * rounds) * 1e6, "delivered": delivered,
            "lost": total - delivered, "counted": counted, "shutdown_s": flush,
            "rerun_lost": rerun_lost}


def _metric(unit: str) -> str:
    """The row field a burst's cost is read from: per span, or per round event."""
    return "per_span_us" if unit == "span" else "per_round_us"


def _mr(xs: list[float]) -> str:
    """Median (min–max): every figure shows its spread, never the best run alone."""
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of all pipelines (medians reported)")
    parser.add_argument("--round-heavy", type=int, default=32, metavar="EVENTS",
                        help="also run a round-heavy burst: spans/4 layers with this many "
                             "round events each (0: skip)")
    parser.add_argument("--tracer-rounds", type=int, default=32, metavar="ROUNDS",
                        help="also run the round-heavy burst made by ProofTracer "
                             "(sumcheck_round records, as a prover records them; 0: skip)")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="run only the pipelines whose label contains TEXT (and the "
                             "discarding baseline)")
    args = parser.parse_args()
    n = args.spans
    receiver = Receiver()
    endpoint = f"127.0.0.1:{receiver.port}"
    # The export process's OTLP exporter reads the standard variables it inherits.
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://{endpoint}"
    pipelines = [
        ("discarding exporter (baseline)", lambda led: BoundedBatchSpanProcessor(
            Discard(), sink="discard", ledger=led), False),
        ("stock SDK BatchSpanProcessor + OTLP gRPC", lambda led: BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True)), True),
        ("otel_proofscope bounded processor + official OTLP gRPC encoder",
         lambda led: BoundedBatchSpanProcessor(
             OTLPSpanExporter(endpoint=endpoint, insecure=True), sink="otlp", ledger=led),
         True),
        ("otel_proofscope bounded processor + fast OTLP gRPC (the default)",
         lambda led: BoundedBatchSpanProcessor(
             FastOTLPSpanExporter(endpoint, protocol="grpc", insecure=True), sink="otlp",
             ledger=led), True),
        ("upstream OTLP JSON-lines file (FileSpanExporter), bounded processor",
         lambda led: BoundedBatchSpanProcessor(
             FileSpanExporter(f"{tempfile.mkdtemp()}/traces.jsonl"), sink="file",
             ledger=led), False),
        ("otel_proofscope OTLP JSON-lines file (configure()'s default without an OTLP "
         "endpoint), bounded processor",
         lambda led: BoundedBatchSpanProcessor(
             JsonLinesSpanExporter(f"{tempfile.mkdtemp()}/traces.jsonl"), sink="file",
             ledger=led), False),
        ("full pipeline: fast OTLP gRPC + Rerun .rrd file, each behind its own bounded queue",
         lambda led: [BoundedBatchSpanProcessor(
             FastOTLPSpanExporter(endpoint, protocol="grpc", insecure=True), sink="otlp",
             ledger=led), BoundedBatchSpanProcessor(
             RerunSpanExporter(f"file:{tempfile.mkdtemp()}/bench.rrd"), sink="rerun",
             ledger=led)], True),
        ("full pipeline, Rerun out of process: fast OTLP gRPC + Rerun .rrd file translated "
         "in a child process, each behind its own bounded queue",
         lambda led: [BoundedBatchSpanProcessor(
             FastOTLPSpanExporter(endpoint, protocol="grpc", insecure=True), sink="otlp",
             ledger=led), BoundedBatchSpanProcessor(
             RerunProcessSpanExporter(f"file:{tempfile.mkdtemp()}/bench.rrd"), sink="rerun",
             ledger=led)], True),
        ("full pipeline, one export process: OTLP + Rerun .rrd in a child (each span "
         "packed once here, one bounded queue)",
         lambda led: MultiSinkBatchSpanProcessor(ExportProcessSpanExporter(ExportConfig(
             rerun_target=f"file:{tempfile.mkdtemp()}/bench.rrd", otlp_protocol="grpc",
             otlp_timeout_s=10.0)), sinks=("otlp", "rerun"), ledger=led), True),
    ]
    pipelines = [p for i, p in enumerate(pipelines) if i == 0 or args.only in p[0]]
    # The encoders alone first, in a fresh process: the bursts below leave the fast
    # encoder's caches as a prover would (a key whose values never repeated is not
    # cached for a while), which these synthetic batches, encoded 7 times over, are not.
    encoder_rows = encoder_costs()
    bursts = [("span", n, 4)]
    if args.round_heavy > 0:
        bursts.append(("round", max(n // 4, 1), args.round_heavy))
    if args.tracer_rounds > 0:  # "per round", made by ProofTracer
        bursts.append(("tracer round", max(n // 4, 1), args.tracer_rounds))
    results: dict[tuple[str, str], list[dict[str, object]]] = {
        (unit, label): [] for unit, _, _ in bursts for label, _, _ in pipelines}
    for _ in range(args.rounds):
        for unit, spans, rounds in bursts:
            base = None
            for label, factory, remote in pipelines:
                ledger = DropLedger(log_interval_s=3600)
                row = run(label, lambda f=factory, led=ledger: f(led), spans,
                          receiver if remote else None,
                          ledger if not label.startswith(("discard", "stock")) else None,
                          rounds=rounds, tracer=unit.startswith("tracer"))
                cost = float(row[_metric(unit)])  # type: ignore[arg-type]
                base = base or cost
                row["ratio"] = cost / base
                results[(unit, label)].append(row)
    receiver.close()
    for unit, spans, rounds in bursts:
        made = " made by ProofTracer (sumcheck_round records)" if unit.startswith("tracer") \
            else ""
        print(f"\nburst of {spans} layer spans{made} ({rounds} round events each) against a real "
              f"OTLP gRPC receiver in another process on loopback; medians of {args.rounds} "
              f"interleaved rounds\n")
        print(f"| pipeline | prover-thread µs/{unit} (range) | vs discard (median of per-round "
              "ratios, range) | OTLP: delivered spans | lost | lost & counted | "
              "Rerun: spans lost (all counted) | shutdown s |")
        print("|---|---|---|---|---|---|---|---|")
        for (u, label), rows in results.items():
            if u != unit:
                continue

            def med(key: str, rows: list[dict[str, object]] = rows) -> float:
                return statistics.median(float(r[key]) for r in rows)  # type: ignore[arg-type]
            ratios = [float(r["ratio"]) for r in rows]  # type: ignore[arg-type]
            counted: object = "—" if label.startswith("discard") else (
                "n/a (uncounted)" if rows[0]["counted"] is None
                else int(med("counted")))
            rerun = (f"{int(med('rerun_lost'))} of {rows[0]['delivered'] + rows[0]['lost']} "
                     f"(range {min(int(r['rerun_lost']) for r in rows)}–"  # type: ignore[call-overload]
                     f"{max(int(r['rerun_lost']) for r in rows)})"  # type: ignore[call-overload]
                     if "Rerun" in label else "—")
            print(f"| {label} | {_mr([float(r[_metric(unit)]) for r in rows])} | "  # type: ignore[arg-type]
                  f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f}) | "
                  f"{int(med('delivered'))} | {int(med('lost'))} | {counted} | {rerun} | "
                  f"{med('shutdown_s'):.2f} |")
    print("\nOTLP encoding alone, prover span (8 attributes incl. 2 int arrays, 4 events of "
          "4 attributes incl. a 3-string array), batch of 512; median (range) of 7 runs\n")
    print("| spans | official encode_spans + SerializeToString µs/span | "
          "encode_export_request µs/span | speed-up |")
    print("|---|---|---|---|")
    for label, official, ours in encoder_rows:
        ups = [a / b for a, b in zip(official, ours, strict=True)]
        print(f"| {label} | {_mr(official)} | {_mr(ours)} | "
              f"{statistics.median(ups):.1f}x ({min(ups):.1f}–{max(ups):.1f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
